"""Preemption strategies: what a job does next after a reclaim, a price change or a deadline squeeze.

Role: given a job's `RunState` (remaining work, deadline, spend against `max_total_usd`, the pool it runs on,
where its checkpoint is, its preemption history) and the current `PriceBook`, a strategy returns a `Plan`: a
value saying launch on a pool, keep the current one, wait idle, or pause, with its reason. An executor (the
broker's tick, the trace simulator) carries the plan out. A strategy never calls a cloud and never reads a clock.

Contract:
- `decide(strategy, state, book)` is the entry point. It enforces the HARD RULE for every strategy: total spend
  across attempts never exceeds `max_total_usd`. When the budget left cannot finish the remaining work even at the
  cheapest pool that fits the job, or cannot pay the next decision interval on the chosen pool, the plan is
  `Pause` with the numbers in its reason. Executors bill at most `price x tick_hours` before the next decision.
- Strategies are named (`STRATEGIES`, `make_strategy`) and stateless: everything they know is in the state, so a
  decision is a pure function and replays identically in the simulator.
- Hours are floats inside decisions (scoring); money stays Decimal.

Strategies:
- `on_demand`: always the cheapest on-demand pool.
- `eager_next_region`: SkyPilot managed jobs' default recovery (EAGER_NEXT_REGION), spot only. Example with
  regions R1 < R2 < R3 in price order: R1z1 (preempted) -> R2 (cheapest spot outside R1) -> ... if nothing
  outside R1 has capacity, the cheapest spot anywhere, R1z2 or even R1z1; if nothing at all, retry next tick.
  It ignores deadlines, remaining work and egress, as SkyPilot does.
- `next_cheapest`: our failover without a deadline. Example: running in aws/us-east-1/a, checkpoint in
  us-east-1; a is reclaimed -> zone a is blocklisted for `block_hours`; candidates are ranked by the placement
  cost model (price x remaining work x interruption overhead + checkpoint egress); us-east-1/b wins over a
  slightly cheaper us-west-2/a because its cost is within `same_region_slack` of the best and the checkpoint is
  local (same region first); if only pools elsewhere fit, the cheapest elsewhere; if no pool fits the budget,
  Pause.
- `uniform_progress`: "Can't Be Late" (NSDI'24), as in its simulator's `rc_cr_threshold` policy. The expected
  progress line is ep(t) = t x C0 / R0. Example (C0 = 4 h of work due in R0 = 12 h, d = 1 h changeover, 1 h
  ticks, one zone with spot up at t = 0..2 and from t = 9): t=0 launches spot (changeover), t=1..2 make 2 h;
  reclaimed at t=3 with cp = 2 >= ep(3) = 1: wait; at t=6 cp = 2 = ep(6): still wait; at t=7 cp = 2 < ep(7) =
  2.33, behind the line: on-demand. Spot is back at t=9, but hysteresis keeps on-demand while
  cp < ep(t + 2d) (3 < 3.67), so the job finishes on on-demand at t=10. Safety net: idle or on-demand with
  C + 2d >= time left -> on-demand to the end; on a running spot with C + d >= time left it keeps the spot.
- `greedy_safety_net`: greedy spot that commits to on-demand once the slack is gone (see `GreedySafetyNet`).
- `overspill`: ours (see `Overspill`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from federation.placement import (
    Candidate,
    PlacementContext,
    PlacementParams,
    blocked,
    ever_feasible,
    judge,
    quote,
)
from pricing.book import PriceBook
from providers.model import ZERO_USD, CapacityType, JobSpec, Offering

EPS = 1e-9
NOTICE_SECONDS: Mapping[str, float] = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}  # spot interruption notice
NON_SPOT = frozenset({CapacityType.ON_DEMAND, CapacityType.RESERVED})
CLOUD_ANY = frozenset({CapacityType.SPOT, CapacityType.ON_DEMAND, CapacityType.RESERVED})
ANY_POOL = CLOUD_ANY | {CapacityType.ON_PREM}


class Move(StrEnum):
    LAUNCH = "launch"  # start on `offering` (from idle, or migrating off the current pool)
    KEEP = "keep"  # stay on the current pool
    WAIT = "wait"  # stay idle until the next decision
    PAUSE = "pause"  # stop: the budget cannot finish the job (or no pool can ever run it)


@dataclass(frozen=True, slots=True)
class Preemption:
    """One reclaim the job suffered."""

    at: datetime
    provider: str
    region: str
    zone: str

    @classmethod
    def of(cls, off: Offering, at: datetime) -> Preemption:
        return cls(at, off.provider, off.region, off.zone)

    @property
    def zone_key(self) -> str:
        return f"{self.provider}/{self.region}/{self.zone}"

    @property
    def region_key(self) -> str:
        return f"{self.provider}/{self.region}"


@dataclass(frozen=True, slots=True)
class RunLengths:
    """Lengths (hours) of a pool's completed up (or down) runs, sorted, with suffix sums so the mean residual
    life is one bisection."""

    hours: tuple[float, ...] = ()
    suffix: tuple[float, ...] = (0.0,)

    @classmethod
    def of(cls, values: Iterable[float]) -> RunLengths:
        hours = tuple(sorted(values))
        suffix = [0.0] * (len(hours) + 1)
        for i in range(len(hours) - 1, -1, -1):
            suffix[i] = suffix[i + 1] + hours[i]
        return cls(hours, tuple(suffix))

    def mean_residual(self, age_hours: float, min_samples: int = 1) -> float | None:
        """Mean of (length - age) over the runs longer than `age_hours`: how much longer a run that has lasted
        `age_hours` went on, on average. None with fewer than `min_samples` such runs."""
        i = bisect_right(self.hours, age_hours + EPS)
        n = len(self.hours) - i
        if n < max(1, min_samples):
            return None
        return (self.suffix[i]) / n - age_hours


@dataclass(frozen=True, slots=True)
class Timeline:
    """When a pool's availability changed, in order, so that pools' histories can be lined up in time (a joint
    model needs which pools were up together, not only each one's run lengths). From `origin` (where the history
    starts) the pool is `first_up`; it flips at `origin + flips[i]` seconds (increasing; up to now, never later)."""

    origin: datetime
    first_up: bool
    flips: tuple[float, ...] = ()

    @classmethod
    def of(cls, changes: Iterable[tuple[datetime, bool]]) -> Timeline | None:
        """The timeline of `(at, up)` observations in time order (repeats of a state are no change); None when
        there are none."""
        it = iter(changes)
        first = next(it, None)
        if first is None:
            return None
        origin, state = first
        flips: list[float] = []
        for at, up in it:
            if up != state:
                flips.append((at - origin).total_seconds())
                state = up
        return cls(origin, first[1], tuple(flips))


@dataclass(frozen=True, slots=True)
class PoolOutlook:
    """What a spot pool's availability history says up to now (never the future): whether it is up, how long it
    has been in that state, and the lengths of its past up and down runs (from the broker's availability feed,
    or the trace replayed so far); `timeline`, when the executor has it, says when each change happened."""

    up: bool
    age_hours: float
    up_runs: RunLengths = field(default_factory=RunLengths)
    down_runs: RunLengths = field(default_factory=RunLengths)
    timeline: Timeline | None = None


@dataclass(frozen=True, slots=True)
class RunState:
    """Everything a strategy may use. `current` is the pool running the job now (None: idle, e.g. just
    preempted); `restart_left_hours` is the changeover still to go on it (launch, restore, lost work);
    `started_at` is when the job's deadline window opened (the origin of the uniform progress line);
    `tick_hours` is the time until the executor asks again; `outlook` is each spot pool's availability history
    by pool key (empty when the executor has none: strategies then go by interruption rates alone);
    `checkpoint_interval_hours`, `save_seconds` and `notice_seconds` say what a reclaim costs in lost work
    (`reclaim_loss_hours`), and `unsaved_work_hours` how much of it the running job would lose now (its progress
    since its last checkpoint on `current`: counted by the simulator, estimated from the instance by the live
    loop's move step, `broker.loop.move`; 0 when idle); `reclaims_at_decisions` says the executor reclaims only at
    its decision points, where progress and checkpoints also fall (the trace simulator), rather than at any time
    (the live loop)."""

    job: JobSpec
    now: datetime
    started_at: datetime
    remaining_work_hours: Decimal
    spent_usd: Decimal = ZERO_USD
    current: Offering | None = None
    restart_left_hours: float = 0.0
    checkpoint_at: tuple[str, str] | None = None
    preemptions: tuple[Preemption, ...] = ()
    tick_hours: float = 0.1
    outlook: Mapping[str, PoolOutlook] = field(default_factory=dict)
    checkpoint_interval_hours: float = 0.0
    save_seconds: float = 60.0
    notice_seconds: Mapping[str, float] = field(default_factory=dict)
    reclaims_at_decisions: bool = False
    unsaved_work_hours: float = 0.0

    def spot_margin_hours(self, restart_hours: float, loss_hours: float) -> float:
        """The slack a spot launch needs so that a reclaim at the worst moment still meets the deadline on a safe
        pool: two changeovers (there and on to the safe pool, each in whole decision intervals), the work the
        reclaim can lose (`loss_hours`, a checkpoint interval or 0) and the time until the reclaim is seen. Live, a
        reclaim between two ticks is seen at the next one and can lose all of `loss_hours`: one interval more. An
        executor that reclaims only at decision points (`reclaims_at_decisions`) sees it at once, and the work since
        the last checkpoint is then at most `loss_hours` less one interval."""
        changeovers = 2 * self.ticks(restart_hours)
        lost = self.ticks(loss_hours)
        if self.reclaims_at_decisions:
            return changeovers + max(0.0, lost - self.tick_hours)
        return changeovers + lost + self.tick_hours

    def reclaim_loss_hours(self, off: Offering) -> float:
        """The most work a reclaim of `off` can cost: the work since the last checkpoint (up to
        `checkpoint_interval_hours`) unless its cloud's interruption notice (`notice_seconds` by provider) gives
        the job the `save_seconds` it needs to save first. 0 for non-spot pools and with an interval of 0 (work
        saved continuously, the model before checkpoints were costed)."""
        return self.spot_loss_hours(off.provider) if off.capacity_type is CapacityType.SPOT else 0.0

    def spot_loss_hours(self, provider: str) -> float:
        """`reclaim_loss_hours` of any spot pool of `provider`."""
        if self.checkpoint_interval_hours <= 0 or self.notice_seconds.get(provider, 0.0) >= self.save_seconds:
            return 0.0
        return self.checkpoint_interval_hours

    @property
    def budget_left_usd(self) -> Decimal:
        return self.job.max_total_usd - self.spent_usd

    @property
    def work(self) -> float:
        return float(self.remaining_work_hours)

    def hours_to_deadline(self) -> float | None:
        """Hours left before the deadline, floored to whole decision intervals (None without a deadline)."""
        if self.job.deadline_at is None:
            return None
        left = (self.job.deadline_at - self.now).total_seconds() / 3600
        return math.floor(left / self.tick_hours + EPS) * self.tick_hours

    def ticks(self, hours: float) -> float:
        """`hours` rounded up to whole decision intervals."""
        return math.ceil(hours / self.tick_hours - EPS) * self.tick_hours

    def on(self, kinds: Iterable[CapacityType]) -> bool:
        return self.current is not None and self.current.capacity_type in frozenset(kinds)


@dataclass(frozen=True, slots=True)
class Plan:
    """A decision as a value. `offering` is the pool for LAUNCH and KEEP; `migrates` is True when a LAUNCH moves
    a job off a pool it is still running on (the executor moves it at its next checkpoint, so no work is lost);
    `blocklist` names the scopes this decision avoided."""

    move: Move
    reason: str
    strategy: str
    offering: Offering | None = None
    expected_cost_usd: Decimal | None = None
    migrates: bool = False
    blocklist: frozenset[str] = frozenset()


class Strategy(Protocol):
    name: ClassVar[str]

    def decide(self, state: RunState, book: PriceBook) -> Plan: ...


def pools(
    state: RunState, book: PriceBook, kinds: frozenset[CapacityType], blocklist: frozenset[str] = frozenset()
) -> list[Offering]:
    """Available pools of `kinds` that fit the job (shape, constraints, hourly ceiling), cheapest first."""
    job = state.job
    out = [
        item.offering
        for group in book.for_shape(job.accelerators, job.gpu_count)
        for item in group.items
        if _usable(job, item.offering, kinds, blocklist)
    ]
    out.sort(key=lambda o: (o.price.hourly_usd, o.key))
    return out


def first_pool(
    state: RunState, book: PriceBook, kinds: frozenset[CapacityType], blocklist: frozenset[str] = frozenset()
) -> Offering | None:
    """`pools(state, book, kinds, blocklist)[0]` (or None) without building the list: each group's items are in
    (price, key) order, so its first fitting item is its best, and the answer is the best of those."""
    job = state.job
    heads = [
        next((item.offering for item in group.items if _usable(job, item.offering, kinds, blocklist)), None)
        for group in book.for_shape(job.accelerators, job.gpu_count)
    ]
    return min((o for o in heads if o is not None), key=lambda o: (o.price.hourly_usd, o.key), default=None)


def _usable(job: JobSpec, off: Offering, kinds: frozenset[CapacityType], blocklist: frozenset[str]) -> bool:
    """`off` is available, of `kinds`, not blocked, within the job's hourly cap, and can ever run the job."""
    if off.capacity_type not in kinds or not off.available or blocked(off, blocklist):
        return False
    if job.max_hourly_usd is not None and off.price.hourly_usd > job.max_hourly_usd:
        return False
    return ever_feasible(job, (off,))


def recent_blocklist(state: RunState, hours: float, scope: str = "zone") -> frozenset[str]:
    """Zones (or regions) where the job was preempted within the last `hours`."""
    keys = set()
    for p in state.preemptions:
        if (state.now - p.at).total_seconds() < hours * 3600:
            keys.add(p.zone_key if scope == "zone" else p.region_key)
    return frozenset(keys)


def current_alive(state: RunState) -> bool:
    """True when the job runs on a pool that still has capacity (a reclaimed spot pool shows unavailable)."""
    return state.current is not None and state.current.available


def keep(state: RunState, name: str, reason: str) -> Plan:
    return Plan(Move.KEEP, reason, name, state.current)


def launch(state: RunState, name: str, off: Offering, reason: str, blocklist: frozenset[str] = frozenset()) -> Plan:
    if state.current is not None and state.current.key == off.key and current_alive(state):
        return keep(state, name, reason)
    return Plan(Move.LAUNCH, reason, name, off, migrates=current_alive(state), blocklist=blocklist)


def wait(name: str, reason: str) -> Plan:
    return Plan(Move.WAIT, reason, name)


@dataclass(frozen=True, slots=True)
class OnDemandOnly:
    """Always the cheapest on-demand (or reserved) pool; never spot."""

    name: ClassVar[str] = "on_demand"

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        if current_alive(state) and state.on(NON_SPOT):
            return keep(state, self.name, "on-demand until done")
        found = pools(state, book, NON_SPOT)
        if not found:
            return wait(self.name, "no on-demand pool available")
        return launch(state, self.name, found[0], f"cheapest on-demand pool at ${found[0].hourly_usd}/h")


@dataclass(frozen=True, slots=True)
class EagerNextRegion:
    """SkyPilot's EAGER_NEXT_REGION recovery for a `use_spot` managed job (see the module docstring)."""

    name: ClassVar[str] = "eager_next_region"

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        if current_alive(state):
            return keep(state, self.name, "cluster UP: keep it")
        kinds = frozenset({CapacityType.SPOT}) if state.job.preemptible else NON_SPOT
        last = state.preemptions[-1] if state.preemptions else None
        if last is not None and (state.now - last.at).total_seconds() < state.tick_hours * 3600:
            # Step 2: relaunch with the previously launched region blocked.
            block = frozenset({last.region_key})
            found = pools(state, book, kinds, block)
            if found:
                return launch(state, self.name, found[0], f"preempted in {last.region_key}: next region", block)
        # Step 3: relaunch anywhere (retried every tick until up).
        found = pools(state, book, kinds)
        if not found:
            return wait(self.name, "no spot capacity anywhere: retry")
        return launch(state, self.name, found[0], f"cheapest available pool at ${found[0].hourly_usd}/h")


@dataclass(frozen=True, slots=True)
class NextCheapest:
    """Failover by the placement cost model, preempted zones blocklisted, same region first (module docstring)."""

    name: ClassVar[str] = "next_cheapest"
    params: PlacementParams = field(default_factory=PlacementParams)
    block_hours: float = 1.0
    same_region_slack: float = 0.05
    kinds: frozenset[CapacityType] = ANY_POOL

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        if current_alive(state):
            return keep(state, self.name, "current pool still running")
        return self.best(state, book, self.kinds)

    def best(self, state: RunState, book: PriceBook, kinds: frozenset[CapacityType]) -> Plan:
        """Launch on the best pool of `kinds` by expected cost, or wait saying why none fits now."""
        block = recent_blocklist(state, self.block_hours)
        ctx = PlacementContext(
            now=state.now,
            remaining_work_hours=state.remaining_work_hours,
            spent_usd=state.spent_usd,
            blocklist=block,
            checkpoint_at=state.checkpoint_at,
            params=self.params,
        )
        q = quote(state.job, book, ctx)
        cands = [c for c in q.candidates if c.offering.capacity_type in kinds]
        if not cands:  # (a budget that cannot finish the job at all was already paused by `decide`)
            return wait(self.name, q.wait_reason() or "no pool fits now")
        best = cands[0]
        if state.checkpoint_at is not None:
            local = [c for c in cands if (c.offering.provider, c.offering.region) == state.checkpoint_at]
            if local and local[0].score <= best.score * (1 + self.same_region_slack) + EPS:
                best = local[0]
        where = (
            "same region as the checkpoint"
            if (best.offering.provider, best.offering.region) == (state.checkpoint_at)
            else "cheapest expected cost"
        )
        plan = launch(state, self.name, best.offering, f"{where}: expected ${best.expected_cost_usd}", block)
        return Plan(plan.move, plan.reason, plan.strategy, plan.offering, best.expected_cost_usd, plan.migrates, block)


@dataclass(frozen=True, slots=True)
class UniformProgress:
    """Uniform Progress ("Can't Be Late") with hysteresis and safety net (module docstring), spot in any zone."""

    name: ClassVar[str] = "uniform_progress"
    restart_hours: float = 0.2

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        job = state.job
        if job.deadline_at is None:
            return (
                wait(self.name, "uniform progress needs a deadline")
                if not current_alive(state)
                else keep(state, self.name, "no deadline")
            )
        d = self.restart_hours
        c0 = float(job.work_hours)
        r0 = (job.deadline_at - state.started_at).total_seconds() / 3600
        t = (state.now - state.started_at).total_seconds() / 3600
        c = state.work
        done = c0 - c
        spots = pools(state, book, frozenset({CapacityType.SPOT})) if job.preemptible else []
        on_spot = current_alive(state) and state.on({CapacityType.SPOT})
        on_od = current_alive(state) and state.on(NON_SPOT)
        has_spot = bool(spots) or on_spot
        want = "spot" if has_spot else "none"
        why = "spot available" if has_spot else "ahead of the progress line: wait for spot"
        if done - t * c0 / r0 < 0:  # behind the uniform progress line
            want, why = ("spot", "behind the line, spot available") if has_spot else ("od", "behind the line")
        if on_od and (not has_spot or (t + 2 * d) * c0 / r0 - done >= 0):
            want, why = "od", "hysteresis: stay on on-demand until ahead of ep(t + 2d)"
        left = state.hours_to_deadline() or 0.0
        if state.ticks(c + 2 * d) >= left - EPS and not on_spot:
            want, why = "od", "safety net: no slack for another changeover"
        if state.ticks(c + d) >= left - EPS:
            if on_spot and state.restart_left_hours < EPS:
                want, why = "spot", "deadline close: keep the running spot until preempted"
            else:
                want, why = "od", "deadline close: on-demand"
            if d <= 0 and has_spot:
                want = "spot"
        if want == "spot":
            if on_spot:
                return keep(state, self.name, why)
            return launch(state, self.name, spots[0], f"{why}: cheapest spot ${spots[0].hourly_usd}/h")
        if want == "od":
            if on_od:
                return keep(state, self.name, why)
            found = pools(state, book, NON_SPOT)
            if not found:
                return wait(self.name, "no on-demand pool available")
            return launch(state, self.name, found[0], why)
        return wait(self.name, why)


@dataclass(frozen=True, slots=True)
class GreedySafetyNet:
    """Greedy spot with a deadline safety net (the "greedy" baseline of Can't Be Late): the cheapest available spot
    pool whenever there is one, kept until reclaimed, idle otherwise; it commits to the cheapest on-demand pool to
    the end once one more tick off on-demand could miss the deadline, i.e. when finishing on on-demand from the
    next tick would not fit: ticks(work + L + d) + one tick > time left (idle, or in a changeover), or
    ticks(work + L + d) > time left (on a running spot, which makes a tick of progress meanwhile), with
    d = `restart_hours` (the changeover to on-demand) and L the work a spot reclaim can lose
    (`RunState.reclaim_loss_hours`). Without a deadline it never commits. Example (1 h ticks, d = 1 h, L = 0):
    4 h of work due in 8 h, no spot: it waits while 4 + 1 + 1 <= time left, so through t = 2; at t = 3 (5 h
    left) it launches on-demand and finishes at 8."""

    name: ClassVar[str] = "greedy_safety_net"
    restart_hours: float = 0.25

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        alive = current_alive(state)
        if alive and state.on(NON_SPOT):
            return keep(state, self.name, "committed to on-demand until done")
        left = state.hours_to_deadline()
        spots = pools(state, book, frozenset({CapacityType.SPOT})) if state.job.preemptible else []
        loss = max((state.reclaim_loss_hours(o) for o in spots), default=0.0)
        if alive and state.current is not None:
            loss = max(loss, state.reclaim_loss_hours(state.current))
        # running spot past its changeover makes a tick of progress before the next decision; idle makes none
        step = 0.0 if alive and state.restart_left_hours < EPS else state.tick_hours
        if left is not None and state.ticks(state.work + loss + self.restart_hours) + step > left + EPS:
            found = pools(state, book, NON_SPOT)
            if not found:
                return wait(self.name, "safety net: no on-demand pool available")
            return launch(state, self.name, found[0], f"safety net: {left:.2f} h left, commit to on-demand")
        if alive:
            return keep(state, self.name, "greedy: keep the running spot until reclaimed")
        if spots:
            return launch(state, self.name, spots[0], f"greedy: cheapest spot ${spots[0].hourly_usd}/h")
        return wait(self.name, "greedy: no spot capacity, slack left: wait")


def _no_changeover_params(restart_hours: float) -> PlacementParams:
    return PlacementParams(checkpoint_interval_hours=0.0, restart_hours=restart_hours, cloud_startup_hours=0.0)


@dataclass(frozen=True, slots=True)
class Overspill:
    """Ours: the placement cost model decides where, slack accounting decides when, availability history
    decides which spot pool and whether leaving a safe pool for it pays.

    Where: available pools ranked by expected cost (price x remaining work x (1 + rate x d) + checkpoint egress,
    the placement model with the pool's interruption rate); zones reclaimed in the last `block_hours` are
    blocklisted for spot (not for on-demand; 0 by default: a reclaimed zone that shows capacity again is judged by
    its history like any other); on-prem pools compete like any other. A running job moves only when the move
    saves `min_saving` of the remaining cost after paying its changeover (cheaper spot, spot back while on
    on-demand, a cheaper on-prem pool): executors move it at its next checkpoint.

    Spot pools by expected up time (when `RunState.outlook` has the pool's availability history, from the past
    only): E = mean residual life of the pool's past up runs at the age of its current one (spot up runs are
    mostly short but the ones that last, last: E grows with age; `age_dependent` False uses the mean of the past up
    runs whatever the age, for experiments), or 1 / interruption rate with fewer than `min_samples` runs. A spot
    pool is ranked by its price per hour of progress, price x E / (E - d), and skipped when E <= d. Leaving a safe
    pool (price P) for spot (price p) also needs E x (P - p) >= `return_factor` x 2d x P: the expected saving must
    outweigh, by that factor, the changeover there and the one back.

    When (with a deadline): slack = hours to the deadline - remaining work - changeover in progress. Each launch
    burns d = `restart_hours` of it, idling burns it tick by tick, running burns none. Rules, after the paper's
    safety net: a spot pool is launched only with slack >= margin = 2d + one tick (`RunState.spot_margin_hours`:
    a reclaim right after its changeover, seen a tick later, still leaves d to reach on-demand), and a running spot
    is kept until reclaimed (exploitation).
    Idle with no spot, it waits only while the slack left after the tick covers margin + d + reserve, where
    reserve = `pace` x initial slack x remaining work / total work keeps slack in proportion to the work left
    (like Uniform Progress' line, but spent only on waiting); otherwise it takes the cheapest safe pool. On a
    safe pool it returns to spot once slack >= margin + `hysteresis` x d + reserve and the spot pool passes the
    test above. Slack below margin means on-demand to the end, which still meets the deadline.

    Checkpoints (`RunState.checkpoint_interval_hours`, the job's save time and each cloud's interruption notice):
    when a reclaim can lose the work since the last checkpoint (no notice long enough to save first), the margin
    grows by the interval, L (2d + L + one tick), and a spot pool's changeover counts
    d + L/2 (its expected loss) in its price per hour of progress and in the test for leaving a safe pool.

    Example (d = 0.25 h, 15-minute ticks so margin = 0.75 h, pace 0.75, no spot anywhere): 2 h of work due in
    10 h -> slack 8 h, reserve 0.75 x 8 x 2/2 = 6 h, 7.75 >= 0.75 + 0.25 + 6: wait. Due in 3 h instead -> slack
    1 h, reserve 0.75 h, 0.75 < 1.75: on-demand now. 4 h of work due in 10 h, on on-demand ($3/h) after 1 h with
    3.5 h left when a $1/h spot pool comes back -> slack 5.5 h >= 0.75 + 3.94; it returns if E x (3 - 1) >= 2.5 x
    2 x 0.25 x 3, i.e. E >= 1.875 h (a pool whose past up runs lasted 4 h: yes; 1 h: stay on on-demand).

    Parameters were tuned on the deadline jobs of the first half of the AWS V100 trace only (benchmarks/README.md).
    """

    name: ClassVar[str] = "overspill"
    restart_hours: float = 0.25
    block_hours: float = 0.0
    pace: float = 0.75
    min_saving: float = 0.25
    hysteresis: float = 0.0
    kinds: frozenset[CapacityType] = ANY_POOL
    min_samples: int = 5
    return_factor: float = 2.5
    age_dependent: bool = True

    def _lasts_long_enough(self, state: RunState, spot: Offering) -> bool:
        """Leaving a safe pool for `spot` pays when the hours it is expected to stay up, saving (P - p) each,
        outweigh the two changeovers (there and back to the safe pool) at the safe price P, by `return_factor`."""
        if not self.return_factor or state.current is None:
            return True
        big, small = float(state.current.price.hourly_usd), float(spot.price.hourly_usd)
        if big <= small:
            return False
        lost = 2 * self.restart_hours + state.reclaim_loss_hours(spot) / 2
        return self.expected_up_hours(state, spot) * (big - small) >= self.return_factor * lost * big

    def expected_up_hours(self, state: RunState, off: Offering) -> float:
        """How much longer spot pool `off` is expected to stay up: the mean residual of its past up runs at the
        current run's age when the outlook has enough of them, else 1 / its interruption rate."""
        look = state.outlook.get(off.key)
        if look is not None and look.up:
            res = look.up_runs.mean_residual(look.age_hours if self.age_dependent else 0.0, self.min_samples)
            if res is not None:
                return res
        rate = off.interruption_rate_per_hour
        return 1 / rate if rate > 0 else math.inf

    def _spot_order(self, state: RunState, spot: list[Candidate]) -> list[Candidate]:
        """With an outlook: spot pools by price per hour of progress, price x E / (E - d), those with E <= d left
        out. Without one: the placement ranking unchanged."""
        if not state.outlook:
            return spot
        scored = []
        for c in spot:
            d = self.restart_hours + state.reclaim_loss_hours(c.offering) / 2  # changeover + expected lost work
            e = self.expected_up_hours(state, c.offering)
            if e <= d:  # not expected to outlast its own changeover
                continue
            eff = float(c.offering.price.hourly_usd) * (e / (e - d) if math.isfinite(e) else 1.0)
            scored.append((eff, c.offering.key, c))
        scored.sort(key=lambda x: (x[0], x[1]))
        return [c for _, _, c in scored]

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        alive = current_alive(state)
        if alive and state.on({CapacityType.SPOT}) and not self._cheaper_spot_exists(state, book):
            return keep(state, self.name, "exploitation: stay on the running spot pool until reclaimed")
        block = recent_blocklist(state, self.block_hours)
        ranked = self._rank(state, book, block)
        if state.job.deadline_at is None:
            return self._cheapest(state, ranked, block)
        return self._deadline(state, ranked, block)

    def _cheaper_spot_exists(self, state: RunState, book: PriceBook) -> bool:
        assert state.current is not None
        found = first_pool(state, book, frozenset({CapacityType.SPOT}))
        return found is not None and found.price.hourly_usd < state.current.price.hourly_usd * Decimal("0.9")

    def _rank(self, state: RunState, book: PriceBook, block: frozenset[str]) -> list[Candidate]:
        """Every available, fitting, affordable pool by expected cost (the deadline is handled by slack). The
        blocklist (recently reclaimed zones) only applies to spot pools: a reclaim says nothing of on-demand."""
        job = replace(state.job, deadline_at=None)
        ctx = PlacementContext(
            now=state.now,
            remaining_work_hours=state.remaining_work_hours,
            spent_usd=state.spent_usd,
            checkpoint_at=state.checkpoint_at,
            params=_no_changeover_params(self.restart_hours),
        )
        spot = frozenset({CapacityType.SPOT})
        offs = pools(state, book, self.kinds & spot, block) + pools(state, book, self.kinds - spot)
        out = [c for off in offs if isinstance(c := judge(job, off, ctx), Candidate)]
        out.sort(key=lambda c: (c.score, c.offering.key))
        return out

    def _stay_cost(self, state: RunState) -> float:
        assert state.current is not None
        rate = state.current.interruption_rate_per_hour
        return float(state.current.price.hourly_usd) * state.work * (1 + rate * self.restart_hours)

    def _worth_moving(self, state: RunState, to: Candidate) -> bool:
        move = float(to.expected_cost_usd) + float(to.offering.price.hourly_usd) * self.restart_hours
        return move < self._stay_cost(state) * (1 - self.min_saving)

    def _cheapest(self, state: RunState, ranked: list[Candidate], block: frozenset[str]) -> Plan:
        if current_alive(state):
            if ranked and ranked[0].offering.key != state.current.key and self._worth_moving(state, ranked[0]):  # type: ignore[union-attr]
                return self._go(state, ranked[0], "cheaper pool by expected cost: move at the next checkpoint", block)
            return keep(state, self.name, "current pool is still the best value")
        if not ranked:
            return wait(self.name, "no pool fits now")
        return self._go(state, ranked[0], "cheapest expected cost", block)

    def _go(self, state: RunState, c: Candidate, why: str, block: frozenset[str]) -> Plan:
        p = launch(state, self.name, c.offering, f"{why} (expected ${c.expected_cost_usd})", block)
        return Plan(p.move, p.reason, p.strategy, p.offering, c.expected_cost_usd, p.migrates, block)

    def _deadline(self, state: RunState, ranked: list[Candidate], block: frozenset[str]) -> Plan:
        d, g = self.restart_hours, state.tick_hours
        left = state.hours_to_deadline() or 0.0
        slack = left - state.work - state.restart_left_hours
        # a reclaim may also lose the work since the last checkpoint: spot needs that much more slack
        loss = max((state.spot_loss_hours(c.offering.provider) for c in ranked), default=0.0)
        margin = state.spot_margin_hours(d, loss)
        spot = self._spot_order(state, [c for c in ranked if c.offering.capacity_type is CapacityType.SPOT])
        safe = [c for c in ranked if c.offering.capacity_type is not CapacityType.SPOT]
        safe = [c for c in safe if state.ticks(c.expected_wait_hours + d + state.work) <= left + EPS] or safe[:0]
        w0 = float(state.job.work_hours)
        s0 = left + (state.now - state.started_at).total_seconds() / 3600 - w0  # the slack the job started with
        reserve = self.pace * max(0.0, s0) * state.work / w0 if w0 > 0 else 0.0
        alive = current_alive(state)
        on_spot = alive and state.on({CapacityType.SPOT})
        if on_spot:  # only reached when a clearly cheaper spot pool is up
            if spot and slack >= margin + self.hysteresis * d + reserve and self._worth_moving(state, spot[0]):
                return self._go(state, spot[0], "cheaper spot pool up with slack to spare: migrate", block)
            return keep(state, self.name, "exploitation: stay on the running spot pool until reclaimed")
        if alive:  # on on-demand or on-prem
            if (
                spot
                and slack >= margin + self.hysteresis * d + reserve
                and self._worth_moving(state, spot[0])
                and self._lasts_long_enough(state, spot[0].offering)
            ):
                return self._go(state, spot[0], f"spot is back and slack {slack:.2f} h allows it: return", block)
            if safe and safe[0].offering.key != state.current.key and self._worth_moving(state, safe[0]):  # type: ignore[union-attr]
                return self._go(state, safe[0], "a cheaper safe pool (on-prem or on-demand) fits the deadline", block)
            return keep(state, self.name, f"slack {slack:.2f} h: stay on the safe pool")
        if spot and slack >= margin:
            return self._go(state, spot[0], f"spot up, slack {slack:.2f} h >= {margin:.2f} h", block)
        if slack - g >= margin + d + reserve:
            return wait(self.name, f"no spot: slack {slack:.2f} h covers the {reserve:.2f} h reserve, wait")
        if safe:
            return self._go(state, safe[0], f"slack {slack:.2f} h too thin to wait: safe pool", block)
        return wait(self.name, "no safe pool available; waiting")


StrategyFactory = Callable[..., Strategy]
STRATEGIES: dict[str, StrategyFactory] = {
    OnDemandOnly.name: OnDemandOnly,
    EagerNextRegion.name: EagerNextRegion,
    NextCheapest.name: NextCheapest,
    UniformProgress.name: UniformProgress,
    GreedySafetyNet.name: GreedySafetyNet,
    Overspill.name: Overspill,
}


def register(name: str, factory: StrategyFactory) -> None:
    """Add a strategy under `name` (pluggable; a name can be registered once)."""
    if name in STRATEGIES and STRATEGIES[name] is not factory:
        raise ValueError(f"strategy {name!r} is already registered")
    STRATEGIES[name] = factory


def make_strategy(name: str, **params: Any) -> Strategy:
    """A strategy by name, e.g. `make_strategy("uniform_progress", restart_hours=0.2)`."""
    try:
        factory = STRATEGIES[name]
    except KeyError as exc:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}") from exc
    return factory(**params)


DEADLINE_POLICY = Overspill.name


def deadline_strategy(restart_hours: float, name: str = DEADLINE_POLICY, **params: Any) -> Strategy:
    """The deadline-aware policy: the one object the broker's placement step (`broker/loop/place.py`) asks for a
    job with a deadline and the simulator replays (`federation.simulate.deadline`), built from the same inputs
    (`restart_hours`: the changeover of a launch). `name` picks another registered strategy for experiments."""
    return make_strategy(name, restart_hours=restart_hours, **params)


def cheapest_finish_usd(state: RunState, book: PriceBook) -> tuple[Decimal, Offering] | None:
    """The least any fitting pool (available or not, blocklisted or not) could charge for the remaining work."""
    job = state.job
    best: tuple[Decimal, Offering] | None = None
    for group in book.for_shape(job.accelerators, job.gpu_count):
        for item in group.items:
            off = item.offering
            if job.max_hourly_usd is not None and off.price.hourly_usd > job.max_hourly_usd:
                continue
            if ever_feasible(job, (off,)):
                cost = off.price.hourly_usd * state.remaining_work_hours
                if best is None or cost < best[0]:
                    best = (cost, off)
                break  # items are in price order: the first that fits is this group's cheapest
    return best


def decide(strategy: Strategy, state: RunState, book: PriceBook) -> Plan:
    """Run `strategy` under the budget rule: spend across attempts never exceeds `max_total_usd`."""
    left = state.budget_left_usd
    floor = cheapest_finish_usd(state, book)
    if floor is None:
        return Plan(Move.PAUSE, "no pool fits this job's shape and constraints", strategy.name)
    if floor[0] > left:
        return Plan(
            Move.PAUSE,
            f"budget: ${left:.2f} left of max_total_usd ${state.job.max_total_usd} cannot finish "
            f"{state.work:.2f} h of work: even the cheapest pool {floor[1].key} at ${floor[1].hourly_usd}/h "
            f"needs ${floor[0]:.2f}",
            strategy.name,
        )
    plan = strategy.decide(state, book)
    if plan.move in (Move.LAUNCH, Move.KEEP) and plan.offering is not None:
        step = plan.offering.price.hourly_usd * Decimal(repr(state.tick_hours))
        if step > left:
            return Plan(
                Move.PAUSE,
                f"budget: the next {state.tick_hours:g} h on {plan.offering.key} costs ${step:.2f}, "
                f"only ${left:.2f} left of max_total_usd ${state.job.max_total_usd}",
                strategy.name,
            )
    return plan
