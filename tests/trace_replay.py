"""Replaying a spot trace through the broker's real loop: a cloud that serves the simulator's own market, and the
helpers that run one job through the simulator (`run_deadline`) and through `tick()` on that cloud, for tests that
compare the two (tests/test_live_replay.py, tests/test_move_running.py).

`TraceCloud` lists, at each tick of the clock, exactly the pools `TraceMarket.book(tick)` holds (same prices,
availability and interruption rates), reclaims a running spot instance at the first tick its zone is down, and
does one tick of work per tick held after a changeover of `RESTART_TICKS`, as the simulator does; its instances
report the work saved at each checkpoint.
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
from broker.store.tables import CostEntryRow, Job, Placement
from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.market import TraceMarket
from federation.simulate.traces import SpotTrace, ZoneSeries
from federation.strategies import Strategy, deadline_strategy
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


def two_zone_trace(
    a: str = "1111100000" + "0000011111" + "1" * 30,
    b: str = "1" * 10 + "0" * 40,
    prices: tuple[float, float] = (1.0, 1.4),
) -> SpotTrace:
    """Two spot zones of one region (by default $1.00 and $1.40 per hour) and on-demand at $3.00, 10-minute
    ticks; `a` and `b` say, tick by tick, whether each zone is up."""
    zones = (
        ZoneSeries("tr-1a", "tr-1", tuple(c == "1" for c in a), (prices[0],) * len(a)),
        ZoneSeries("tr-1b", "tr-1", tuple(c == "1" for c in b), (prices[1],) * len(b)),
    )
    return SpotTrace(T0, GAP, zones, {"tr-1": 3.0}, provider="trace", instance_type="v.1", accelerator="V100")


def sim_launches(
    market: TraceMarket,
    job: DeadlineJob,
    policy: Strategy | None = None,
    lost_ticks: int = 2,
    moves_at_checkpoints: bool = False,
) -> tuple[list[tuple[int, str]], float]:
    """The simulator's launches (tick since the job's start, pool key) and cost; `lost_ticks` unsaved ticks lost
    (the default trace: each of its two reclaims loses one). `moves_at_checkpoints`: a running job's moves
    executed as the live loop executes them (`run_deadline`)."""
    # the trace's cloud gives no interruption notice, as the live provider below (its agent watches none)
    policy = policy or deadline_strategy(RESTART_TICKS * GAP / 3600)
    run = run_deadline(market, job, policy, record=True, notice_seconds={}, moves_at_checkpoints=moves_at_checkpoints)
    assert run.met_deadline and run.lost_hours == pytest.approx(lost_ticks * GAP / 3600)
    launches = []
    for move in run.moves:
        at, what, key = move.split(":", 2)
        if what == "launch":
            launches.append((int(at), key))
    return launches, run.cost_usd


def trace_runtime(make_runtime: Callable[..., Runtime], db_url: str, job: DeadlineJob) -> Runtime:
    """A broker ticking every `GAP` seconds with the simulator's changeover and checkpoint interval."""
    return make_runtime(
        db_url,
        simulated=False,
        restart_hours=RESTART_TICKS * GAP / 3600,
        tick_interval_seconds=GAP,
        checkpoint_interval_hours=job.checkpoint_ticks * GAP / 3600,
    )


def replay(
    rt: Runtime, market: TraceMarket, job: DeadlineJob, clock: MovableClock, **fields: str
) -> tuple[list[tuple[int, str]], Job | None, Decimal]:
    """Tick the live loop over the trace from its start, submit `job` at its start tick (`fields`: more of the
    submission's fields, e.g. `max_hourly_usd`), run to its deadline: the placements (tick since the job's start,
    pool key), the job, its ledger total."""
    cloud = TraceCloud(market, clock)
    attach(rt, cloud)
    api = admin_api(rt)
    start = T0 + timedelta(seconds=GAP * job.start_tick)
    deadline = start + timedelta(seconds=GAP * job.deadline_ticks)
    work = str(Decimal(job.work_ticks * GAP) / 3600)
    job_id = ""
    for t in range(job.start_tick + job.deadline_ticks + 1):
        clock.now = T0 + timedelta(seconds=GAP * t)
        if t == job.start_tick:
            body = job_body(
                accelerators=["V100"], work_gpu_hours=work, max_total_usd="100", deadline=deadline.isoformat(), **fields
            )
            made = api.post("/v1/jobs", json=body)
            assert made.status_code == 202, made.text
            job_id = made.json()["id"]
        tick(rt, clock())
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.created_at)).all()
        live = [(round((p.created_at - start).total_seconds() / GAP), p.offering_key) for p in placements]
        done = s.get(Job, job_id)
        ledger = sum((e.usd for e in s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id))), Decimal(0))
    return live, done, ledger
