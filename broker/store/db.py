"""Database engine, sessions and the column types the broker's tables share.

`make_engine(settings)` builds the engine (SQLite with WAL and a busy timeout, or PostgreSQL); nothing is built
at import time. Money is stored exactly: NUMERIC on PostgreSQL, text on SQLite (whose NUMERIC is a float).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Dialect, Numeric, String, TypeDecorator, event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

from broker.config.settings import Settings


class Money(TypeDecorator[Decimal]):
    """Exact Decimal storage on every backend."""

    impl = String(40)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(Numeric(24, 10))
        return dialect.type_descriptor(String(40))

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        value = Decimal(value)
        return value if dialect.name == "postgresql" else str(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        if value is None:
            return None
        return plain(value if isinstance(value, Decimal) else Decimal(str(value)))


def plain(value: Decimal) -> Decimal:
    """Drop trailing zeros without switching to exponent notation (320.00 -> 320, 1.50 -> 1.5)."""
    if value == value.to_integral_value():
        return value.quantize(Decimal(1))
    return value.normalize()


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps that go in and come out tz-aware UTC (SQLite keeps no zone)."""

    from sqlalchemy import DateTime as _DateTime

    impl = _DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime stored; the broker only handles tz-aware UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def make_engine(settings: Settings) -> Engine:
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        if not settings.database_url:  # the default file lives in data_dir: make sure it exists
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    # Sized to FastAPI's worker thread pool (40 threads): connections are reused, never opened per request
    # (a PostgreSQL connection costs a backend process start).
    return create_engine(url, pool_size=40, max_overflow=10, pool_pre_ping=True, pool_recycle=1800)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def utcnow() -> datetime:
    return datetime.now(UTC)
