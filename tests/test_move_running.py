"""The live loop moves running deadline jobs where the deadline policy moves them (broker/loop/move.py), at their
next checkpoint, as the simulator executes the same policy with `moves_at_checkpoints`.

Traces (tests/trace_replay.py): two spot zones of one region, on-demand at $3.00, 10-minute ticks, a changeover of
one tick per launch, a checkpoint every 3 ticks (30 min), no interruption notice. Each test replays a trace
through the real loop (`tick()`, database, ledger) and through `run_deadline`, and compares launches, ticks and
cost; then the step's own rules (no churn, the ceiling, a policy that waits) with a scripted policy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

import pytest
from sqlmodel import Session, select

from broker.loop import move as move_step
from broker.loop.move import move_deadline_jobs
from broker.loop.tick import STEPS, tick
from broker.runtime import Runtime
from broker.store.tables import JobEvent, Placement
from federation.simulate.deadline import DeadlineJob
from federation.simulate.market import TraceMarket
from federation.strategies import Plan, RunState, current_alive, keep, launch, wait
from pricing.book import PriceBook
from providers.model import CapacityType, Offering
from tests.builders import job_body
from tests.conftest import T0, MovableClock
from tests.scripted import admin_api, attach
from tests.trace_replay import (
    GAP,
    RESTART_TICKS,
    TraceCloud,
    replay,
    sim_launches,
    trace_runtime,
    two_zone_trace,
)

# 2 h of work due in 5 h: with no spot at the start the slack (3 h) does not cover waiting, so the job starts on
# on-demand; then zone a comes up and stays up
JOB = DeadlineJob("j", 0, work_ticks=12, deadline_ticks=30, restart_ticks=RESTART_TICKS, checkpoint_ticks=3)


def _kinds(rt: Runtime, job_id: str) -> list[str]:
    with Session(rt.engine) as s:
        return [e.kind for e in s.exec(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))]


def _brief(launches: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(tick, zone, capacity type) of each launch."""
    return [(t, k.split("/")[2], k.split("/")[4]) for t, k in launches]


@pytest.mark.parametrize(
    ("up_at", "moved_at", "redone"),
    [
        (5, 5, 1),  # zone a up at tick 5: 4 ticks of work done, 3 saved: moved at once, one tick redone
        (6, 7, 0),  # up at tick 6: 5 done, 3 saved: the move waits for the checkpoint at tick 7 (6 saved)
    ],
)
def test_a_job_on_on_demand_returns_to_spot_at_its_checkpoint_as_the_simulator_moves_it(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, up_at: int, moved_at: int, redone: int
) -> None:
    market = TraceMarket(two_zone_trace("0" * up_at + "1" * (45 - up_at), "0" * 45))
    expected, sim_cost = sim_launches(market, JOB, lost_ticks=redone, moves_at_checkpoints=True)
    assert _brief(expected) == [(0, "tr-1a", "on_demand"), (moved_at, "tr-1a", "spot")]
    rt = trace_runtime(make_runtime, db_url, JOB)
    live, done, ledger = replay(rt, market, JOB, clock)
    assert live == expected
    assert done is not None and done.state == "succeeded"
    assert float(ledger) == pytest.approx(sim_cost, abs=1e-6)
    kinds = _kinds(rt, done.id)
    assert kinds.count("moving") == 1
    assert kinds.count("move_planned") == (1 if moved_at > up_at else 0)  # said once, not on every tick


def test_without_the_move_step_the_job_stays_on_on_demand_and_costs_more(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """The same trace with `move_running_jobs` off: one launch, on-demand to the end, as the broker did before."""
    market = TraceMarket(two_zone_trace("0" * 6 + "1" * 39, "0" * 45))
    _, sim_cost = sim_launches(market, JOB, lost_ticks=0, moves_at_checkpoints=True)
    rt = make_runtime(
        db_url,
        simulated=False,
        restart_hours=RESTART_TICKS / 6,
        tick_interval_seconds=600,
        checkpoint_interval_hours=0.5,
        move_running_jobs=False,
    )
    live, done, ledger = replay(rt, market, JOB, clock)
    assert _brief(live) == [(0, "tr-1a", "on_demand")]
    assert done is not None and done.state == "succeeded"
    assert float(ledger) > sim_cost + 1.0


def test_a_job_on_spot_moves_to_a_clearly_cheaper_spot_pool_as_the_simulator_moves_it(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """Zone b ($2.00) up from the start takes the job; zone a ($1.00) comes up at tick 6: `overspill` migrates
    (cheaper by more than 10%, and the saving pays the changeover), at the checkpoint of tick 7."""
    market = TraceMarket(two_zone_trace("0" * 6 + "1" * 39, "1" * 45, prices=(1.0, 2.0)))
    expected, sim_cost = sim_launches(market, JOB, lost_ticks=0, moves_at_checkpoints=True)
    assert _brief(expected) == [(0, "tr-1b", "spot"), (7, "tr-1a", "spot")]
    rt = trace_runtime(make_runtime, db_url, JOB)
    live, done, ledger = replay(rt, market, JOB, clock)
    assert live == expected
    assert done is not None and done.state == "succeeded"
    assert float(ledger) == pytest.approx(sim_cost, abs=1e-6)


def _pool(book: PriceBook, zone: str, kind: CapacityType) -> Offering:
    return next(o for o in book if o.zone == zone and o.capacity_type is kind)


@dataclass(frozen=True)
class WaitsAfterTick5:
    """A scripted deadline policy: spot a, then off it to wait from tick 5 of the trace to tick 12, then spot a
    again (a stop the DP policies may choose; `overspill` never does)."""

    name: ClassVar[str] = "waits"

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        t = round((state.now - T0).total_seconds() / GAP)
        if 5 <= t < 12:
            return wait(self.name, "scripted: wait")
        if current_alive(state):
            return keep(state, self.name, "scripted: keep")
        return launch(state, self.name, _pool(book, "tr-1a", CapacityType.SPOT), "scripted: spot a")


def test_a_policy_that_waits_stops_the_job_at_its_checkpoint_and_places_it_later_as_the_simulator_does(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """Launched at tick 0; at tick 5 it has 4 ticks done and 3 saved: stopped at once, one tick redone (as the
    simulator's `moves_at_checkpoints` does); pending until tick 12, then placed on spot a again."""
    market = TraceMarket(two_zone_trace("1" * 45, "0" * 45))
    expected, sim_cost = sim_launches(market, JOB, WaitsAfterTick5(), lost_ticks=1, moves_at_checkpoints=True)
    assert _brief(expected) == [(0, "tr-1a", "spot"), (12, "tr-1a", "spot")]
    rt = trace_runtime(make_runtime, db_url, JOB)
    rt.deadline_policy = WaitsAfterTick5()
    live, done, ledger = replay(rt, market, JOB, clock)
    assert live == expected
    assert done is not None and done.state == "succeeded"
    assert float(ledger) == pytest.approx(sim_cost, abs=1e-6)
    with Session(rt.engine) as s:
        first = s.exec(select(Placement).where(Placement.job_id == done.id).order_by(Placement.created_at)).first()
    assert first is not None and first.state == "stopped"
    assert first.ended_at == T0 + timedelta(seconds=5 * GAP)


@dataclass(frozen=True)
class Flips:
    """A scripted policy that, asked about the job running on on-demand, moves it to spot a, and asked about it
    waiting, puts it on on-demand: stopping it would only relaunch it where it runs."""

    name: ClassVar[str] = "flips"
    then: CapacityType = CapacityType.ON_DEMAND

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        if current_alive(state):
            return launch(state, self.name, _pool(book, "tr-1a", CapacityType.SPOT), "scripted: to spot")
        return launch(state, self.name, _pool(book, "tr-1a", self.then), "scripted: where it runs")


def test_a_move_that_would_put_the_job_back_where_it_runs_is_not_made(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    market = TraceMarket(two_zone_trace("1" * 45, "0" * 45))
    rt = trace_runtime(make_runtime, db_url, JOB)
    rt.deadline_policy = Flips()
    live, done, _ = replay(rt, market, JOB, clock)
    assert _brief(live) == [(0, "tr-1a", "on_demand")]
    assert done is not None and done.state == "succeeded"
    assert "moving" not in _kinds(rt, done.id) and "move_planned" not in _kinds(rt, done.id)


def test_a_move_to_a_pool_over_the_jobs_hourly_cap_is_not_made(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """On spot a ($1.00/h) with `max_hourly_usd` 2: a policy moving it to on-demand ($3.00/h), running or stopped,
    is not followed (the placement model refuses that pool), so the job is not stopped for a launch that would be
    refused and leave it waiting."""
    market = TraceMarket(two_zone_trace("1" * 45, "0" * 45))
    rt = trace_runtime(make_runtime, db_url, JOB)

    @dataclass(frozen=True)
    class ToOnDemand:
        name: ClassVar[str] = "to_on_demand"

        def decide(self, state: RunState, book: PriceBook) -> Plan:
            if state.now == T0:
                return launch(state, self.name, _pool(book, "tr-1a", CapacityType.SPOT), "scripted: spot")
            return launch(state, self.name, _pool(book, "tr-1a", CapacityType.ON_DEMAND), "scripted: to od")

    rt.deadline_policy = ToOnDemand()
    live, done, _ = replay(rt, market, JOB, clock, max_hourly_usd="2")
    assert _brief(live) == [(0, "tr-1a", "spot")]
    assert done is not None and done.state == "succeeded"
    assert "moving" not in _kinds(rt, done.id)


@pytest.mark.integration
def test_two_replicas_deciding_the_same_move_at_once_move_the_job_once(
    postgres: object, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """Two brokers on one PostgreSQL and one cloud, both asking at the same moment about the job that is due to
    return to spot (the trace of the first test, tick 7): one stops it, the other finds it no longer running
    (row locks, `SKIP LOCKED`); then one new placement."""
    url = postgres.create_database()  # type: ignore[attr-defined]
    market = TraceMarket(two_zone_trace("0" * 6 + "1" * 39, "0" * 45))
    first = trace_runtime(make_runtime, url, JOB)
    cloud = TraceCloud(market, clock)
    attach(first, cloud)
    second = attach(trace_runtime(make_runtime, url, JOB), cloud)
    api = admin_api(first)
    deadline = (T0 + timedelta(seconds=GAP * JOB.deadline_ticks)).isoformat()
    body = job_body(accelerators=["V100"], work_gpu_hours="2", max_total_usd="100", deadline=deadline)
    for t in range(7):
        clock.now = T0 + timedelta(seconds=GAP * t)
        if t == 0:
            assert api.post("/v1/jobs", json=body).status_code == 202
        tick(first, clock())
    clock.now = T0 + timedelta(seconds=GAP * 7)
    before = STEPS[: [name for name, _ in STEPS].index("move_deadline_jobs")]
    tick(first, clock(), before)  # prices, sync (the instance's checkpoint at 6 ticks of work) ...
    gate = threading.Barrier(2)
    moved: list[int] = []

    def ask(rt: Runtime) -> None:
        gate.wait()
        moved.append(move_deadline_jobs(rt, clock()))

    threads = [threading.Thread(target=ask, args=(rt,)) for rt in (first, second)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert sorted(moved) == [0, 1]
    tick(first, clock(), [s for s in STEPS if s[0] == "place_pending"])
    with Session(first.engine) as s:
        placements = s.exec(select(Placement).order_by(Placement.created_at)).all()
        kinds = [e.kind for e in s.exec(select(JobEvent).order_by(JobEvent.id))]
    old, new = placements  # the on-demand one, stopped, and one on spot: not two
    assert (old.state, old.offering_key.split("/")[4]) == ("stopped", "on_demand")
    assert new.state in ("launching", "running") and new.offering_key.endswith("/spot")
    assert kinds.count("moving") == 1


def test_a_crash_between_the_terminate_and_the_commit_loses_nothing(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The move's transaction fails after the cloud terminated the instance (as a broker killed there would leave
    it: placement still running in the database, instance gone). The next tick's sync ends the placement and the
    job goes back to pending with its saved work; it is placed again and finishes once, its ledger whole."""
    market = TraceMarket(two_zone_trace("0" * 6 + "1" * 39, "0" * 45))
    rt = trace_runtime(make_runtime, db_url, JOB)
    real = move_step.add_event
    calls = {"n": 0}

    def dies_once(*args: object, **kwargs: object) -> None:
        if args[3] == "moving" and not calls["n"]:
            calls["n"] += 1
            raise RuntimeError("killed between the terminate and the commit")
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(move_step, "add_event", dies_once)
    live, done, ledger = replay(rt, market, JOB, clock)
    assert calls["n"] == 1
    assert done is not None and done.state == "succeeded"
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement).where(Placement.job_id == done.id).order_by(Placement.created_at)).all()
    assert [p.state for p in placements] == ["stopped", "succeeded"]  # one live placement at a time, no double
    assert placements[0].ended_at is not None and placements[0].ended_at <= placements[1].created_at
    assert _brief(live)[0] == (0, "tr-1a", "on_demand") and _brief(live)[1][1:] == ("tr-1a", "spot")
    assert ledger == sum(p.cost_usd for p in placements) and ledger > 0


def test_at_most_move_checks_per_tick_jobs_are_asked_about_per_tick_longest_unasked_first(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """Three running deadline jobs, one check per tick: each tick asks about the one asked longest ago (never
    asked first), so all three are asked within three ticks and none twice."""
    market = TraceMarket(two_zone_trace("1" * 45, "0" * 45))
    rt = make_runtime(db_url, simulated=False, restart_hours=1 / 6, move_checks_per_tick=1, move_check_seconds=0)
    attach(rt, TraceCloud(market, clock))
    api = admin_api(rt)
    deadline = (T0 + timedelta(hours=5)).isoformat()
    for i in range(3):
        body = job_body(name=f"j{i}", accelerators=["V100"], work_gpu_hours="2", max_total_usd="100", deadline=deadline)
        assert api.post("/v1/jobs", json=body).status_code == 202
    tick(rt, clock())  # placed, none asked yet
    asked: list[set[str]] = []
    for t in range(1, 4):
        clock.now = T0 + timedelta(seconds=GAP * t)
        before = dict(rt.move_checked)
        tick(rt, clock())
        asked.append({k for k, at in rt.move_checked.items() if before.get(k) != at})
    assert [len(a) for a in asked] == [1, 1, 1]
    assert len(set().union(*asked)) == 3
