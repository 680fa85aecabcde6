"""Progress from the first second of a test run (a pytest plugin): what the run is doing while no test finishes.

Lines go to the terminal as they happen, stamped with the seconds since the run started and the worker:

    [   0s] pytest: starting 3 xdist workers (each imports and collects the suite first)
    [  21s gw1] collected 1902 tests, 1116 selected
    [  24s gw0] starting cluster (session fixture, for tests/test_e2e_slurm.py::test_...)
    [  71s gw0] cluster ready after 47s

A shared fixture (session, package or module scope) that starts a process or a server (tests/integration_marks.py
decides which, from the code) is announced when it starts and when it is ready; any other fixture is reported when
its set-up took more than `SLOW_FIXTURE_SECONDS`. In a pytest-xdist worker the line goes to the worker's stderr,
which is the controller's terminal; in a run without workers through the terminal reporter. Both with pytest's
capture suspended, so the line is seen now, not at the end. Per-test progress stays pytest's own.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration_marks import starts_a_service

STARTED_ENV = "OVERSPILL_RUN_STARTED"
SLOW_FIXTURE_SECONDS = 10.0


def _started() -> float:
    return float(os.environ.get(STARTED_ENV) or time.time())


def say(config: pytest.Config, text: str) -> None:
    """Print one progress line now, even while pytest captures the output of a test."""
    if config.getoption("collectonly", False):
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    line = f"[{time.time() - _started():5.0f}s{' ' + worker if worker else ''}] {text}"
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else _nothing():
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if worker or reporter is None:
            sys.__stderr__.write(f"\n{line}\n")
            sys.__stderr__.flush()
        else:
            reporter.ensure_newline()
            reporter.write_line(line)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[STARTED_ENV] = repr(time.time())  # the workers, started later, count from here too
        _CONFIG["config"] = config


_CONFIG: dict[str, pytest.Config] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    workers = config.getoption("numprocesses", None)
    if workers and not os.environ.get("PYTEST_XDIST_WORKER"):
        say(config, f"pytest: starting {workers} xdist workers (each imports and collects the suite first)")


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        config = items[0].config
        config.stash[_DESELECTED] = config.stash.get(_DESELECTED, 0) + len(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") == "gw0":
        selected = len(session.items)
        total = selected + session.config.stash.get(_DESELECTED, 0)
        say(session.config, f"collected {total} tests, {selected} selected")


_DESELECTED = pytest.StashKey[int]()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    config = node.config
    if config.stash.get(_ANNOUNCED, False):
        return
    config.stash[_ANNOUNCED] = True
    marks = config.getoption("markexpr", "") or ""
    say(config, f"{len(ids)} tests selected{f' (-m {marks!r})' if marks else ''}; the first results follow")


_ANNOUNCED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[None]:
    shared = fixturedef.scope != "function" and starts_a_service(fixturedef.func)
    config = request.config
    name = fixturedef.argname
    if shared:
        where = getattr(getattr(request, "_pyfuncitem", None), "nodeid", "")
        say(config, f"starting {name} ({fixturedef.scope} fixture, first needed by {where})")
    began = time.monotonic()
    outcome = yield
    took = time.monotonic() - began
    failed = outcome.excinfo is not None
    if shared:
        say(config, f"{name} {'failed' if failed else 'ready'} after {took:.0f}s")
    elif took > SLOW_FIXTURE_SECONDS:
        say(config, f"fixture {name} took {took:.0f}s to set up")


# --- where the time went: per worker and per module, to find what to speed up next --------------------------------

_SPENT = pytest.StashKey[dict[tuple[str, str], float]]()


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    config = _CONFIG.get("config")
    if config is None:
        return
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    spent = config.stash.setdefault(_SPENT, {})
    key = (worker, report.nodeid.split("::", 1)[0])
    spent[key] = spent.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    spent = config.stash.get(_SPENT, {})
    if not spent or config.getoption("collectonly", False):
        return
    by_worker: dict[str, float] = {}
    by_module: dict[str, float] = {}
    for (worker, module), seconds in spent.items():
        by_worker[worker] = by_worker.get(worker, 0.0) + seconds
        by_module[module] = by_module.get(module, 0.0) + seconds
    terminalreporter.write_sep("=", "where the time went (tests/progress.py)")
    busy = ", ".join(f"{w} {s:.0f}s" for w, s in sorted(by_worker.items()))
    terminalreporter.write_line(f"busy per worker: {busy}; wall {time.time() - _started():.0f}s")
    for module, seconds in sorted(by_module.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {module}")
