"""Tests for the simulated on-prem cluster: FIFO + EASY backfill, queue waits, pressure, cancellation."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from providers.base import (
    ComputeProvider,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    NotFound,
    OfferingSource,
    QueuePressureSource,
)
from providers.model import CapacityType, JobSpec, Offering, Tags
from providers.simulated.onprem import US_PER_HOUR, Job, SimulatedOnPremCluster, schedule
from providers.simulated.store import InMemorySimStore

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
H = US_PER_HOUR


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def cluster(
    *,
    gpus: dict[str, int] | None = None,
    background: float = 0.0,
    seed: int = 5,
    clock: Clock | None = None,
    store: InMemorySimStore | None = None,
    broker_id: str = "b1",
    history_hours: float = 168.0,
) -> SimulatedOnPremCluster:
    return SimulatedOnPremCluster(
        seed=seed,
        clock=clock or Clock(),
        store=store or InMemorySimStore(),
        broker_id=broker_id,
        gpus=gpus,
        background_jobs_per_hour=background,
        history_hours=history_hours,
    )


def offering(c: SimulatedOnPremCluster, gpus: int, acc: str = "A100") -> Offering:
    return next(o for o in c.offerings(c.clock()) if o.accelerator == acc and o.accelerator_count == gpus)


def submit(
    c: SimulatedOnPremCluster, token: str, gpus: int, work: str, *, acc: str = "A100", broker_id: str = "b1"
) -> str:
    off = offering(c, gpus, acc)
    spec = JobSpec("acme", "nlp", "p", "train", "img:1", ("train",), (acc,), gpus, Decimal(1000))
    req = LaunchRequest(off, token, Tags(broker_id, f"job-{token}", f"plc-{token}"), spec, Decimal(work))
    return c.launch(req).id


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def test_implements_the_provider_contracts() -> None:
    c = cluster()
    assert isinstance(c, ComputeProvider)
    assert isinstance(c, OfferingSource)
    assert isinstance(c, QueuePressureSource)


def test_offerings_price_every_size_at_the_internal_rate() -> None:
    c = cluster(background=6.0)
    offs = c.offerings(T0)
    assert sorted((o.accelerator, o.accelerator_count) for o in offs) == [
        (acc, n) for acc in ("A100", "V100") for n in (1, 2, 4, 8)
    ]
    for o in offs:
        rate = Decimal("1.10") if o.accelerator == "A100" else Decimal("0.45")
        assert o.hourly_usd == rate * o.accelerator_count
        assert o.capacity_type is CapacityType.ON_PREM
        assert (o.provider, o.region, o.zone) == ("onprem", "onprem", "dc1")
        assert o.instance_type == f"onprem-{o.accelerator.lower()}-{o.accelerator_count}gpu"
        assert o.price.source == "internal-rate" and not o.price.estimated
        assert o.interruption_rate_per_hour == 0 and o.egress_usd_per_gb == 0
        assert o.simulated and o.expected_wait_hours >= 0
        assert o.gpu_memory_gib == (40 if o.accelerator == "A100" else 16)


def test_schedule_is_fifo_when_jobs_do_not_fit_together() -> None:
    jobs = [Job(name, i, (i, 0, 0), 8, wall * H) for i, (name, wall) in enumerate([("a", 2), ("b", 1), ("c", 1)])]
    slots = schedule([8], jobs)
    assert slots["a"].start == 0
    assert slots["b"].start == 2 * H
    assert slots["c"].start == 3 * H


def test_schedule_never_splits_a_job_across_nodes() -> None:
    jobs = [Job("x", 0, (0, 0, 0), 6, 5 * H), Job("y", 0, (0, 0, 1), 6, 5 * H), Job("z", 0, (0, 0, 2), 4, H)]
    slots = schedule([8, 8], jobs)
    assert slots["x"].node != slots["y"].node
    assert slots["z"].start == 5 * H  # 4 GPUs are free in total, but only 2 on each node


def test_easy_backfill_fills_gaps_without_delaying_the_head() -> None:
    jobs = [
        Job("running", 0, (0, 0, 0), 4, 4 * H),
        Job("head", 1, (1, 0, 0), 8, 2 * H),  # blocked: reserved at 4 h
        Job("short", 2, (2, 0, 0), 2, 1 * H),  # ends before the reservation: backfills
        Job("long", 3, (3, 0, 0), 2, 10 * H),  # would delay the head: waits
    ]
    slots = schedule([8], jobs)
    assert slots["short"].start == 2
    assert slots["head"].start == 4 * H
    assert slots["long"].start == 6 * H


def test_easy_backfill_may_use_gpus_the_head_will_not_need() -> None:
    jobs = [
        Job("running", 0, (0, 0, 0), 4, 4 * H),
        Job("head", 1, (1, 0, 0), 6, 2 * H),  # reserved at 4 h, leaving 2 spare GPUs
        Job("spare", 2, (2, 0, 0), 2, 10 * H),  # long, but fits in the spare GPUs
        Job("late", 3, (3, 0, 0), 2, 10 * H),  # no GPUs free now
    ]
    slots = schedule([8], jobs)
    assert slots["spare"].start == 2
    assert slots["head"].start == 4 * H
    assert slots["late"].start == 6 * H


def test_cluster_runs_broker_jobs_fifo_with_backfill() -> None:
    clock = Clock()
    c = cluster(gpus={"A100": 8}, clock=clock)
    a = submit(c, "a", 4, "4")
    clock.now = at(0.1)
    head = submit(c, "head", 8, "2")
    clock.now = at(0.2)
    short = submit(c, "short", 2, "1")
    clock.now = at(0.3)
    long = submit(c, "long", 2, "10")
    assert [c.get(i).state for i in (a, head, short, long)] == [
        InstanceState.RUNNING,
        InstanceState.PENDING,
        InstanceState.RUNNING,
        InstanceState.PENDING,
    ]
    clock.now = at(10)
    assert c.get(a).started_at == T0
    assert c.get(short).started_at == at(0.2)
    assert c.get(head).started_at == at(4)
    assert c.get(long).started_at == at(6)


def test_state_progresses_queued_running_succeeded() -> None:
    clock = Clock()
    c = cluster(gpus={"A100": 8}, clock=clock)
    blocker = submit(c, "blocker", 8, "1")
    job = submit(c, "job", 4, "2.25")
    view = c.get(job)
    assert view.state is InstanceState.PENDING and view.started_at is None and view.detail == "queued"
    clock.now = at(2)
    view = c.get(job)
    assert view.state is InstanceState.RUNNING and view.started_at == at(1)
    assert view.checkpointed_work_hours == Decimal("1.0")
    clock.now = at(3.25)
    view = c.get(job)
    assert view.state is InstanceState.SUCCEEDED and view.ended_at == at(3.25)
    assert view.checkpointed_work_hours == Decimal("2.25")
    assert c.get(blocker).ended_at == at(1)


def test_expected_wait_grows_with_the_queue() -> None:
    c = cluster(gpus={"A100": 8})
    waits = [offering(c, 8).expected_wait_hours]
    for i in range(3):
        submit(c, f"t{i}", 8, "2")
        waits.append(offering(c, 8).expected_wait_hours)
    assert waits == [0.0, 2.0, 4.0, 6.0]
    # a 1-GPU job of unknown length cannot backfill ahead of the queued 8-GPU jobs
    assert c.pressure(T0)[0].expected_wait_hours == 6.0


def test_a_short_job_may_expect_to_backfill() -> None:
    clock = Clock()
    c = cluster(gpus={"A100": 8}, clock=clock)
    submit(c, "running", 4, "4")
    clock.now = at(1)
    submit(c, "head", 8, "2")
    assert c.expected_wait_hours("A100", 2, at(1)) == 5.0  # unknown length: behind the head
    assert c.expected_wait_hours("A100", 2, at(1), work_hours=1.0) == 0.0  # ends before the head's reservation
    assert c.expected_wait_hours("A100", 2, at(1), work_hours=4.0) == 5.0
    assert c.expected_wait_hours("A100", 8, at(1), work_hours=1.0) == 5.0


def test_jobs_older_than_the_history_still_answer() -> None:
    clock = Clock()
    c = cluster(background=6.0, clock=clock, history_hours=24)
    old = submit(c, "old", 1, "1")
    clock.now = at(24 * 5)
    view = c.get(old)
    assert view.state is InstanceState.SUCCEEDED and view.checkpointed_work_hours == 1
    assert [i.id for i in c.list_instances()] == [old]


def test_pressure_counts_free_running_and_pending_gpus() -> None:
    c = cluster(gpus={"A100": 16, "V100": 8})
    sizes = {submit(c, name, n, "3"): n for name, n in (("a", 8), ("b", 4), ("c", 8), ("d", 2))}
    states = {iid: c.get(iid).state for iid in sizes}
    used = sum(n for iid, n in sizes.items() if states[iid] is InstanceState.RUNNING)
    a100, v100 = c.pressure(T0)
    assert (a100.accelerator, a100.total_gpus, a100.free_gpus) == ("A100", 16, 2)
    assert a100.free_gpus + used == a100.total_gpus
    waiting = [n for iid, n in sizes.items() if states[iid] is InstanceState.PENDING]
    assert (a100.pending_jobs, a100.pending_gpus) == (len(waiting), sum(waiting)) == (1, 8)
    assert a100.expected_wait_hours == 0.0  # a 1-GPU job fits now
    assert (v100.free_gpus, v100.pending_jobs, v100.pending_gpus, v100.expected_wait_hours) == (8, 0, 0, 0.0)
    assert a100.observed_at == T0


def test_background_workload_is_deterministic_and_consistent() -> None:
    samples = []
    for h in range(0, 72, 2):
        for s in cluster(background=6.0).pressure(at(h)):
            assert 0 <= s.free_gpus <= s.total_gpus
            assert s.pending_gpus >= s.pending_jobs >= 0
            assert s.expected_wait_hours >= 0
            if s.free_gpus == s.total_gpus:
                assert s.pending_jobs == 0
            samples.append(s)
    assert any(s.pending_jobs > 0 for s in samples)  # the queue does get busy
    assert any(s.free_gpus > 0 for s in samples)
    same = [s for h in range(0, 72, 2) for s in cluster(background=6.0).pressure(at(h))]
    other = [s for h in range(0, 72, 2) for s in cluster(background=6.0, seed=6).pressure(at(h))]
    assert same == samples and other != samples


def test_cancel_frees_capacity_and_leaves_the_queue() -> None:
    clock = Clock()
    c = cluster(gpus={"A100": 8}, clock=clock)
    big = submit(c, "big", 8, "10")
    nxt = submit(c, "next", 8, "1")
    queued = submit(c, "queued", 8, "1")
    clock.now = at(1.5)
    assert c.pressure(clock.now)[0].pending_jobs == 2
    c.terminate(big)
    stopped = c.get(big)
    assert stopped.state is InstanceState.TERMINATED and stopped.ended_at == at(1.5)
    assert stopped.checkpointed_work_hours == Decimal("1.5")
    assert c.get(nxt).state is InstanceState.RUNNING and c.get(nxt).started_at == at(1.5)
    c.terminate(queued)
    gone = c.get(queued)
    assert gone.state is InstanceState.TERMINATED and gone.started_at is None
    assert gone.checkpointed_work_hours == 0
    assert c.pressure(clock.now)[0].pending_jobs == 0
    c.terminate(big)  # twice is fine
    c.terminate("job-unknown")  # unknown is fine
    assert c.get(big) == stopped


def test_launch_is_idempotent_and_checks_the_pool() -> None:
    store = InMemorySimStore()
    c = cluster(store=store)
    first = submit(c, "tok", 4, "1")
    assert submit(c, "tok", 4, "1") == first
    assert len(store.list("onprem")) == 1
    off = offering(c, 4)
    spec = JobSpec("a", "t", "p", "n", "i", ("x",), ("A100",), 4, Decimal(1))
    wrong = replace(off, accelerator="H100")
    with pytest.raises(InvalidRequest):
        c.launch(LaunchRequest(wrong, "tok-2", Tags("b1", "j", "p"), spec, Decimal(1)))


def test_get_unknown_raises_and_list_returns_only_ours() -> None:
    store = InMemorySimStore()
    ours, theirs = cluster(store=store, broker_id="b1"), cluster(store=store, broker_id="b2")
    with pytest.raises(NotFound):
        ours.get("job-nope")
    a = submit(ours, "a", 1, "1", broker_id="b1")
    b = submit(theirs, "b", 1, "1", broker_id="b2")
    assert [i.id for i in ours.list_instances()] == [a]
    assert [i.id for i in theirs.list_instances()] == [b]


def test_later_submissions_never_rewrite_a_started_job() -> None:
    clock = Clock()
    c = cluster(background=8.0, clock=clock)
    seen: dict[str, datetime] = {}
    ids: list[str] = []
    for step in range(60):
        clock.now = at(step * 0.4)
        if step % 4 == 0:
            ids.append(submit(c, f"t{step}", (1, 2, 4, 8)[step % 3], str(1 + step % 5)))
        if step == 30:
            c.terminate(ids[2])
        for iid in ids:
            view = c.get(iid)
            if view.started_at is not None:
                assert seen.setdefault(iid, view.started_at) == view.started_at
    clock.now = at(24 * 4)
    for iid in ids:
        view = c.get(iid)
        assert view.state in (InstanceState.SUCCEEDED, InstanceState.TERMINATED)
        if view.started_at is not None:
            assert seen.setdefault(iid, view.started_at) == view.started_at
    assert len(seen) >= len(ids) - 1
