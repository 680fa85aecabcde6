"""Many replicas: four tick processes and two API processes against one PostgreSQL, jobs submitted concurrently
over HTTP; every job is placed exactly once, no replica hits a deadlock or a serialisation failure, and no update
is lost (tests/replicas.py; benchmarks/replicas_bench.py runs 5,000 jobs)."""

from __future__ import annotations

import pytest

from tests.replicas import run_replicas


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_four_tickers_and_two_apis_place_every_job_exactly_once(
    postgres: object, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_replicas(db_url=postgres.create_database(), jobs=300, tick_procs=4, api_procs=2)  # type: ignore[attr-defined]
    with capsys.disabled():
        print("\n" + report.table(4, 2))
    assert report.accepted == 300
    assert not report.step_errors, report.step_errors[:20]
    assert not report.violations, report.violations[:20]
    assert report.placements >= 300
    assert sum(1 for n in report.worker_placed if n > 0) >= 2, "the work was shared by several tick replicas"
