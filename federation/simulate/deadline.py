"""Replay one deadline job on a spot trace through a preemption strategy, tick by tick, on a virtual clock.

The model is the one of "Can't Be Late" (NSDI'24) and its simulator, so the omniscient optimum
(`federation.simulate.optimum`) is a true lower bound of every policy here:
- time moves in ticks of the trace's `gap_seconds`; at each tick the strategy decides (through
  `federation.strategies.decide`, the same code the broker runs) and the decision holds for the tick;
- a spot pool whose zone is unavailable at a tick is reclaimed at that tick (recorded as a preemption);
- every launch (a new pool, or the same zone again after a reclaim) costs `restart_ticks` of changeover paid at
  the new pool's price without progress (launch, restore);
- with a checkpoint interval (`DeadlineJob.checkpoint_ticks`), a reclaim also loses the progress made since the
  last checkpoint, unless the cloud's interruption notice is long enough to save first (AWS 2 min, GCP and Azure
  30 s, `federation.strategies.NOTICE_SECONDS`, against the job's `save_seconds`); a move the policy chooses
  saves first; with no interval, progress is saved as it is made (the model of "Can't Be Late");
- with `moves_at_checkpoints`, a move the policy chooses for a running job (a migration, or a stop to wait) is
  executed as the broker's live loop executes it (`broker.loop.move`): only at a decision with at most one tick of
  progress since the job's last checkpoint, that tick's progress redone; at any other decision the job keeps
  running where it is;
- every tick on a pool is billed in full at its price; progress is one tick of work per tick past the changeover;
- the policy sees the tick's `PriceBook` and each spot pool's availability history up to the tick
  (`TraceMarket.outlook`), nothing later.
The executor never bills beyond what a plan allowed: `decide` pauses a job whose budget cannot pay the next tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from federation.simulate.market import TraceMarket
from federation.strategies import NOTICE_SECONDS, Move, Plan, PoolOutlook, Preemption, RunState, Strategy, decide
from providers.model import CapacityType, JobSpec, Offering


@dataclass(frozen=True, slots=True)
class DeadlineJob:
    """A job of `work_ticks` of work due `deadline_ticks` after `start_tick`, with a changeover of
    `restart_ticks` per launch, a checkpoint every `checkpoint_ticks` of progress (0: progress is saved as it is
    made, nothing is ever lost) and `save_seconds` to write one (an interruption notice at least that long lets
    the job save before the reclaim)."""

    name: str
    start_tick: int
    work_ticks: int
    deadline_ticks: int
    restart_ticks: int
    max_total_usd: Decimal = Decimal("1000000")
    checkpoint_ticks: int = 0
    save_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class DeadlineRun:
    """What one policy did with one job."""

    policy: str
    job: str
    cost_usd: float
    finished: bool
    met_deadline: bool
    finish_hours: float | None
    preemptions: int
    migrations: int
    launches: int
    spot_hours: float
    on_demand_hours: float
    idle_hours: float = 0.0
    lost_hours: float = 0.0
    paused: bool = False
    pause_reason: str = ""
    over_budget: bool = False
    moves: tuple[str, ...] = field(default=(), repr=False)
    costs: RunCosts | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class RunCosts:
    """Where a run's money and time went, for `federation.simulate.explain`. `spot_usd` + `on_demand_usd` is the
    run's whole cost; `changeover_usd` (launch and restore ticks, either kind) and `lost_usd` (spot ticks whose
    progress a reclaim later threw away) are parts of it. Hours: `on_demand_spot_up_hours` were billed on
    on-demand while some spot pool of the trace was up; `on_demand_forced_hours` were billed on on-demand with
    the slack below the safety margin (2 changeovers + the checkpoint interval when a reclaim loses work + one
    tick: no time left to wait for spot); `idle_spot_up_hours` were spent idle while some spot pool was up."""

    spot_usd: float = 0.0
    on_demand_usd: float = 0.0
    changeover_usd: float = 0.0
    lost_usd: float = 0.0
    on_demand_spot_up_hours: float = 0.0
    on_demand_forced_hours: float = 0.0
    idle_spot_up_hours: float = 0.0


def job_spec(market: TraceMarket, job: DeadlineJob) -> JobSpec:
    t = market.trace
    gap = Decimal(t.gap_seconds) / Decimal(3600)
    return JobSpec(
        tenant="sim",
        team="sim",
        project="deadline",
        name=job.name,
        image="sim",
        command=(),
        accelerators=(t.accelerator,),
        gpu_count=t.gpus,
        max_total_usd=job.max_total_usd,
        runtime_hours=gap * job.work_ticks,
        deadline_at=t.at(job.start_tick + job.deadline_ticks),
    )


def run_deadline(
    market: TraceMarket,
    job: DeadlineJob,
    strategy: Strategy,
    policy: str | None = None,
    overrun_ticks: int | None = None,
    record: bool = False,
    outlook: bool = True,
    notice_seconds: Mapping[str, float] = NOTICE_SECONDS,
    moves_at_checkpoints: bool = False,
) -> DeadlineRun:
    """Run `job` under `strategy`; a job not done by its deadline keeps going for `overrun_ticks` more (default:
    as long again as its deadline window, within the trace) so late finishes are still costed. With `outlook`
    False the policy is not shown the pools' availability history (`RunState.outlook`), as a broker without an
    availability feed. `notice_seconds` is each provider's spot interruption notice: a reclaim of a job with a
    checkpoint interval loses the work since its last checkpoint unless the notice covers `job.save_seconds`. A
    stop the policy chooses (a migration, or waiting) saves first and loses nothing; with `moves_at_checkpoints`
    it waits instead for a decision at most one tick past a checkpoint and redoes that tick (module docstring)."""
    trace = market.trace
    gap_h = trace.gap_hours
    gap = Decimal(trace.gap_seconds) / Decimal(3600)
    spec = job_spec(market, job)
    started = trace.at(job.start_tick)
    extra = job.deadline_ticks if overrun_ticks is None else overrun_ticks
    end = min(len(trace), job.start_tick + job.deadline_ticks + extra)
    remaining = job.work_ticks
    unsaved = lost = 0  # ticks of progress since the last checkpoint; ticks of progress lost to reclaims
    current: Offering | None = None
    restart_left = 0
    spent = Decimal(0)
    history: list[Preemption] = []
    checkpoint: tuple[str, str] | None = None
    preemptions = migrations = launches = 0
    spot_ticks = od_ticks = 0
    paused, reason = False, ""
    moves: list[str] = []
    acct = _Ledger()
    lost_risk = 0 if notice_seconds.get(trace.provider, 0.0) >= job.save_seconds else job.checkpoint_ticks
    margin = 2 * job.restart_ticks + lost_risk + 1
    tick = job.start_tick

    def outlook_at(at: datetime) -> Mapping[str, PoolOutlook]:
        """The pools' histories as of `at` (clamped to the trace; never later than the current tick)."""
        back = math.floor((at - trace.start_at).total_seconds() / trace.gap_seconds)
        return market.outlook(min(max(back, 0), tick)) if outlook else {}

    while remaining > 0 and tick < end:
        book = market.book(tick)
        now = trace.at(tick)
        if current is not None:
            live = book.get(current.key)
            if live is None or not live.available:
                preemptions += 1
                history.append(Preemption.of(current, now))
                if notice_seconds.get(current.provider, 0.0) < job.save_seconds:
                    remaining, lost = remaining + unsaved, lost + unsaved
                    acct.lost_usd += acct.unsaved_usd
                current, restart_left, unsaved = None, 0, 0
                acct.unsaved_usd = 0.0
            else:
                current = live
        state = RunState(
            job=spec,
            now=now,
            started_at=started,
            remaining_work_hours=gap * remaining,
            spent_usd=spent,
            current=current,
            restart_left_hours=restart_left * gap_h,
            checkpoint_at=checkpoint,
            preemptions=tuple(history),
            tick_hours=gap_h,
            outlook=market.outlook(tick) if outlook else {},
            checkpoint_interval_hours=job.checkpoint_ticks * gap_h,
            save_seconds=job.save_seconds,
            notice_seconds=notice_seconds,
            reclaims_at_decisions=True,  # a reclaim happens at a tick and is seen by that tick's decision
            unsaved_work_hours=unsaved * gap_h,
        )
        prepare = getattr(strategy, "prepare", None)
        if prepare is not None:  # a policy with shared tables solves them here, off the per-job path
            prepare(now, book, [state], outlook_at)
        plan = decide(strategy, state, book)
        if moves_at_checkpoints and current is not None and _stops(plan, current):
            if unsaved > 1:  # the live loop moves a running job at its next checkpoint: until then it runs on
                plan = Plan(Move.KEEP, plan.reason, plan.strategy, current)
            elif unsaved:  # one tick past its checkpoint: the move goes ahead and that tick is redone
                remaining, lost = remaining + unsaved, lost + unsaved
                acct.lost_usd += acct.unsaved_usd
        if record:
            moves.append(f"{tick - job.start_tick}:{plan.move.value}:{plan.offering.key if plan.offering else ''}")
        if plan.move is Move.PAUSE:
            paused, reason = True, plan.reason
            break
        if plan.move is Move.WAIT:
            current, restart_left, unsaved = None, 0, 0
            acct.unsaved_usd = 0.0
        elif plan.move is Move.LAUNCH and plan.offering is not None:
            unsaved = 0  # a chosen move saves first
            acct.unsaved_usd = 0.0
            if current is not None:
                migrations += 1
            current, restart_left = plan.offering, job.restart_ticks
            launches += 1
        spot_up = any(z.available[tick] for z in trace.zones)
        if current is not None:
            step = current.price.hourly_usd * gap
            spent += step
            checkpoint = (current.provider, current.region)
            on_spot = current.capacity_type is CapacityType.SPOT
            if on_spot:
                spot_ticks += 1
                acct.spot_usd += float(step)
            else:
                od_ticks += 1
                acct.on_demand_usd += float(step)
                acct.od_spot_up += spot_up
                slack = job.deadline_ticks - (tick - job.start_tick) - remaining - restart_left
                acct.od_forced += slack < margin
            if restart_left > 0:
                restart_left -= 1
                acct.changeover_usd += float(step)
            else:
                remaining -= 1
                unsaved = (unsaved + 1) % job.checkpoint_ticks if job.checkpoint_ticks else 0
                acct.unsaved_usd = acct.unsaved_usd + float(step) if unsaved else 0.0
        else:
            acct.idle_spot_up += spot_up
        tick += 1
    finished = remaining == 0
    elapsed = tick - job.start_tick
    return DeadlineRun(
        policy=policy or strategy.name,
        job=job.name,
        cost_usd=float(spent),
        finished=finished,
        met_deadline=finished and elapsed <= job.deadline_ticks,
        finish_hours=elapsed * gap_h if finished else None,
        preemptions=preemptions,
        migrations=migrations,
        launches=launches,
        spot_hours=spot_ticks * gap_h,
        on_demand_hours=od_ticks * gap_h,
        idle_hours=(elapsed - spot_ticks - od_ticks) * gap_h,
        lost_hours=lost * gap_h,
        paused=paused,
        pause_reason=reason,
        over_budget=spent > job.max_total_usd,
        moves=tuple(moves),
        costs=RunCosts(
            spot_usd=acct.spot_usd,
            on_demand_usd=acct.on_demand_usd,
            changeover_usd=acct.changeover_usd,
            lost_usd=acct.lost_usd,
            on_demand_spot_up_hours=acct.od_spot_up * gap_h,
            on_demand_forced_hours=acct.od_forced * gap_h,
            idle_spot_up_hours=acct.idle_spot_up * gap_h,
        ),
    )


def _stops(plan: Plan, current: Offering) -> bool:
    """Whether `plan` ends the run on `current`: a wait, or a launch of another pool."""
    if plan.move is Move.WAIT:
        return True
    return plan.move is Move.LAUNCH and plan.offering is not None and plan.offering.key != current.key


@dataclass(slots=True)
class _Ledger:
    """`run_deadline`'s running tallies behind `RunCosts` (ticks for the hour counts)."""

    spot_usd: float = 0.0
    on_demand_usd: float = 0.0
    changeover_usd: float = 0.0
    lost_usd: float = 0.0
    unsaved_usd: float = 0.0  # cost of the ticks since the last checkpoint (lost to a reclaim, or to a live move)
    od_spot_up: int = 0
    od_forced: int = 0
    idle_spot_up: int = 0
