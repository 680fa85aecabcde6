"""Crash consistency: the broker killed (SIGKILL) at every crash point, restarted, and checked (tests/crash_harness.py).

A representative subset runs here (two injections per point, ~10 s each); benchmarks/crash_bench.py runs every
point at many arrival counts and prints the table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.crash_harness import COPY_POINT, POINTS, Env, format_table, run_injection
from tests.moto_server import running_moto_server

CI_INJECTIONS = [(point, nth) for point in POINTS for nth in ((2, 5) if point == COPY_POINT else (1, 3))]


@pytest.fixture(scope="module")
def crash_env(postgres: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_moto_server() as url:
        yield Env(
            pg_admin_url=postgres.admin_url,  # type: ignore[attr-defined]
            moto_url=url,
            workdir=tmp_path_factory.mktemp("crash"),
            create_database=postgres.create_database,  # type: ignore[attr-defined]
        )


@pytest.mark.integration
@pytest.mark.slow(150)
@pytest.mark.timeout(900)
def test_broker_survives_sigkill_at_every_crash_point(crash_env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = [run_injection(crash_env, point, nth) for point, nth in CI_INJECTIONS]
    table = format_table(outcomes)
    with capsys.disabled():
        print("\n" + table)
    not_killed = [f"{o.point}:{o.nth}" for o in outcomes if not o.crashed]
    assert not not_killed, f"these crash points were never reached: {not_killed}\n{table}"
    violations = [f"{o.point}:{o.nth}: {v}" for o in outcomes for v in o.violations]
    assert not violations, "\n".join(violations) + "\n" + table


def test_crashpoint_is_inert_unless_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, or naming another point, a crash point does nothing (the production path)."""
    from broker import crashpoints

    monkeypatch.delenv(crashpoints.ENV, raising=False)
    crashpoints.reset()
    crashpoints.crashpoint("launch.after_cloud_call")
    monkeypatch.setenv(crashpoints.ENV, "accrue.after_commit:2")
    crashpoints.reset()
    crashpoints.crashpoint("launch.after_cloud_call")
    crashpoints.crashpoint("accrue.after_commit")  # first arrival of two: still alive
    crashpoints.reset()
    monkeypatch.delenv(crashpoints.ENV)
    crashpoints.reset()
