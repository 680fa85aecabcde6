"""Many replicas: four tick processes and two API processes against one PostgreSQL, jobs submitted concurrently
over HTTP; every job is placed exactly once, no replica hits a deadlock or a serialisation failure, and no update
is lost (tests/replicas.py; benchmarks/replicas_bench.py runs 5,000 jobs)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import Session, select

from broker.api.schemas import JobCreate
from broker.loop.place import place_pending
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.services.jobs import submit_job
from broker.store.tables import Job, Placement
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.replicas import run_replicas


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_four_tickers_and_two_apis_place_every_job_exactly_once(
    postgres: object, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_replicas(
        db_url=postgres.create_database(),  # type: ignore[attr-defined]
        jobs=300,
        tick_procs=4,
        api_procs=2,
        steady_ticks=1,
    )
    with capsys.disabled():
        print("\n" + report.table(4, 2))
    assert report.accepted == 300
    assert not report.step_errors, report.step_errors[:20]
    assert not report.violations, report.violations[:20]
    assert report.placements >= 300
    assert sum(1 for n in report.worker_placed if n > 0) >= 2, "the work was shared by several tick replicas"
    assert len(report.steady_tick_seconds) == 4, "each replica ticked once more with every job placed"
    assert sum(1 for n in report.worker_shards if n > 0) >= 2, "the per-placement work was shared (shard leases)"


def test_a_stale_tick_never_starts_a_placement_before_the_previous_one_ended(rt: Runtime, clock: MovableClock) -> None:
    """Found by the 5,000-job benchmark: a replica whose long tick still holds an old `now` placed a job that
    another replica (later clock) had just ended, so the two placements overlapped on paper."""
    job, _ = submit_job(
        rt.engine, rt.catalog, tenant="demo", create=JobCreate(**job_body()), idempotency_key=None, now=clock()
    )
    tick(rt, clock.advance(minutes=1))
    later = clock() + timedelta(minutes=5)  # the other replica's clock
    with Session(rt.engine) as s:
        first = s.exec(select(Placement).where(Placement.job_id == job.id)).one()
        stored = s.get(Job, job.id)
        assert stored is not None and stored.state == "running"
        first.state, first.ended_at = "preempted", later
        stored.state, stored.current_placement_id = "pending", None
        first_id = first.id
        s.add(first)
        s.add(stored)
        s.commit()
    place_pending(rt, clock())  # this replica's tick started before `later`
    with Session(rt.engine) as s:
        second = s.exec(select(Placement).where(Placement.job_id == job.id, Placement.id != first_id)).one()
    assert second.created_at == later
