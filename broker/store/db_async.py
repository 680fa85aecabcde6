"""Asynchronous PostgreSQL connections for the API's hottest writes, awaited on the event loop (no thread hop).

Role: `AsyncPgPool` keeps up to `size` autocommit psycopg `AsyncConnection`s to one PostgreSQL database and runs one
statement per call on one of them (`fetch`: one network round trip; psycopg prepares a statement on a connection
after its first few uses, so the server does not parse and plan it again). It is what `POST /v1/jobs` writes through
on PostgreSQL (broker/services/jobs_pg.py); everything else uses the SQLAlchemy engine (broker/store/db.py).

Contract:
- `for_engine(engine)` gives a pool on the engine's database, or None when the engine is not PostgreSQL.
- Each statement runs in its own implicit transaction (autocommit): a statement is atomic, so the callers write
  everything that must commit together as one statement.
- Connections belong to the event loop that opened them: on another loop (a new test client) the idle ones are
  dropped and new ones opened. At most `size` statements run at once per pool; others wait their turn.
- An idle connection the server dropped (restart, idle timeout) fails the statement with `psycopg.OperationalError`
  and is discarded; the caller decides whether a retry is safe (`fetch(..., retry_stale=...)`). Connections older
  than `max_age` seconds are closed instead of reused (as the engine's `pool_recycle`).
- `aclose()` closes the idle connections; a pool is not used after it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from sqlalchemy.engine import Engine


class AsyncPgPool:
    """A small pool of autocommit asyncio psycopg connections (see the module docstring)."""

    def __init__(self, conninfo: str, *, size: int = 8, connect_timeout: int = 10, max_age: float = 1800.0) -> None:
        self.conninfo = conninfo
        self.size = size
        self.connect_timeout = connect_timeout
        self.max_age = max_age
        self._idle: list[tuple[psycopg.AsyncConnection[Any], float]] = []  # (connection, opened at)
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.opened = 0  # connections opened so far (for tests and benchmarks)

    @staticmethod
    def for_engine(engine: Engine, **options: Any) -> AsyncPgPool | None:
        """A pool on the engine's PostgreSQL database; None for any other database."""
        if engine.dialect.name != "postgresql":
            return None
        url = engine.url.set(drivername="postgresql")
        return AsyncPgPool(url.render_as_string(hide_password=False), **options)

    async def fetch(self, sql: str, params: dict[str, Any], *, retry_stale: bool = False) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows. With `retry_stale`, a statement that failed on a reused
        connection the server had dropped runs once more on a fresh one (only safe when running it twice cannot
        do anything twice)."""
        self._bind_to_running_loop()
        assert self._slots is not None
        async with self._slots:
            for attempt in range(2):
                conn, opened_at = self._take()
                reused = conn is not None
                if conn is None:
                    conn, opened_at = await self._connect(), time.monotonic()
                try:
                    cur = await conn.execute(sql, params)
                    rows = await cur.fetchall() if cur.description is not None else []
                except BaseException as exc:
                    stale = reused and isinstance(exc, psycopg.OperationalError) and conn.broken
                    if conn.broken or not isinstance(exc, psycopg.Error):
                        conn.pgconn.finish()  # broken, or cancelled mid-statement: never handed out again
                    else:
                        self._idle.append((conn, opened_at))  # a statement error (e.g. a unique key): reusable
                    if stale and retry_stale and attempt == 0:
                        continue
                    raise
                self._idle.append((conn, opened_at))
                return rows
        raise AssertionError("unreachable")

    def _take(self) -> tuple[psycopg.AsyncConnection[Any] | None, float]:
        now = time.monotonic()
        while self._idle:
            conn, opened_at = self._idle.pop()
            if now - opened_at < self.max_age and not conn.closed:
                return conn, opened_at
            conn.pgconn.finish()
        return None, 0.0

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=self.connect_timeout
        )
        self.opened += 1
        return conn

    def _bind_to_running_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the event loop that made them
            self._drop_idle()
            self._loop, self._slots = loop, asyncio.Semaphore(self.size)

    def _drop_idle(self) -> None:
        while self._idle:
            self._idle.pop()[0].pgconn.finish()

    async def aclose(self) -> None:
        while self._idle:
            conn, _ = self._idle.pop()
            if asyncio.get_running_loop() is self._loop:
                await conn.close()
            else:
                conn.pgconn.finish()
