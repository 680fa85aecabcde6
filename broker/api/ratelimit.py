"""Per-API-key and per-tenant rate limiting: a token bucket per presented key, and one per tenant over all its keys,
429 with `Retry-After` when one is empty.

Role: pure ASGI middleware in front of the app (cheaper than Starlette's BaseHTTPMiddleware). Contract:
- Each key gets `burst` requests at once and `rate` more per second after that. The bucket is found by a SHA-256
  of the presented credential (`Authorization: Bearer` or `X-API-Key`), never the key itself, and before the key
  is verified, so a flood is refused without paying the slow hash. A wrong key guessed with another key's id gets
  its own bucket: it cannot drain the real key's.
- A request whose key this process has verified (so its tenant is known without a database read) also takes a token
  from its tenant's bucket (`tenant_rate`, `tenant_burst`), shared by all the tenant's keys: minting more keys does
  not multiply a tenant's share. (A key not verified yet is held by the unverified-key limit instead.)
- A request with no key also takes a token from its client address's bucket (`rate`, `burst`). A request with a
  key this process has not verified yet (which costs a slow scrypt hash) takes one from its client address's
  unverified-key bucket instead, at its own, lower rate (`unverified_rate`, `unverified_burst`): guessing keys
  from one address is held to a few hashes per second. The address is charged first, so a refused guess leaves
  no bucket behind for its key. (`broker.api.deps.HashGate` caps the hashes running at once in the process.)
- The key is read by `broker.api.auth.presented_key`, as authentication reads it; a request whose credentials are
  ambiguous (a header twice, two different keys) is answered 400 naming the header here.
- Health checks (`/healthz`, `/readyz`) without credentials are never limited; with credentials (`/readyz` shows
  its detail to the metrics token or an admin key) they are limited like any request.
- 429 answers say which limit was hit and when to retry: `Retry-After` in whole seconds (rounded up).

Where buckets live (`RateLimit(shared=...)`):
- `SharedBuckets`: in the database (table `rate_limit_bucket`), so every API process and replica on one database
  draws on the same bucket: the limit is per key, whatever the number of processes. One statement per take
  (INSERT ... ON CONFLICT DO UPDATE ... RETURNING), atomic under the row lock on PostgreSQL and the write lock on
  SQLite, timed by the database's clock (replicas with skewed clocks agree); a refused bucket is not asked again
  by the same process before its token is due, so a flood is refused without a round trip per request. A bucket
  is stored as its theoretical arrival time (GCRA, the same decisions as a token bucket): a row whose time has
  passed is a full bucket, so idle rows are deleted by a periodic sweep without changing any decision, and at
  most `max_buckets` rows are kept (the fullest dropped first).
- `TokenBuckets`: in this process's memory (at most `max_buckets`, least recently used dropped). N processes then
  admit up to N x `rate` per key. Used alone in `local` mode, and as the fallback of the shared store.
- Failure mode: when the shared store fails (database down, statement timeout, missing table), the request is
  judged by this process's buckets instead, never answered 5xx; one warning is logged per outage, the database
  is tried again after `retry_seconds`, and its return is logged. During an outage the cap is per process.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.to_thread
import psycopg
from sqlalchemy import create_engine, event
from starlette.types import ASGIApp, Receive, Scope, Send

from broker.api.auth import AmbiguousCredentials, presented_key
from broker.api.problems import PROBLEM_MEDIA_TYPE, problem_bytes

log = logging.getLogger(__name__)

EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})
TABLE = "rate_limit_bucket"


class TokenBuckets:
    """Token buckets by key: `take(key)` returns 0 when a token was taken, else the seconds until one is there."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_buckets: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.max_buckets = max_buckets
        self.clock = clock
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: bytes) -> float:
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[key] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        return wait


# A bucket is one row: `tat`, its theoretical arrival time (epoch seconds on the database's clock), is when the
# bucket will be full again. A take at `now` is allowed when tat - now <= (burst - 1) / rate and moves tat to
# max(tat, now) + 1 / rate; a refused take leaves tat alone and stores its wait, tat - now - (burst - 1) / rate,
# which is exactly the token bucket's (1 - tokens) / rate. `wait` is 0 after an allowed take, so RETURNING it
# says both whether a token was taken and how long to wait. SET expressions see the row's old values.
# The instant of a take is its statement's start (stable within the statement). A take that waited for another
# one's row lock is timed a little early: it can only see less refill than it might, never more.
_PG_NOW = "date_part('epoch', statement_timestamp())"
_PG_TAKE = f"""
INSERT INTO {TABLE} AS b (key, tat, wait) VALUES (%(key)s, {_PG_NOW} + %(interval)s, 0)
ON CONFLICT (key) DO UPDATE SET
    tat = CASE WHEN b.tat - {_PG_NOW} <= %(slack)s THEN greatest(b.tat, {_PG_NOW}) + %(interval)s ELSE b.tat END,
    wait = greatest(0, b.tat - {_PG_NOW} - %(slack)s)
RETURNING wait
"""
_PG_EXPIRE = f"DELETE FROM {TABLE} WHERE tat < {_PG_NOW}"
_PG_CAP = f"DELETE FROM {TABLE} WHERE key IN (SELECT key FROM {TABLE} ORDER BY tat DESC OFFSET %(keep)s)"

# epoch seconds to the millisecond ('now' is fixed for the whole statement; julianday() would lose ~40 us)
_SQLITE_NOW = "(strftime('%s', 'now') + strftime('%f', 'now') - strftime('%S', 'now'))"
_SQLITE_TAKE = f"""
INSERT INTO {TABLE} (key, tat, wait) VALUES (:key, {_SQLITE_NOW} + :interval, 0)
ON CONFLICT (key) DO UPDATE SET
    tat = CASE WHEN tat - {_SQLITE_NOW} <= :slack THEN max(tat, {_SQLITE_NOW}) + :interval ELSE tat END,
    wait = max(0, tat - {_SQLITE_NOW} - :slack)
RETURNING wait
"""
_SQLITE_EXPIRE = f"DELETE FROM {TABLE} WHERE tat < {_SQLITE_NOW}"
_SQLITE_CAP = f"DELETE FROM {TABLE} WHERE key IN (SELECT key FROM {TABLE} ORDER BY tat DESC LIMIT -1 OFFSET :keep)"


class SharedBuckets(ABC):
    """Token buckets in the database, shared by every process on it: `await take(key)` as `TokenBuckets.take`.

    Build with `SharedBuckets.open(database_url, rate, burst)`: `PostgresBuckets` (asynchronous psycopg
    connections, no thread hop) or `SqliteBuckets` (its own small pool in worker threads); the table comes from the
    migrations. Both use their own autocommit connections (at most `pool_size`) with `timeout` seconds as the
    statement timeout and connection deadline (PostgreSQL) or the busy and pool timeout (SQLite), and raise on any
    database failure (the caller falls back, see `RateLimit`). A refusal is remembered in this process until its
    wait has passed (the bucket cannot have a token before then: other processes only take tokens, time alone
    gives them back), so a flood on one key or address costs one round trip per process per token interval, not
    one per request. `sweep()` deletes full buckets and keeps at most `max_buckets` rows; `sweep_if_due()` runs it
    every `sweep_seconds` (the first one at a random point of that period, so processes do not sweep together).
    `aclose()` closes the connections.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        timeout: float = 1.0,
        pool_size: int = 8,
        sweep_seconds: float = 60.0,
        max_buckets: int = 100_000,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.timeout = timeout
        self.pool_size = pool_size
        self.sweep_seconds = sweep_seconds
        self.max_buckets = max_buckets
        self._params = {"interval": 1.0 / rate, "slack": (burst - 1) / rate}
        self._next_sweep = time.monotonic() + random.uniform(0, sweep_seconds)
        self._sweeping = False
        self._refused: OrderedDict[bytes, float] = OrderedDict()  # bucket -> when its next token is due

    @staticmethod
    def open(database_url: str, rate: float, burst: int, **options: Any) -> SharedBuckets:
        """The shared store for this database URL (nothing is connected until the first take)."""
        if database_url.startswith("sqlite"):
            return SqliteBuckets(database_url, rate, burst, **options)
        return PostgresBuckets(database_url, rate, burst, **options)

    async def take(self, key: bytes, limit: tuple[float, int] | None = None) -> float:
        """Take a token from `key`'s bucket; `limit` (rate, burst) overrides the store's for this bucket."""
        now = time.monotonic()
        due = self._refused.get(key)
        if due is not None:
            if due > now:  # refused before, and no token can have come back since: no round trip
                return due - now
            del self._refused[key]
        params = self._params if limit is None else {"interval": 1.0 / limit[0], "slack": (limit[1] - 1) / limit[0]}
        row = await self._execute("take", {"key": key, **params})
        wait = float(row[0]) if row else 0.0
        if wait <= 0:
            return 0.0
        # the clocks tick in microseconds (PostgreSQL) or milliseconds (SQLite): drop float noise below that, so
        # a wait of exactly 2 s is not 2.0000001 (Retry-After 3); a refusal stays a refusal
        wait = max(round(wait, 6), 1e-6)
        self._refused[key] = time.monotonic() + wait
        while len(self._refused) > self.max_buckets:  # forgetting a refusal only costs a round trip
            self._refused.popitem(last=False)
        return wait

    async def sweep(self) -> int:
        """Delete full (idle) buckets, then the fullest beyond `max_buckets`. Returns how many rows went."""
        expired = await self._execute("expire", {})
        return int(expired) + int(await self._execute("cap", {"keep": self.max_buckets}))

    async def sweep_if_due(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep or self._sweeping:
            return
        self._sweeping, self._next_sweep = True, now + self.sweep_seconds
        try:
            await self.sweep()
        finally:
            self._sweeping = False

    @abstractmethod
    async def aclose(self) -> None: ...

    @abstractmethod
    async def _execute(self, statement: str, params: dict[str, Any]) -> Any:
        """Run one of the store's statements: the first row for "take", the row count for the others."""


class PostgresBuckets(SharedBuckets):
    """The shared store on PostgreSQL: one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING` round trip per take on
    an asynchronous psycopg connection (auto-prepared after a few uses), awaited on the event loop. An idle
    connection the server has dropped is replaced by a fresh one within the same take (no pre-ping round trip)."""

    _SQL = {"take": _PG_TAKE, "expire": _PG_EXPIRE, "cap": _PG_CAP}

    def __init__(self, database_url: str, rate: float, burst: int, **options: Any) -> None:
        super().__init__(rate, burst, **options)
        self.conninfo = "postgresql://" + database_url.split("://", 1)[1]  # drop SQLAlchemy's +driver
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _execute(self, statement: str, params: dict[str, Any]) -> Any:
        self._bind_to_running_loop()
        assert self._slots is not None
        async with self._slots, asyncio.timeout(self.timeout + 1.0):  # even a silent network cannot hang a take
            for attempt in range(2):
                reused = bool(self._idle)
                conn = self._idle.pop() if reused else await self._connect()
                try:
                    cur = await conn.execute(self._SQL[statement], params)
                    result = await cur.fetchone() if statement == "take" else cur.rowcount
                except BaseException as exc:
                    stale = reused and isinstance(exc, psycopg.OperationalError) and conn.broken
                    conn.pgconn.finish()  # failed or cancelled mid-statement: never handed out again
                    if stale and attempt == 0:
                        continue  # the server dropped an idle connection (restart, idle timeout): once more, fresh
                    raise
                self._idle.append(conn)
                return result
        raise AssertionError("unreachable")

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=max(2, math.ceil(self.timeout))
        )
        try:
            await conn.execute(f"SET statement_timeout = {int(self.timeout * 1000)}")  # a stuck take falls back
            await conn.execute("SET synchronous_commit = off")  # a bucket is not worth waiting for the disk
        except BaseException:
            conn.pgconn.finish()
            raise
        return conn

    def _bind_to_running_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the event loop that made them (a new test client)
            self._drop_idle()
            self._loop, self._slots = loop, asyncio.Semaphore(self.pool_size)

    def _drop_idle(self) -> None:
        while self._idle:
            self._idle.pop().pgconn.finish()

    async def aclose(self) -> None:
        while self._idle:
            await self._idle.pop().close()


class SqliteBuckets(SharedBuckets):
    """The shared store on SQLite (several uvicorn workers on one file): the same statement under SQLite's write
    lock, on its own small pool of autocommit connections, in worker threads (sqlite3 blocks)."""

    _SQL = {"take": _SQLITE_TAKE, "expire": _SQLITE_EXPIRE, "cap": _SQLITE_CAP}

    def __init__(self, database_url: str, rate: float, burst: int, **options: Any) -> None:
        super().__init__(rate, burst, **options)
        self.engine = create_engine(
            database_url,
            connect_args={"check_same_thread": False, "timeout": self.timeout},
            pool_size=self.pool_size,
            max_overflow=0,
            pool_timeout=self.timeout,
            pool_reset_on_return=None,
        )
        event.listen(self.engine, "connect", _sqlite_autocommit)
        self._threads: anyio.CapacityLimiter | None = None

    async def _execute(self, statement: str, params: dict[str, Any]) -> Any:
        if self._threads is None:
            self._threads = anyio.CapacityLimiter(self.pool_size)  # never queued behind slow endpoints
        # bounded by the busy timeout and the pool timeout (a thread cannot be cancelled)
        return await anyio.to_thread.run_sync(self._execute_sync, statement, params, limiter=self._threads)

    def _execute_sync(self, statement: str, params: dict[str, Any]) -> Any:
        conn = self.engine.raw_connection()
        try:
            cur = conn.cursor()
            try:
                cur.execute(self._SQL[statement], params)
                return cur.fetchone() if statement == "take" else cur.rowcount
            finally:
                cur.close()
        except BaseException:
            conn.invalidate()
            raise
        finally:
            conn.close()

    async def aclose(self) -> None:
        self.engine.dispose()


def _sqlite_autocommit(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # autocommit: each take is its own write transaction
    dbapi_conn.execute("PRAGMA synchronous=NORMAL")  # as broker.store.db: no fsync per commit in WAL mode


class RateLimit:
    """ASGI middleware applying token buckets per key (and per client address for unverified keys).

    With `shared`, buckets live in the database and this process's `TokenBuckets` are the fallback for
    `retry_seconds` after each failure; without, they are the store.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        rate: float,
        burst: int,
        unverified_rate: float | None = None,
        unverified_burst: int | None = None,
        is_verified: Callable[[Scope, str], bool] | None = None,
        tenant_of: Callable[[Scope, str], str | None] | None = None,
        tenant_rate: float = 0.0,
        tenant_burst: int = 1,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedBuckets | None = None,
        retry_seconds: float = 5.0,
    ) -> None:
        self.app = app
        self.keys = TokenBuckets(rate, burst, clock=clock)
        self.addresses = TokenBuckets(rate, burst, clock=clock)
        self.unverified_limit = (unverified_rate or rate, unverified_burst or burst)
        self.unverified = TokenBuckets(*self.unverified_limit, clock=clock)
        self.is_verified = is_verified or (lambda scope, key: False)
        self.tenant_of = tenant_of if tenant_of is not None and tenant_rate > 0 else None
        self.tenant_limit = (tenant_rate or rate, tenant_burst)
        self.tenants = TokenBuckets(*self.tenant_limit, clock=clock)
        self.shared = shared
        self.retry_seconds = retry_seconds
        self.clock = clock
        self._shared_down_until: float | None = None  # set while falling back to local buckets
        self._state_lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            key = presented_key(scope.get("headers", ()))
        except AmbiguousCredentials as exc:
            await _answer(send, 400, str(exc))
            return
        if key is None and scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        wanted: list[tuple[bytes, str]] = []
        client = scope.get("client")
        address = client[0] if client else "unknown"
        if key is None:
            wanted.append((b"a" + address.encode(), f"client address {address}"))
        elif not self.is_verified(scope, key):
            wanted.append((b"u" + address.encode(), f"unverified API keys from client address {address}"))
        if key is not None:
            wanted.append((b"k" + hashlib.sha256(key.encode()).digest(), "this API key"))
            tenant = self.tenant_of(scope, key) if self.tenant_of is not None else None
            if tenant is not None:
                wanted.append((b"t" + tenant.encode(), f"tenant {tenant} (all its API keys together)"))
        wait, refused = await self.take(wanted) if self.shared is not None else self.take_local(wanted)
        if wait:
            if refused.startswith("unverified"):
                rate, burst = self.unverified_limit
            elif refused.startswith("tenant "):
                rate, burst = self.tenant_limit
            else:
                rate, burst = self.keys.rate, self.keys.burst
            await _reject(send, wait, refused, rate, int(burst))
            return
        await self.app(scope, receive, send)

    async def take(self, wanted: Sequence[tuple[bytes, str]]) -> tuple[float, str]:
        """Take a token from each bucket in order, stopping at the first empty one: (its wait, its name) or
        (0, "") when every bucket gave a token. From the shared store while it works, else `take_local`."""
        if self.shared is not None and self._shared_usable():
            try:
                result = (0.0, "")
                for bucket, which in wanted:
                    limit = {b"u": self.unverified_limit, b"t": self.tenant_limit}.get(bucket[:1])
                    wait = await self.shared.take(bucket, limit)
                    if wait:
                        result = (wait, which)
                        break
            except Exception as exc:  # any failure of the shared store: judge this request locally
                self._shared_failed(exc)
            else:
                self._shared_ok()
                try:
                    await self.shared.sweep_if_due()
                except Exception:
                    log.warning("rate limiter: sweeping idle buckets failed", exc_info=True)
                return result
        return self.take_local(wanted)

    def take_local(self, wanted: Sequence[tuple[bytes, str]]) -> tuple[float, str]:
        """As `take`, from this process's buckets."""
        stores = {b"a": self.addresses, b"u": self.unverified, b"t": self.tenants}
        for bucket, which in wanted:
            wait = stores.get(bucket[:1], self.keys).take(bucket)
            if wait:
                return wait, which
        return 0.0, ""

    @property
    def falling_back(self) -> bool:
        """The shared store failed and has not answered since: requests are judged by this process's buckets."""
        return self._shared_down_until is not None

    def _shared_usable(self) -> bool:
        down = self._shared_down_until
        return down is None or self.clock() >= down

    def _shared_failed(self, exc: Exception) -> None:
        with self._state_lock:
            first = self._shared_down_until is None
            self._shared_down_until = self.clock() + self.retry_seconds
        if first:
            log.warning(
                "rate limiter: the shared buckets in the database failed (%s: %s); this process limits on its own "
                "buckets meanwhile (up to one limit per process) and retries the database every %g s",
                type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                self.retry_seconds,
            )

    def _shared_ok(self) -> None:
        if self._shared_down_until is None:
            return
        with self._state_lock:
            back, self._shared_down_until = self._shared_down_until is not None, None
        if back:
            log.info("rate limiter: the shared buckets in the database are back")


async def _reject(send: Send, wait: float, which: str, rate: float, burst: int) -> None:
    retry_after = max(1, math.ceil(wait))
    message = (
        f"rate limit: too many requests for {which} (at most {burst} at once, then {rate:g} per second); "
        f"retry after {retry_after} s"
    )
    await _answer(send, 429, message, [(b"retry-after", str(retry_after).encode())])


async def _answer(send: Send, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = problem_bytes(status, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
