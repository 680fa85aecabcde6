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
from federation.chain_dp import ChainDP
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


def _trace(a: str = "1111100000" + "0000011111" + "1" * 30, b: str = "1" * 10 + "0" * 40) -> SpotTrace:
    """Two spot zones of one region ($1.00 and $1.40 per hour) and on-demand at $3.00, 10-minute ticks."""
    zones = (
        ZoneSeries("tr-1a", "tr-1", tuple(c == "1" for c in a), (1.0,) * len(a)),
        ZoneSeries("tr-1b", "tr-1", tuple(c == "1" for c in b), (1.4,) * len(b)),
    )
    return SpotTrace(T0, GAP, zones, {"tr-1": 3.0}, provider="trace", instance_type="v.1", accelerator="V100")


def _sim_launches(
    market: TraceMarket, job: DeadlineJob, policy: Strategy | None = None, lost_ticks: int = 2
) -> tuple[list[tuple[int, str]], float]:
    """The simulator's launches (tick since the job's start, pool key) and cost; `lost_ticks` unsaved ticks lost
    to reclaims (the default trace: each of its two reclaims loses one)."""
    # the trace's cloud gives no interruption notice, as the live provider below (its agent watches none)
    policy = policy or deadline_strategy(RESTART_TICKS * GAP / 3600)
    run = run_deadline(market, job, policy, record=True, notice_seconds={})
    assert run.met_deadline and run.lost_hours == pytest.approx(lost_ticks * GAP / 3600)
    launches = []
    for move in run.moves:
        at, what, key = move.split(":", 2)
        if what == "launch":
            launches.append((int(at), key))
    return launches, run.cost_usd


def _runtime(make_runtime: Callable[..., Runtime], db_url: str, job: DeadlineJob) -> Runtime:
    """A broker ticking every `GAP` seconds with the simulator's changeover and checkpoint interval."""
    return make_runtime(
        db_url,
        simulated=False,
        restart_hours=RESTART_TICKS * GAP / 3600,
        tick_interval_seconds=GAP,
        checkpoint_interval_hours=job.checkpoint_ticks * GAP / 3600,
    )


def _replay(
    rt: Runtime, market: TraceMarket, job: DeadlineJob, clock: MovableClock
) -> tuple[list[tuple[int, str]], Job | None, Decimal]:
    """Tick the live loop over the trace from its start, submit `job` at its start tick, run to its deadline:
    the placements (tick since the job's start, pool key), the job, its ledger total."""
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
                accelerators=["V100"], work_gpu_hours=work, max_total_usd="100", deadline=deadline.isoformat()
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
    live, done, ledger = _replay(_runtime(make_runtime, db_url, job), market, job, clock)
    assert live == expected
    assert done is not None and done.state == "succeeded" and done.finished_at is not None
    assert done.finished_at <= T0 + timedelta(seconds=GAP * job.deadline_ticks)
    assert float(ledger) == pytest.approx(sim_cost, abs=1e-6)  # the ledger keeps 10 decimals


# Six hours of history, then a job: 12 ticks of work due in 48, a checkpoint every 2. On this trace the joint-chain
# DP waits for the pattern of outages it learnt and pays less than `overspill`, which launches at once, is
# reclaimed four times and loses more work.
HISTORY_A = "111111110001111110001111101111110000" + "010011111000001111111001111111000011111110000011110000111110"
HISTORY_B = "111111000111110000111000001000111000" + "001110001111111100011000001111111100001111001111100000100001"


def _chain_dp() -> ChainDP:
    """The joint-chain DP with a short memory for a short trace: refitted every 2 h on at least 2 h of history,
    planning also without a usable notice (this cloud gives none), in units of one 10-minute tick."""
    return ChainDP(
        restart_hours=RESTART_TICKS * GAP / 3600,
        min_history_hours=2.0,
        refit_hours=2.0,
        with_loss=True,
        min_unit_hours=0.0,
    )


def test_the_live_loop_runs_the_joint_chain_dp_with_the_simulators_decisions(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """`chain_dp` fits its chain on the pools' dated histories: in the simulator the trace's, in the live loop the
    broker's own `availability_change` rows, recorded as the loop ticked through the same six hours. Both must
    take the same decisions - spot tr-1a at job ticks 4, 14 and 26, waiting out the outages between - not what
    `overspill` does on the same trace (five spot launches from tick 1), and bill the same. (With a checkpoint
    every 3 ticks the DP also tries tr-1a at tick 1, is reclaimed, and relaunches it within the live loop's
    30-minute reclaim blocklist: the known difference of the module docstring.)"""
    market = TraceMarket(_trace(HISTORY_A, HISTORY_B))
    job = DeadlineJob("j", 36, work_ticks=12, deadline_ticks=48, restart_ticks=RESTART_TICKS, checkpoint_ticks=2)
    greedy, greedy_cost = _sim_launches(market, job, lost_ticks=1)
    policy = _chain_dp()
    expected, sim_cost = _sim_launches(market, job, policy, lost_ticks=0)
    assert policy.stats.get("prepare_solves", 0) > 0  # the DP decided, not only its fallback
    assert [(t, k.split("/")[2], k.split("/")[4]) for t, k in expected] == [
        (4, "tr-1a", "spot"),
        (14, "tr-1a", "spot"),
        (26, "tr-1a", "spot"),
    ]
    assert len(greedy) == 5 and sim_cost < greedy_cost

    rt = _runtime(make_runtime, db_url, job)
    rt.deadline_policy = _chain_dp()
    live, done, ledger = _replay(rt, market, job, clock)
    assert live == expected
    assert done is not None and done.state == "succeeded"
    assert float(ledger) == pytest.approx(sim_cost, abs=1e-6)
