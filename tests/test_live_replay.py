"""The live loop and the simulator run one deadline policy: a short spot trace replayed through `tick()` (the
broker's real loop, database and ledger) on a cloud that serves the simulator's own market makes the same
launches, at the same ticks, on the same pools, for the same cost, as `run_deadline` on that trace.

The cloud (`TraceCloud`) lists, at each tick of the clock, exactly the pools `TraceMarket.book(tick)` holds (same
prices, availability and interruption rates), reclaims a running spot instance at the first tick its zone is
down, and does one tick of work per tick held after a changeover of `restart_ticks`, as the simulator does.
Known difference, outside this trace: the live loop asks the policy only for a job waiting to be placed, while
the simulator also asks it for a running job (a migration back from on-demand to spot); this trace's decisions
are all made while the job waits, and the zones stay down longer than the broker's 30-minute reclaim blocklist.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from sqlmodel import Session, select

from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.tables import CostEntryRow, Job, Placement
from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.market import TraceMarket
from federation.simulate.traces import SpotTrace, ZoneSeries
from federation.strategies import deadline_strategy
from providers.base import Instance, InstanceState
from providers.model import Offering, hours_between
from tests.builders import job_body
from tests.conftest import T0, MovableClock
from tests.scripted import ScriptedCloud, _Vm, admin_api, attach

GAP = 600  # seconds per tick: the broker's tick interval in these tests
RESTART_TICKS = 1


class TraceCloud(ScriptedCloud):
    """A provider whose market is a `TraceMarket`: the pools of the trace's tick for the clock's time."""

    def __init__(self, market: TraceMarket, clock: Callable[[], datetime]) -> None:
        super().__init__(market.trace.provider, clock)
        self.market = market

    def _tick(self, at: datetime) -> int:
        return int((at - self.market.trace.start_at).total_seconds() // GAP)

    def offerings(self, now: datetime) -> list[Offering]:
        return list(self.market.book(self._tick(now)))

    def _progress(self, vm: _Vm, end: datetime) -> Decimal:
        assert vm.instance.started_at is not None
        held = Decimal(str(round(hours_between(vm.instance.started_at, end) * 3600 / GAP))) * GAP / 3600
        done = min(vm.work_hours, max(Decimal(0), held - Decimal(RESTART_TICKS * GAP) / 3600))
        return done if done == vm.work_hours else done // vm.interval * vm.interval  # saved at checkpoints

    def get(self, instance_id: str) -> Instance:
        vm = self.vms[instance_id]
        inst = vm.instance
        if inst.state is not InstanceState.RUNNING:
            return inst
        assert inst.started_at is not None
        now = self.clock()
        done_at = inst.started_at + timedelta(seconds=GAP * RESTART_TICKS, hours=float(vm.work_hours))
        if now >= done_at:
            vm.instance = replace(
                inst, state=InstanceState.SUCCEEDED, ended_at=done_at, checkpointed_work_hours=vm.work_hours
            )
        elif inst.offering_key.endswith("/spot") and not self._zone_up(inst.offering_key, now):
            self.preempt(instance_id)
        else:
            vm.instance = replace(inst, checkpointed_work_hours=self._progress(vm, now))
        return vm.instance

    def _zone_up(self, key: str, now: datetime) -> bool:
        zone = next(z for z in self.market.trace.zones if z.zone == key.split("/")[2])
        return zone.available[self._tick(now)]


def _trace() -> SpotTrace:
    """Two spot zones of one region ($1.00 and $1.40 per hour) and on-demand at $3.00, 10-minute ticks."""
    a = "1111100000" + "0000011111" + "1" * 30
    b = "1111111111" + "0000000000" + "0" * 30
    zones = (
        ZoneSeries("tr-1a", "tr-1", tuple(c == "1" for c in a), (1.0,) * len(a)),
        ZoneSeries("tr-1b", "tr-1", tuple(c == "1" for c in b), (1.4,) * len(b)),
    )
    return SpotTrace(T0, GAP, zones, {"tr-1": 3.0}, provider="trace", instance_type="v.1", accelerator="V100")


def _sim_launches(market: TraceMarket, job: DeadlineJob) -> tuple[list[tuple[int, str]], float]:
    """The simulator's launches (tick, pool key) and cost; each of the two reclaims loses one unsaved tick."""
    # the trace's cloud gives no interruption notice, as the live provider below (its agent watches none)
    run = run_deadline(market, job, deadline_strategy(RESTART_TICKS * GAP / 3600), record=True, notice_seconds={})
    assert run.met_deadline and run.lost_hours == pytest.approx(2 * GAP / 3600)
    launches = []
    for move in run.moves:
        at, what, key = move.split(":", 2)
        if what == "launch":
            launches.append((int(at), key))
    return launches, run.cost_usd


def test_the_live_loop_replays_a_trace_with_the_simulators_decisions(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """2 h of work due in 6 h 40 min, a checkpoint every 30 min, no interruption notice. Simulator: t=0 both
    zones up -> the cheaper tr-1a; reclaimed at t=5 (4 ticks of work done, 3 saved) -> tr-1b; reclaimed at t=10
    -> no spot, slack covers the reserve: wait; tr-1a back at t=15 -> launch it. The live loop must launch the
    same pools at the same ticks, lose the same work, and bill the same."""
    market = TraceMarket(_trace())
    job = DeadlineJob("j", 0, work_ticks=12, deadline_ticks=40, restart_ticks=RESTART_TICKS, checkpoint_ticks=3)
    expected, sim_cost = _sim_launches(market, job)
    assert [(t, k.split("/")[2]) for t, k in expected] == [(0, "tr-1a"), (5, "tr-1b"), (15, "tr-1a")]

    assert clock() == T0
    rt = make_runtime(
        db_url,
        simulated=False,
        restart_hours=RESTART_TICKS * GAP / 3600,
        tick_interval_seconds=GAP,
        checkpoint_interval_hours=job.checkpoint_ticks * GAP / 3600,
    )
    cloud = TraceCloud(market, clock)
    attach(rt, cloud)
    api = admin_api(rt)
    deadline = T0 + timedelta(seconds=GAP * job.deadline_ticks)
    body = job_body(accelerators=["V100"], work_gpu_hours="2", max_total_usd="100", deadline=deadline.isoformat())
    job_id = api.post("/v1/jobs", json=body).json()["id"]
    for t in range(job.deadline_ticks + 1):
        clock.now = T0 + timedelta(seconds=GAP * t)
        tick(rt, clock())
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.created_at)).all()
        live = [(round((p.created_at - T0).total_seconds() / GAP), p.offering_key) for p in placements]
        done = s.get(Job, job_id)
        ledger = sum((e.usd for e in s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id))), Decimal(0))
    assert live == expected
    assert done is not None and done.state == "succeeded" and done.finished_at is not None
    assert done.finished_at <= deadline
    assert float(ledger) == pytest.approx(sim_cost, abs=1e-6)  # the ledger keeps 10 decimals
