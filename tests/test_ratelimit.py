"""Per-key rate limiting: a token bucket per presented key, 429 with Retry-After, health checks exempt, a guessed
key cannot drain a real one's bucket, and unverified keys are also limited per client address; with the shared
store, one bucket per key across every process on the database, atomic takes, idle buckets swept, and a
failing database judged by each process's own buckets instead of answered 5xx.

The multi-process proof (two uvicorn processes on one PostgreSQL) is tests/test_ratelimit_processes.py."""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from broker.api.auth import Role, create_key
from broker.api.ratelimit import RateLimit, SharedBuckets, TokenBuckets
from broker.app import create_app, rate_limit_store
from broker.config.settings import Settings
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store import migrate
from broker.store.db import make_engine
from tests.conftest import MovableClock
from tests.moto_server import free_port

T = TypeVar("T")


def test_token_bucket_refills_at_its_rate() -> None:
    now = [100.0]
    buckets = TokenBuckets(rate=2.0, burst=3, clock=lambda: now[0])
    assert [buckets.take(b"k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take(b"k") == pytest.approx(0.5)  # one token comes back every 0.5 s
    assert buckets.take(b"other") == 0.0, "buckets are per key"
    now[0] += 0.5
    assert buckets.take(b"k") == 0.0
    now[0] += 60
    assert [buckets.take(b"k") for _ in range(4)][-1] > 0, "refill stops at the burst size"


def test_bucket_memory_is_bounded() -> None:
    buckets = TokenBuckets(rate=1.0, burst=1, max_buckets=3, clock=lambda: 0.0)
    for i in range(10):
        buckets.take(str(i).encode())
    assert len(buckets._buckets) == 3


# ------------------------------------------------------------------------------------------- the shared store


@pytest.fixture
def migrated(db_url: str, tmp_path: Path) -> Iterator[str]:
    """A database with the broker's schema (SQLite, and PostgreSQL as an integration test); yields its URL."""
    engine = make_engine(Settings(database_url=db_url, data_dir=tmp_path))
    migrate.upgrade(engine)
    engine.dispose()
    yield db_url


@pytest.fixture
def run() -> Iterator[Callable[[Awaitable[T]], T]]:
    """Run a coroutine on one event loop for the whole test (the shared store's connections belong to a loop)."""
    with asyncio.Runner() as runner:
        yield runner.run  # type: ignore[misc]


@pytest.fixture
def shared(migrated: str, run: Callable[[Awaitable[Any]], Any]) -> Iterator[Callable[..., SharedBuckets]]:
    made: list[SharedBuckets] = []

    def make(rate: float, burst: int, **options: Any) -> SharedBuckets:
        made.append(SharedBuckets.open(migrated, rate, burst, **options))
        return made[-1]

    yield make
    for buckets in made:
        run(buckets.aclose())


def _rows(url: str) -> dict[bytes, float]:
    engine = make_engine(Settings(database_url=url))
    try:
        with engine.connect() as conn:
            return {bytes(k): tat for k, tat in conn.execute(text("SELECT key, tat FROM rate_limit_bucket"))}
    finally:
        engine.dispose()


def _age(url: str, key: bytes, seconds: float) -> None:
    """Let `seconds` pass for one bucket on the database's clock (its full-again time moves back by as much)."""
    engine = make_engine(Settings(database_url=url))
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE rate_limit_bucket SET tat = tat - :s WHERE key = :k"), {"s": seconds, "k": key})
    finally:
        engine.dispose()


def _within_one_interval(wait: float, interval: float, started: float) -> bool:
    """A refused take's wait on the real clock: one token's interval, less at most the time since `started`."""
    return interval - (time.monotonic() - started) - 0.01 <= wait <= interval + 0.001


def _retry_after_fits(header: str, interval: float, started: float) -> bool:
    """Retry-After (whole seconds, rounded up) for a bucket whose first token went at or after `started`."""
    return math.floor(interval - (time.monotonic() - started)) <= int(header) <= math.ceil(interval)


def test_shared_bucket_refills_at_its_rate_and_says_how_long_to_wait(
    shared: Callable[..., SharedBuckets], migrated: str, run: Callable[[Awaitable[Any]], Any]
) -> None:
    # a token every 20 s: however loaded the machine, nothing refills while the test runs; time passes by _age
    buckets = shared(rate=0.05, burst=3)
    started = time.monotonic()
    assert [run(buckets.take(b"k1")) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = run(buckets.take(b"k1"))
    assert _within_one_interval(wait, 20.0, started), f"waited {wait} s for a token due 20 s after the first take"
    assert run(buckets.take(b"k2")) == 0.0, "buckets are per key"
    other = shared(rate=0.05, burst=3)  # another process: it has no memory of the refusal
    _age(migrated, b"k1", 20.0)
    assert run(other.take(b"k1")) == 0.0, "20 s later, one token is back"
    assert run(other.take(b"k1")) > 0, "and only one"
    _age(migrated, b"k1", 1000.0)
    third = shared(rate=0.05, burst=3)  # (`other` now remembers its refusal)
    assert [run(third.take(b"k1")) > 0 for _ in range(4)] == [False] * 3 + [True], "refill stops at the burst"
    assert set(_rows(migrated)) == {b"k1", b"k2"}, "one row per bucket, under the bucket's key"


def test_shared_takes_are_atomic_under_concurrency(
    shared: Callable[..., SharedBuckets], run: Callable[[Awaitable[Any]], Any]
) -> None:
    """200 concurrent takes over 8 database connections race for one key's 25 tokens: exactly 25 are taken.
    (At 0.001 token/s the refill while the test runs is far below one token, so the count is exact.)"""
    buckets = shared(rate=0.001, burst=25)

    async def race() -> list[float]:
        return list(await asyncio.gather(*(buckets.take(b"hot") for _ in range(200))))

    waits = run(race())
    assert waits.count(0.0) == 25, f"{waits.count(0.0)} tokens taken from a bucket of 25"
    assert all(990 < w <= 1000 for w in waits if w), "a refused take waits for the next token, about 1/rate"


def test_a_refused_bucket_is_not_asked_again_before_its_token_is_due(
    shared: Callable[..., SharedBuckets], migrated: str, run: Callable[[Awaitable[Any]], Any]
) -> None:
    """Once the database has said "next token in 20 s", nothing another process does can bring it sooner: the
    process refuses that bucket from memory until then (a flood costs no round trip per request)."""
    buckets = shared(rate=0.05, burst=1)
    started = time.monotonic()
    assert run(buckets.take(b"kflood")) == 0.0
    first = run(buckets.take(b"kflood"))
    assert _within_one_interval(first, 20.0, started)
    _rename(migrated, "rate_limit_bucket", "rate_limit_bucket_gone")  # the database can no longer answer
    try:
        again = [run(buckets.take(b"kflood")) for _ in range(50)]
        assert all(0 < w <= first for w in again), "refused from memory, with the time left"
        with pytest.raises(Exception, match="rate_limit_bucket"):
            run(buckets.take(b"kother"))  # any other bucket still asks the database
    finally:
        _rename(migrated, "rate_limit_bucket_gone", "rate_limit_bucket")


@pytest.mark.integration
def test_the_shared_table_is_unlogged_on_postgresql(postgres: Any, tmp_path: Path) -> None:
    url = postgres.create_database()
    engine = make_engine(Settings(database_url=url, data_dir=tmp_path))
    migrate.upgrade(engine)
    with engine.connect() as conn:
        persistence = conn.execute(text("SELECT relpersistence FROM pg_class WHERE relname = 'rate_limit_bucket'"))
        assert persistence.scalar_one() == "u", "a bucket is not worth a WAL record"
    engine.dispose()


def test_sweep_deletes_idle_buckets_and_keeps_at_most_max_buckets(
    shared: Callable[..., SharedBuckets], migrated: str, run: Callable[[Awaitable[Any]], Any]
) -> None:
    fast = shared(rate=1000.0, burst=1)  # full again 1 ms after a take: idle at once
    for i in range(30):
        run(fast.take(b"idle%d" % i))
    slow = shared(rate=0.01, burst=5, max_buckets=3)  # a take empties 100 s of refill
    for i in range(5):
        assert [run(slow.take(b"busy%d" % i)) for _ in range(i + 1)] == [0.0] * (i + 1)  # busy4: 5 of 5 taken
    time.sleep(0.05)
    assert run(slow.sweep()) == 30 + 2, "every idle bucket, then the two fullest beyond max_buckets"
    assert set(_rows(migrated)) == {b"busy2", b"busy3", b"busy4"}, "the most drained buckets are kept"
    assert run(slow.take(b"busy4")) > 0, "a kept bucket keeps its state (empty)"


def test_a_take_sweeps_when_due(
    shared: Callable[..., SharedBuckets], migrated: str, run: Callable[[Awaitable[Any]], Any]
) -> None:
    buckets = shared(rate=1000.0, burst=1, sweep_seconds=0.0)
    limiter = RateLimit(_no_app, rate=1000.0, burst=1, shared=buckets)
    for i in range(10):
        run(buckets.take(b"idle%d" % i))
    time.sleep(0.05)
    assert run(limiter.take([(b"kfresh", "this API key")])) == (0.0, "")
    assert set(_rows(migrated)) <= {b"kfresh"}, "the idle buckets went with the take"


# ------------------------------------------------------------------------------------ the store a process uses


def test_auto_store_is_shared_on_postgresql_and_for_several_processes() -> None:
    pg = Settings(database_url="postgresql://u@db/overspill")
    lite = Settings(database_url="sqlite:///x.db")
    assert rate_limit_store(pg) == "shared"
    assert rate_limit_store(lite) == "local", "one process on SQLite: nothing to share"
    assert rate_limit_store(lite, several_processes=True) == "shared", "uvicorn workers on one SQLite file"
    assert rate_limit_store(Settings(database_url="postgresql://u@db/o", rate_limit_store="local")) == "local"
    assert rate_limit_store(Settings(database_url="sqlite:///x.db", rate_limit_store="shared")) == "shared"


STORES = [
    pytest.param(("local", "sqlite"), id="local-sqlite"),
    pytest.param(("shared", "sqlite"), id="shared-sqlite"),
    pytest.param(("shared", "postgresql"), id="shared-postgresql", marks=pytest.mark.integration),
]


@pytest.fixture(params=STORES)
def limited(
    request: pytest.FixtureRequest, tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> Runtime:
    store, backend = request.param
    url = request.getfixturevalue("postgres").create_database() if backend == "postgresql" else None
    url = url or f"sqlite:///{tmp_path / 'rl.db'}"
    rt = make_runtime(
        url,
        # slow rates on the real clock: a loaded machine (parallel workers) cannot refill a bucket mid-test
        rate_limit_per_second=0.05,
        rate_limit_burst=3,
        rate_limit_unverified_per_second=0.025,
        rate_limit_unverified_burst=3,
        rate_limit_store=store,
    )
    tick(rt, clock())
    return rt


def test_a_key_over_its_limit_gets_429_with_retry_after(limited: Runtime, clock: MovableClock) -> None:
    key = create_key(limited.engine, tenant="acme", role=Role.ADMIN, name="a", now=clock())
    other = create_key(limited.engine, tenant="acme", role=Role.ADMIN, name="b", now=clock())
    with TestClient(create_app(runtime=limited)) as api:
        auth = {"Authorization": f"Bearer {key}"}
        started = time.monotonic()
        assert [api.get("/v1/jobs", headers=auth).status_code for _ in range(3)] == [200, 200, 200]
        refused = api.get("/v1/jobs", headers=auth)
        assert refused.status_code == 429
        # 0.05 tokens/s: a token 20 s after the first request, rounded up, less the time the requests took
        assert _retry_after_fits(refused.headers["Retry-After"], 20.0, started), refused.headers["Retry-After"]
        assert "rate limit" in refused.json()["message"] and "this API key" in refused.json()["message"]
        assert api.get("/v1/jobs", headers={"X-API-Key": other}).status_code == 200, "another key is unaffected"
        assert all(api.get("/healthz").status_code == 200 for _ in range(10)), "health checks are exempt"
        assert all(api.get("/readyz").status_code != 429 for _ in range(10)), "health checks are exempt"


def test_guessing_keys_is_limited_per_address_and_cannot_drain_a_real_key(
    limited: Runtime, clock: MovableClock
) -> None:
    key = create_key(limited.engine, tenant="acme", role=Role.ADMIN, name="a", now=clock())
    key_id = key.split("_")[1]
    with TestClient(create_app(runtime=limited)) as api:
        assert api.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200  # now verified
        started = time.monotonic()
        guesses = [
            api.get("/v1/jobs", headers={"Authorization": f"Bearer ovs_{key_id}_{n:032d}"}).status_code
            for n in range(5)
        ]
        assert guesses == [401, 401, 429, 429, 429], guesses  # the address's unverified-key bucket (3) ran dry
        refused = api.get("/v1/jobs", headers={"Authorization": f"Bearer ovs_{key_id}_{9:032d}"})
        # 0.025 unverified keys/s: the next in 40 s after the first guess
        assert _retry_after_fits(refused.headers["Retry-After"], 40.0, started), refused.headers["Retry-After"]
        assert "unverified API keys from client address" in refused.json()["message"]
        # no key at all: the address's other bucket (its own 3), which the guesses did not touch
        assert [api.get("/v1/jobs").status_code for _ in range(4)] == [401, 401, 401, 429]
        # the real key (verified, so not charged to the address) still has its own tokens
        assert api.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200


@pytest.mark.parametrize("store", ["shared", "local"])
def test_two_apps_on_one_database_share_a_keys_bucket_only_with_the_shared_store(
    store: str, db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """Two app instances (as two processes would have: their own middleware and memory) on one database."""
    rt = make_runtime(db_url, rate_limit_per_second=0.05, rate_limit_burst=3, rate_limit_store=store)
    key = create_key(rt.engine, tenant="acme", role=Role.ADMIN, name="a", now=clock())
    auth = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(runtime=rt)) as one, TestClient(create_app(runtime=rt)) as two:
        codes = [api.get("/v1/whoami", headers=auth).status_code for api in (one, two, one, two, one, two)]
    if store == "shared":
        assert codes == [200, 200, 200, 429, 429, 429], "one bucket of 3 for the key, whichever app answers"
    else:
        assert codes == [200] * 6, "local buckets: each process admits its own burst"


# ----------------------------------------------------------------------------------- when the database fails


def _no_app(*_: Any) -> Any:
    raise AssertionError("RateLimit.take is called directly here")


class Ticks:
    """A clock a test moves by hand, for RateLimit's retry window."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "broker.api.ratelimit" and r.levelno >= logging.WARNING]


def _rename(url: str, old: str, new: str) -> None:
    engine = make_engine(Settings(database_url=url))
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))
    engine.dispose()


def test_a_failing_database_falls_back_to_local_buckets_logs_once_and_comes_back(
    shared: Callable[..., SharedBuckets],
    migrated: str,
    run: Callable[[Awaitable[Any]], Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticks = Ticks()
    limiter = RateLimit(_no_app, rate=0.5, burst=2, clock=ticks, shared=shared(rate=0.5, burst=2), retry_seconds=5)

    def take(bucket: bytes) -> tuple[float, str]:
        return run(limiter.take([(bucket, "this API key")]))  # type: ignore[no-any-return]

    assert take(b"kshared") == (0.0, "")
    assert b"kshared" in _rows(migrated)
    _rename(migrated, "rate_limit_bucket", "rate_limit_bucket_gone")  # every statement on it now fails
    caplog.set_level(logging.INFO, logger="broker.api.ratelimit")
    # judged by this process's buckets (full: burst 2), not an exception and so never a 5xx
    assert [take(b"kshared")[0] for _ in range(3)] == [0.0, 0.0, pytest.approx(2.0)]
    assert limiter.falling_back
    ticks.now += 6  # the database is tried again, fails again: same outage, no second warning
    assert take(b"kother") == (0.0, "")
    assert len(_warnings(caplog)) == 1 and "rate_limit_bucket" in _warnings(caplog)[0]
    _rename(migrated, "rate_limit_bucket_gone", "rate_limit_bucket")
    assert take(b"kback") == (0.0, ""), "still within the retry window: local"
    assert b"kback" not in _rows(migrated), "the database is not asked during the retry window"
    ticks.now += 6
    assert take(b"kback") == (0.0, "")
    assert b"kback" in _rows(migrated), "back on the shared buckets"
    assert not limiter.falling_back
    assert any("back" in r.getMessage() for r in caplog.records if r.name == "broker.api.ratelimit")
    assert len(_warnings(caplog)) == 1


def test_a_stuck_database_times_out_into_the_fallback(
    shared: Callable[..., SharedBuckets], db_url: str, run: Callable[[Awaitable[Any]], Any]
) -> None:
    """Another session holds the table (PostgreSQL) or the write lock (SQLite): the take gives up after its
    timeout and the request is judged locally, rather than waiting as long as the lock is held."""
    limiter = RateLimit(_no_app, rate=1.0, burst=5, shared=shared(rate=1.0, burst=5, timeout=0.3))
    if db_url.startswith("postgresql"):
        blocker: Any = psycopg.connect(db_url)
        blocker.execute("LOCK TABLE rate_limit_bucket IN ACCESS EXCLUSIVE MODE")
    else:
        blocker = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        assert run(limiter.take([(b"kstuck", "this API key")])) == (0.0, "")
        assert time.monotonic() - started < 10.0, "the take gave up; it did not wait for the lock to go"
        assert limiter.falling_back, "the timeout counted as a failure of the shared store"
    finally:
        blocker.rollback()
        blocker.close()


@pytest.mark.integration
def test_dropped_connections_are_replaced_and_an_unreachable_server_falls_back(
    postgres: Any, tmp_path: Path, run: Callable[[Awaitable[Any]], Any], caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres.create_database()
    engine = make_engine(Settings(database_url=url, data_dir=tmp_path))
    migrate.upgrade(engine)
    buckets = SharedBuckets.open(url, 0.05, 2)
    limiter = RateLimit(_no_app, rate=0.05, burst=2, shared=buckets)
    key = [(b"k1", "this API key")]
    caplog.set_level(logging.INFO, logger="broker.api.ratelimit")
    try:
        started = time.monotonic()
        assert run(limiter.take(key)) == (0.0, "")  # a pooled connection now exists
        with engine.connect() as conn:  # the server drops it (a restart, a failover, an idle timeout)
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        assert run(limiter.take(key)) == (0.0, "")
        wait = run(limiter.take(key))[0]
        assert _within_one_interval(wait, 20.0, started), "still the shared bucket: 2 of 2 taken"
        assert not limiter.falling_back and not _warnings(caplog), "a fresh connection replaced the dead one"
    finally:
        run(buckets.aclose())
        engine.dispose()
    down = SharedBuckets.open(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere", 0.05, 1)
    limiter = RateLimit(_no_app, rate=0.05, burst=1, shared=down)
    started = time.monotonic()
    assert run(limiter.take(key)) == (0.0, "")
    assert _within_one_interval(run(limiter.take(key))[0], 20.0, started), "the local bucket"
    assert limiter.falling_back and len(_warnings(caplog)) == 1


def test_the_api_answers_and_limits_when_the_shared_table_fails(
    tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'rl.db'}"
    rt = make_runtime(url, rate_limit_per_second=0.05, rate_limit_burst=3, rate_limit_store="shared")
    key = create_key(rt.engine, tenant="acme", role=Role.ADMIN, name="a", now=clock())
    _rename(url, "rate_limit_bucket", "rate_limit_bucket_gone")
    caplog.set_level(logging.INFO, logger="broker.api.ratelimit")
    with TestClient(create_app(runtime=rt)) as api:
        started = time.monotonic()
        answers = [api.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}) for _ in range(5)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429, 429], "no 5xx: this process's buckets"
    assert _retry_after_fits(answers[3].headers["Retry-After"], 20.0, started), answers[3].headers["Retry-After"]
    assert len(_warnings(caplog)) == 1
