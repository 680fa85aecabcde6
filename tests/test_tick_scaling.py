"""The tick at scale: settled placements cost one batched provider read and no row lock, the placements that need
attention are handled in batches whose members fail independently, accrual batches write the exact ledger, the
return-on-prem step does nothing per job while every on-prem queue is long, and the ceiling guard looks as far
ahead as the ticks really take (benchmarks/tick_bench.py measures the step times at thousands of jobs)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlmodel import Session, select

from broker.loop.feeds import refresh_prices
from broker.loop.return_onprem import return_onprem
from broker.loop.sync import guard_horizon_seconds, sync_instances
from broker.loop.tick import STEPS, tick
from broker.runtime import Runtime
from broker.store.tables import CostEntryRow, Job, JobEvent, Placement
from providers.base import Instance, ProviderError
from providers.model import CapacityType, hours_between
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, admin_api, attach


class BatchCloud(ScriptedCloud):
    """A scripted cloud that answers many instances at once (as EC2's DescribeInstances does), and counts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.get_calls = 0
        self.get_many_calls = 0
        self.failing_terminate: set[str] = set()

    def get(self, instance_id: str) -> Instance:
        self.get_calls += 1
        return super().get(instance_id)

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, Instance]:
        self.get_many_calls += 1
        return {i: ScriptedCloud.get(self, i) for i in instance_ids if i in self.vms}

    def terminate(self, instance_id: str) -> None:
        if instance_id in self.failing_terminate:
            raise ProviderError(f"terminate {instance_id}: 503", provider=self.name)
        super().terminate(instance_id)


@pytest.fixture
def cloud(clock: MovableClock) -> BatchCloud:
    return BatchCloud("batchy", clock)


@pytest.fixture
def srt(db_url: str, make_runtime: Callable[..., Runtime], cloud: BatchCloud, clock: MovableClock) -> Runtime:
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0, return_onprem=True)
    attach(rt, cloud)
    tick(rt, clock())
    return rt


@pytest.fixture
def api(srt: Runtime) -> TestClient:
    return admin_api(srt)


@contextmanager
def statements(rt: Runtime) -> Iterator[list[str]]:
    """Every SQL statement `rt`'s engine runs inside the block."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(rt.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(rt.engine, "before_cursor_execute", record)


def _submit(api: TestClient, n: int, **overrides: str) -> list[str]:
    return [api.post("/v1/jobs", json=job_body(name=f"j{i}", **overrides)).json()["id"] for i in range(n)]


def test_settled_placements_cost_one_batched_read_and_no_lock(
    srt: Runtime, api: TestClient, cloud: BatchCloud, clock: MovableClock
) -> None:
    _submit(api, 12, work_gpu_hours="5", max_total_usd="200")
    tick(srt, clock.advance(minutes=1))  # placed and launched
    tick(srt, clock.advance(minutes=1))  # started: recorded under the locks
    with Session(srt.engine) as s:
        assert {p.state for p in s.exec(select(Placement)).all()} == {"running"}
    cloud.get_calls = cloud.get_many_calls = 0
    clock.advance(minutes=1)
    with statements(srt) as seen:
        assert sync_instances(srt, clock()) == 0
    assert (cloud.get_many_calls, cloud.get_calls) == (1, 0)
    assert not [s for s in seen if "FOR UPDATE" in s.upper()], "a settled placement takes no row lock"
    assert not [s for s in seen if s.lstrip().upper().startswith(("UPDATE", "INSERT"))]


def test_one_failing_placement_leaves_the_rest_of_its_batch_applied(
    srt: Runtime, api: TestClient, cloud: BatchCloud, clock: MovableClock
) -> None:
    ids = _submit(api, 4, work_gpu_hours="5", max_total_usd="200")
    tick(srt, clock.advance(minutes=1))
    tick(srt, clock.advance(minutes=1))
    with Session(srt.engine) as s:
        by_job = {p.job_id: p for p in s.exec(select(Placement)).all()}
    stuck = by_job[ids[0]].instance_id
    assert stuck is not None
    cloud.failing_terminate = {stuck}
    for job_id in ids[:3]:
        assert api.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    cloud.preempt(str(by_job[ids[3]].instance_id))
    assert sync_instances(srt, clock.advance(minutes=1)) == 3  # two stopped, one preempted, one failed alone
    with Session(srt.engine) as s:
        states = {p.job_id: p.state for p in s.exec(select(Placement)).all()}
    assert states == {ids[0]: "running", ids[1]: "stopped", ids[2]: "stopped", ids[3]: "preempted"}
    cloud.failing_terminate = set()
    assert sync_instances(srt, clock.advance(minutes=1)) == 1  # the next tick retries it
    with Session(srt.engine) as s:
        assert s.exec(select(Placement.state).where(Placement.job_id == ids[0])).one() == "stopped"


def test_accrual_in_batches_writes_each_jobs_exact_ledger(
    srt: Runtime, api: TestClient, cloud: BatchCloud, clock: MovableClock
) -> None:
    srt.settings.loop_batch_size = 3  # 10 placements: batches of 3, 3, 3 and 1
    cloud.prices = {"z1": Decimal("10.25"), "z2": Decimal("10.25")}
    ids = _submit(api, 10, work_gpu_hours="2", max_total_usd="50")
    for _ in range(16):
        tick(srt, clock.advance(minutes=10))
    with Session(srt.engine) as s:
        for job_id in ids:
            job = s.get(Job, job_id)
            assert job is not None and job.state == "succeeded"
            [p] = s.exec(select(Placement).where(Placement.job_id == job_id)).all()
            entries = s.exec(select(CostEntryRow.usd).where(CostEntryRow.job_id == job_id)).all()
            assert p.started_at is not None and p.ended_at is not None
            assert (
                sum(entries, Decimal(0)) == job.spent_usd == Decimal("10.25") * hours_between(p.started_at, p.ended_at)
            )


def test_steady_accrual_writes_each_placement_once_per_cadence_spread_over_the_ticks(
    srt: Runtime, api: TestClient, cloud: BatchCloud, clock: MovableClock
) -> None:
    """10 s ticks, a 60 s accrual cadence: each running placement is accrued once per cadence at its own phase (not
    all of them on one tick, though they all started together), with no event per accrual, the ledger never more
    than a cadence behind, and the entries still summing to the exact cost."""
    assert srt.settings.accrual_cadence_seconds == 60
    cloud.prices = {"z1": Decimal("10.25"), "z2": Decimal("10.25")}
    ids = _submit(api, 12, work_gpu_hours="2", max_total_usd="50")
    for _ in range(2):
        tick(srt, clock.advance(minutes=10))
    for _ in range(6):  # a cadence of 10 s ticks: every placement reaches its own accrual grid
        tick(srt, clock.advance(seconds=10))
    with Session(srt.engine) as s:
        events = len(s.exec(select(JobEvent.id).where(JobEvent.kind == "cost_accrued")).all())
    per_tick = []
    for _ in range(12):  # two cadences
        now = clock.advance(seconds=10)
        per_tick.append(tick(srt, now).count("accrue_costs"))
        with Session(srt.engine) as s:
            marks = s.exec(select(Placement.accrued_until).where(Placement.state == "running")).all()
        assert len(marks) == 12 and all(m is not None and now - m < timedelta(seconds=60) for m in marks)
    assert sum(per_tick) == 24 and max(per_tick) < 12  # each placement twice (one entry each), spread out
    with Session(srt.engine) as s:
        assert len(s.exec(select(JobEvent.id).where(JobEvent.kind == "cost_accrued")).all()) == events
    for _ in range(14):
        tick(srt, clock.advance(minutes=10))
    with Session(srt.engine) as s:
        for job_id in ids:
            job = s.get(Job, job_id)
            [p] = s.exec(select(Placement).where(Placement.job_id == job_id)).all()
            entries = s.exec(select(CostEntryRow.usd).where(CostEntryRow.job_id == job_id)).all()
            assert job is not None and job.state == "succeeded" and p.started_at and p.ended_at
            assert (
                sum(entries, Decimal(0)) == job.spent_usd == Decimal("10.25") * hours_between(p.started_at, p.ended_at)
            )


def test_return_onprem_reads_nothing_per_job_while_every_onprem_queue_is_long(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """Prices as in tests/test_return_onprem.py: with 10 h of on-prem queue a 4 GPU-hour job bursts to the
    $10/h cloud; once the queue drains, on-prem ($2/h) wins."""
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=5.0)
    cloud = BatchCloud("aws", clock, zones=("us-east-1a",), region="us-east-1")
    cloud.prices = {"us-east-1a": Decimal("10")}
    cloud.slow_start = {"us-east-1a"}  # instances stay pending: a return moves them at once
    onprem = BatchCloud("dc", clock, zones=("dc1",), region="dc1", capacity=CapacityType.ON_PREM)
    onprem.prices = {"dc1": Decimal("2")}
    onprem.wait_hours = 10.0
    attach(rt, cloud, onprem)
    tick(rt, clock())
    api = admin_api(rt)
    _submit(api, 6, work_gpu_hours="4", max_total_usd="100")
    tick(rt, clock.advance(minutes=1))
    with Session(rt.engine) as s:
        assert {p.provider for p in s.exec(select(Placement)).all()} == {"aws"}
    cloud.get_calls = cloud.get_many_calls = 0
    assert return_onprem(rt, clock.advance(minutes=1)) == 0
    assert (cloud.get_calls, cloud.get_many_calls) == (0, 0), "a long queue everywhere: no read per job"
    onprem.wait_hours = 0.0  # the queue drained: every cloud job is considered, its instance read in one batch
    refresh_prices(rt, clock())
    assert return_onprem(rt, clock()) == 6
    assert cloud.get_many_calls == 1
    # each job read again under its locks before it is stopped, and once after its terminate (stop_placement)
    assert cloud.get_calls == 2 * 6


def test_the_ceiling_guard_looks_ahead_as_far_as_ticks_really_take(
    srt: Runtime, api: TestClient, cloud: BatchCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("10")}
    refresh_prices(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="45")).json()["id"]
    tick(srt, clock.advance(minutes=1))
    for _ in range(6):  # one hour at $10/h
        tick(srt, clock.advance(minutes=10))
    cloud.prices = {"z1": Decimal("20"), "z2": Decimal("20")}  # the spot price doubles: 3 h left would cost $60
    refresh_prices(srt, clock())
    assert guard_horizon_seconds(srt) == 2 * srt.settings.tick_interval_seconds  # ticks are fast: the interval
    assert sync_instances(srt, clock()) == 0  # $10 + 20 min at $20/h fits $45: keep running
    srt.last_tick_seconds = 3 * 3600.0  # ticks now take three hours: the next look comes too late for $45
    assert guard_horizon_seconds(srt) == 6 * 3600.0
    assert sync_instances(srt, clock()) == 1
    with Session(srt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        assert job.state == "paused" and "max_total_usd" in job.wait_reason
        assert job.spent_usd <= Decimal("45")
    assert cloud.running() == []


def test_the_garbage_collector_is_relaxed_while_ticks_run_and_restored_after(rt: Runtime, clock: MovableClock) -> None:
    """Inside a tick (and inside overlapping ticks in threads) the collector still runs, at TICK_GC_THRESHOLD young
    objects instead of the default 700; back as it was when the last one ends; a step that raises does not leave it
    relaxed; a process that set a higher threshold, or runs without the collector, keeps that."""
    from broker.loop.tick import TICK_GC_THRESHOLD

    seen: list[tuple[bool, int]] = []
    inside, release = threading.Event(), threading.Event()
    default = gc.get_threshold()
    relaxed = (gc.isenabled(), TICK_GC_THRESHOLD)

    def watch(_: Runtime, __: Any) -> int:
        seen.append((gc.isenabled(), gc.get_threshold()[0]))
        return 0

    def hold(_: Runtime, __: Any) -> int:
        inside.set()
        release.wait(10)
        return watch(_, __)

    def boom(_: Runtime, __: Any) -> int:
        raise RuntimeError("a failing step")

    assert gc.isenabled() and default[0] < TICK_GC_THRESHOLD
    tick(rt, clock(), [("watch", watch), ("boom", boom), *STEPS[:1]])
    assert seen == [relaxed] and gc.get_threshold() == default
    other = threading.Thread(target=tick, args=(rt, clock(), [("hold", hold)]))
    other.start()
    assert inside.wait(10)
    tick(rt, clock(), [("watch", watch)])  # ends while the other tick still runs: still relaxed for it
    release.set()
    other.join(10)
    assert seen == [relaxed] * 3 and gc.get_threshold() == default and gc.isenabled()
    gc.set_threshold(TICK_GC_THRESHOLD * 2, *default[1:])
    gc.disable()
    try:
        tick(rt, clock(), [("watch", watch)])
        assert seen[-1] == (False, TICK_GC_THRESHOLD * 2) and not gc.isenabled()
        assert gc.get_threshold()[0] == TICK_GC_THRESHOLD * 2
    finally:
        gc.set_threshold(*default)
        gc.enable()
