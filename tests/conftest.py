"""Shared fixtures: databases (SQLite and a real PostgreSQL), a movable clock, a runtime and API clients.

With `OVERSPILL_REQUIRE_INTEGRATION=1` (set by `.ci/run`) any skipped test fails the run, including a module
skipped at collection (a missing SDK): CI must prove the real components work, not quietly skip them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.api.auth import Role, create_key
from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.observe.logging_setup import log_scope
from broker.runtime import Runtime, build_runtime

pytest_plugins = ["tests.leak_check", "tests.xdist_groups", "tests.integration_marks", "tests.progress"]

REQUIRE_INTEGRATION = os.environ.get("OVERSPILL_REQUIRE_INTEGRATION") == "1"
if os.environ.get("PYTEST_XDIST_WORKER"):
    # a pytest-xdist worker has imported GNU readline by now, which exported its guess at a terminal (COLUMNS=80,
    # LINES=24) into the environment: the CLI's rich Console, made at import, would keep that width, and every
    # process a test starts would inherit it
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)
T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if REQUIRE_INTEGRATION and report.skipped and not hasattr(report, "wasxfail"):
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if REQUIRE_INTEGRATION and report.skipped:
        _fail_skip(report)


def _fail_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    report.outcome = "failed"
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.longrepr = f"skipped but OVERSPILL_REQUIRE_INTEGRATION=1 (CI runs everything): {reason}"


@pytest.hookimpl(trylast=True)  # after -k and -m deselected what they do
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Terraform example's readers run at a file boundary half-way through the run and its destroy runs last,
    so in a run without workers the background apply overlaps the first half of the run and the destroy the second
    (tests/terraform_cli.py)."""
    destroys = [i for i in items if i.get_closest_marker("terraform_destroy")]
    readers = [i for i in items if i.get_closest_marker("terraform_deployment")]
    if not destroys and not readers:
        return
    others = [i for i in items if i not in destroys and i not in readers]
    middle = next((n for n in range(len(others) // 2, len(others)) if others[n].path != others[n - 1].path), 0)
    items[:] = others[:middle] + readers + others[middle:] + destroys
    config.stash[_TF_READERS] = {i.nodeid for i in readers}
    config.stash[_TF_DESTROY_SELECTED] = bool(destroys)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not session.config.stash.get(_TF_READERS, set()):
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # every worker collects every test: the one that runs the group applies when its first reader asks
    from tests.terraform_cli import start_example_deployment

    start_example_deployment(session.config)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    readers = item.config.stash.get(_TF_READERS, None)
    if not readers or item.nodeid not in readers:
        return
    readers.discard(item.nodeid)
    if not readers and item.config.stash.get(_TF_DESTROY_SELECTED, False):
        from tests.terraform_cli import start_example_destroy

        start_example_destroy(item.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Release the Terraform example's moto process and workspaces with the session, before tests/leak_check.py
    looks for what the run left behind."""
    import sys

    if "tests.terraform_cli" in sys.modules:
        sys.modules["tests.terraform_cli"].release_example(session.config)


_TF_READERS = pytest.StashKey[set[str]]()
_TF_DESTROY_SELECTED = pytest.StashKey[bool]()


class MovableClock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> datetime:
        self.now += timedelta(**kwargs)
        return self.now


@pytest.fixture(autouse=True)
def _fresh_log_context() -> Iterator[None]:
    """Tests that call loop functions outside `tick()` bind job context with no step scope around it; undo that
    after each test, as a tick step does, so it cannot leak into the next test's log records."""
    with log_scope():
        yield


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    from tests.pg import start_postgres

    try:
        server = start_postgres()
    except (FileNotFoundError, OSError) as exc:
        pytest.skip(f"no PostgreSQL available: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    """A real Slurm 22.05 cluster (2 nodes x 4 fake A100) for the whole session; skips saying why if absent."""
    from tests.slurm_cluster import slurm_session

    yield from slurm_session()


@pytest.fixture(params=["cli", "rest"])
def slurm_transport(request: pytest.FixtureRequest) -> str:
    """Which transport the broker talks to the real Slurm cluster through: the tools, or slurmrestd v0.0.38 with
    a JWT (started by the cluster on first use). Tests of the Slurm contract take it so both transports pass it."""
    return str(request.param)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'broker.store.db'}"
    server = request.getfixturevalue("postgres")
    return str(server.create_database())


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a hung API): the kernel completes the handshakes,
    nobody ever reads or answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        host, port = silent.getsockname()
        yield f"http://{host}:{port}"


@pytest.fixture
def clock() -> MovableClock:
    return MovableClock()


@pytest.fixture
def make_runtime(tmp_path: Path, clock: MovableClock) -> Iterator[Callable[..., Runtime]]:
    made: list[Runtime] = []

    def make(url: str, **overrides: Any) -> Runtime:
        # tests drive the API as fast as the test client goes: no per-key rate limit unless a test asks for one
        # (tests/test_ratelimit.py does)
        options: dict[str, Any] = {"tick_interval_seconds": 600, "rate_limit_per_second": 0, **overrides}
        settings = Settings(data_dir=tmp_path, database_url=url, bootstrap_api_key=DEV_API_KEY, **options)
        made.append(build_runtime(settings, clock=clock))
        return made[-1]

    yield make
    # close the test's database connections now, not whenever its engine is collected: on the session's one
    # PostgreSQL server they add up past max_connections over a full run
    for rt in made:
        rt.engine.dispose()


@pytest.fixture
def rt(db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock) -> Runtime:
    runtime = make_runtime(db_url)
    tick(runtime, clock())
    return runtime


@pytest.fixture
def client(rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=rt)) as c:
        c.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
        yield c


@pytest.fixture
def key_for(rt: Runtime, clock: MovableClock) -> Callable[[str, Role], dict[str, str]]:
    """Auth headers for a fresh key of `role` in `tenant`."""

    def make(tenant: str, role: Role) -> dict[str, str]:
        key = create_key(rt.engine, tenant=tenant, role=role, name="test", now=clock())
        return {"Authorization": f"Bearer {key}"}

    return make
