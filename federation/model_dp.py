"""An expected-value deadline policy: the exact DP on the availability model's own state space (issue 18, point 1).

Role: `ModelDP` decides like `federation.strategies.Overspill` (its fallback and safety net) but, with enough
history and slack to spare, takes the first action of the policy that minimises the *expected* cost to finish by
the deadline under a Markov model of the spot pools fitted on their past only. Unlike `federation.forecast`
(which solves each sampled future with hindsight), the DP is non-anticipative: it decides at each step knowing
only the pools' current states, so waiting is never overrated.

Status (benchmarks/README.md, "branch `policy3`"): registered as "model_dp", not the default. It does not beat
`Overspill` where the gap is (AWS us-east-1, second half: 1.197x vs 1.158x the optimum with the notice): trusting
the model fitted on the past, it spends slack early and is then forced onto on-demand in the scarcer second half.
On the GCP H100 tables it is within 0.5% of `Overspill` (slightly below on every second half); on the 2022 AWS
markets (two zones: the pair is the whole market) it is below `Overspill` in three of four tables and well above
it in the fourth (8 GPUs, no notice). Decision time (branch `policy4`): a look-up, p99 0.36 ms on us-east-1;
the tables are solved in the per-tick `prepare` step (once per model epoch and pool pair), timed separately.

State (per planning unit of u = the changeover, `restart_hours`, at least one tick and `min_unit_hours`): time left
tau and slack left sigma (work left = tau - sigma), in units of u; the job's mode (idle, on-demand, or on spot pool
A or B) and, on spot, its phase (units of progress since its last checkpoint there, `RunState.unsaved_work_hours`;
always 0 when the cloud's notice saves the work); and each of the two pools' state: up or down, and the current
run's age bucket (log-scale edges u x 2^j for up runs, u x 4^j for down runs). Pool A is the running spot pool, or
the best by price per hour of progress (`Overspill`'s ranking: spot pools up by price x E / (E - d), E the mean
residual up time at the current age, then pools down by their expected remaining down time); B is the next best.
On-demand is always there.

Transitions (per unit, pools independent): from a bucket of an up run with representative age a, the run goes on
with probability S(u | a) (the `availability_model.RunModel` survival fitted on the pool's past up runs, seen
through `RunState.outlook`, with `prior_weight` pseudo-runs of the exponential of the same mean: 30 by default,
chosen on the first half of the 2023 AWS trace, where the empirical age dependence taken at face value did worse,
see benchmarks/README.md), and then moves to the next age bucket with probability u / the bucket's width;
otherwise it ends (down, age 0). The same for down runs. Hazards are quantised on a log grid (8 steps per e-fold)
so a small change in history gives the same chain and the solved table is reused.

Actions and costs (as the simulator charges them, `federation.simulate.deadline`): staying on a pool costs one unit
at its price and makes one unit of work; launching one (from idle or another pool) costs one unit at its price,
makes none (the changeover) and burns a unit of slack; waiting burns a unit of slack for free. A spot pool can be
launched or kept only while up. A job checkpoints every `phases` units of progress on a pool (the checkpoint
interval in units; 1 when the cloud's notice is long enough to save: `RunState.reclaim_loss_hours`), and a move it
chooses saves first; a reclaim at the next unit sends it idle and loses its phase's units of work, i.e. burns that
much slack. Slack below 0 is a missed deadline: infinite cost, so an action with any possible future (any
positive-probability path) that misses it is never chosen.

Solve (`solve_world`): backward induction over tau, vectorised over (sigma, mode, phase, joint pool state) with the
joint transition matrix of a `World` - here the Kronecker product of the two pools' chains (`world_of`); the subclass
`federation.chain_dp.ChainDP` plans on a jointly fitted chain instead (the `_world` hook). The table (best action
per state) does not depend on the job, only on the two chains, the prices, u and the phases, so one table serves
every job (their work and slack are coordinates in it). The chains are refitted once per `refit_hours` (24 h) on
the history as of the epoch's start, and `prepare` (called once per tick before the tick's decisions, by the
simulator and any loop that runs this policy) solves the tables the tick's decisions need, so a decision is one
look-up; a table is re-solved only when the epoch's quantised model, a price or the pair changes, or a longer job
needs a larger one.

Contract: pure (no clock, no I/O); deterministic for a given state; information is the history before now only
(`RunState.outlook`, the book at now). Falls back to `Overspill` (today's strategy) when the job's table would
exceed `max_table_cells` (a deadline weeks away), without a deadline, when a pool of the pair has fewer than
`min_samples` past up or down runs, when the slack is within the safety margin (2d + loss + one tick, + d + one
tick: `Overspill`'s rules there guarantee the deadline), and when the DP sees every action as infeasible on its
grid. `exploit` (off by default) leaves a running spot pool to `Overspill`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import numpy as np

from federation.availability_model import Run, RunModel
from federation.forecast import pools_of_shape
from federation.strategies import (
    NON_SPOT,
    Move,
    Overspill,
    Plan,
    PoolOutlook,
    RunLengths,
    RunState,
    current_alive,
    keep,
    launch,
    pools,
    register,
    wait,
)
from pricing.book import PriceBook
from providers.model import CapacityType, Offering

INF = math.inf  # the cost of a missed deadline
IDLE, OD = 0, 1  # modes; spot pool i is mode 2 + i
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_QUANT = 8.0  # hazard quantisation: steps per e-fold of the hazard


@dataclass(frozen=True, slots=True)
class PoolChain:
    """One spot pool as a Markov chain over (up or down, age bucket): `matrix[i, j]` the probability of going
    from state i to state j in one unit, `up[i]` whether state i is up, `price` its hourly price.
    States 0 .. len(up_edges) - 1 are up buckets, the rest down buckets. `key` identifies the chain for caching."""

    matrix: np.ndarray
    up: np.ndarray
    price: float
    up_edges: tuple[float, ...]
    down_edges: tuple[float, ...]
    key: tuple[object, ...]

    def state_of(self, up: bool, age_hours: float) -> int:
        """The chain state of a pool that is `up` (or down) since `age_hours`."""
        edges = self.up_edges if up else self.down_edges
        b = max(0, bisect_right(edges, age_hours + 1e-9) - 1)
        return b if up else len(self.up_edges) + b


def log_edges(unit: float, count: int, ratio: float) -> tuple[float, ...]:
    """Age bucket edges 0, u, u r, u r^2, ... (`count` buckets, the last open)."""
    return (0.0, *(unit * ratio**j for j in range(count - 1)))


def _quantise(h: float) -> int:
    return round(math.log(min(max(h, 1e-6), 1 - 1e-6)) * _QUANT)


def _hazards(model: RunModel, edges: Sequence[float], unit: float) -> list[int]:
    """Per age bucket, the quantised probability that a run of that age ends within one unit."""
    out = []
    for b, lo in enumerate(edges):
        hi = edges[b + 1] if b + 1 < len(edges) else math.inf
        width = hi - lo
        age = lo + (width - unit) / 2 if math.isfinite(width) else 1.5 * lo
        out.append(_quantise(1.0 - model.survival(unit, max(age, 0.0))))
    return out


def _fit(lengths: RunLengths, prior_weight: float) -> RunModel:
    return RunModel.fit([Run(_EPOCH, h) for h in lengths.hours], prior_weight=prior_weight)


def pool_chain(
    look: PoolOutlook,
    price: float,
    unit: float,
    up_buckets: int = 6,
    down_buckets: int = 4,
    prior_weight: float = 3.0,
) -> PoolChain:
    """The chain of one pool from its history (`look.up_runs`, `look.down_runs`: runs that ended before now)."""
    up_edges = log_edges(unit, up_buckets, 2.0)
    down_edges = log_edges(unit, down_buckets, 4.0)
    hz_up = _hazards(_fit(look.up_runs, prior_weight), up_edges, unit)
    hz_down = _hazards(_fit(look.down_runs, prior_weight), down_edges, unit)
    return chain_from_hazards(hz_up, hz_down, up_edges, down_edges, price, unit)


def chain_from_hazards(
    hz_up: Sequence[int],
    hz_down: Sequence[int],
    up_edges: Sequence[float],
    down_edges: Sequence[float],
    price: float,
    unit: float,
) -> PoolChain:
    """The chain for quantised hazards (see `_quantise`) per up and down age bucket."""
    nu, nd = len(up_edges), len(down_edges)
    m = np.zeros((nu + nd, nu + nd))
    for edges, hz, first, other in ((up_edges, hz_up, 0, nu), (down_edges, hz_down, nu, 0)):
        for b in range(len(edges)):
            h = math.exp(hz[b] / _QUANT)
            hi = edges[b + 1] if b + 1 < len(edges) else math.inf
            adv = min(1.0, unit / (hi - edges[b])) if math.isfinite(hi) else 0.0
            i = first + b
            m[i, other] += h  # the run ends: the other kind starts at age 0
            m[i, i + 1 if adv > 0 else i] += (1 - h) * adv
            m[i, i] += (1 - h) * (1 - adv)
    up = np.array([True] * nu + [False] * nd)
    key = (tuple(hz_up), tuple(hz_down), tuple(up_edges), tuple(down_edges), round(price, 6))
    return PoolChain(m, up, price, tuple(up_edges), tuple(down_edges), key)


@dataclass(frozen=True, slots=True)
class Table:
    """A solved DP: `action[tau, sigma, mode, phase, joint]` the best mode to be in for the next unit (0 idle, 1
    on-demand, 2 + i spot pool i; -1 when every action has a possible future that misses the deadline),
    `value[sigma, mode, phase, joint]` at the top level `levels` (and, with `keep_values`, `values[tau]` at every
    level). `phase` is the units of progress since the job's last checkpoint on a spot pool (0 off spot)."""

    action: np.ndarray
    value: np.ndarray
    levels: int
    slack: int
    values: tuple[np.ndarray, ...] = ()


def joint(chains: Sequence[PoolChain]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The joint transition matrix of independent pools and, per pool, which joint states have it up."""
    m = np.ones((1, 1))
    ups: list[np.ndarray] = []
    for c in chains:
        m = np.kron(m, c.matrix)
    for i, c in enumerate(chains):
        mask = np.ones(1, dtype=bool)
        for j, other in enumerate(chains):
            mask = np.kron(mask, c.up if i == j else np.ones(len(other.up), dtype=bool)).astype(bool)
        ups.append(mask)
    return m, ups


def joint_index(chains: Sequence[PoolChain], states: Sequence[int]) -> int:
    idx = 0
    for c, s in zip(chains, states, strict=True):
        idx = idx * len(c.up) + s
    return idx


@dataclass(frozen=True)
class World:
    """What a DP table is solved on: a Markov chain over joint states of the spot pools (`matrix[i, j]`, one unit
    from joint state i to j), per pool which joint states have it up (`ups[p]`), per pool its hourly price, and a
    `key` identifying the world for caching. Built from independent pools (`world_of`) or fitted jointly
    (`federation.chain_dp`)."""

    matrix: np.ndarray
    ups: list[np.ndarray]
    prices: tuple[float, ...]
    key: tuple[object, ...]


def world_of(chains: Sequence[PoolChain]) -> World:
    """The world of independent pools: the Kronecker product of their chains."""
    m, ups = joint(chains)
    return World(m, ups, tuple(c.price for c in chains), tuple(c.key for c in chains))


def solve_world(
    world: World,
    od_hourly: float,
    unit: float,
    phases: int,
    levels: int,
    slack: int,
    keep_values: bool = False,
) -> Table:
    """Backward induction (module docstring) for time left 0 .. `levels` units and slack 0 .. `slack` units.
    `phases`: a job on a spot pool checkpoints every `phases` units of progress there, and a reclaim loses the
    units since its last checkpoint (its phase, 0 .. phases - 1); 1: a reclaim loses nothing (the notice saves)."""
    p, ups = world.matrix, world.ups
    pt = p.T.copy()
    reach = (pt > 0).astype(float)  # which next joint states are possible at all
    n, nj = len(ups), p.shape[0]
    modes = 2 + n
    cost = np.array([0.0, od_hourly * unit, *(price * unit for price in world.prices)])
    sig = np.arange(slack + 1)
    v = np.zeros((slack + 1, modes, phases, nj))
    action = np.zeros((levels + 1, slack + 1, modes, phases, nj), dtype=np.int8)
    values = [v.copy()] if keep_values else []
    inf_row = np.full((1, modes, phases, nj), INF)
    for tau in range(1, levels + 1):
        # a reclaim: spot mode i at phase k with pool i down at the start of the unit is idle, k units of slack
        # poorer (the work since its checkpoint is done again)
        vf = v.copy()
        live = sig < tau - 1  # states of the previous level with work left
        for k in range(phases):
            lost = np.concatenate([np.full((k, nj), INF), v[: slack + 1 - k, IDLE, 0]]) if k else v[:, IDLE, 0]
            for i in range(n):
                sel = np.ix_(live, ~ups[i])
                vf[:, 2 + i, k][sel] = lost[sel]
        # expectation over the next joint pool state; infinite if any possible next state misses the deadline
        finite = np.isfinite(vf)
        ev = np.where(finite, vf, 0.0) @ pt
        ev[((~finite).astype(float) @ reach) > 0] = INF
        evs = np.concatenate([inf_row, ev[:-1]])[:, :, 0]  # the same one unit of slack poorer, at phase 0
        go = cost[None, :, None] + evs  # switch to (or launch) mode t: a unit of slack for the changeover
        go[:, IDLE] = evs[:, IDLE]  # waiting burns a unit of slack for free
        # keep running mode m: a unit of work, one phase on (a checkpoint after the last); phases mean nothing
        # off spot
        stay = cost[None, :, None, None] + np.roll(ev, -1, axis=2)
        stay[:, OD] = cost[OD] + ev[:, OD, :1]
        for i in range(n):
            go[:, 2 + i, ~ups[i]] = INF
            stay[:, 2 + i, :, ~ups[i]] = INF
        stay[:, IDLE] = INF
        best_go = go.argmin(axis=1)  # (slack, joint)
        go_v = np.take_along_axis(go, best_go[:, None, :], axis=1)[:, 0]
        new = np.minimum(go_v[:, None, None, :], stay)
        act = np.where(stay <= go_v[:, None, None, :], np.arange(modes)[None, :, None, None], best_go[:, None, None, :])
        done = sig >= tau
        new[done] = 0.0
        act[done] = IDLE
        v = new
        action[tau] = np.where(np.isfinite(v), act, -1)
        if keep_values:
            values.append(v.copy())
    return Table(action, v, levels, slack, tuple(values))


OutlookAt = Callable[[datetime], Mapping[str, PoolOutlook]]


def _grown(n: int, step: int) -> int:
    """`n` rounded up to a multiple of `step` (tables grow in steps so that jobs share them)."""
    return -(-n // step) * step


def _cells(levels: int, slack: int, world: World, phases: int) -> int:
    """The size of the action table `solve_world` allocates for `levels` and `slack`."""
    return (levels + 1) * (slack + 1) * (2 + len(world.ups)) * phases * world.matrix.shape[0]


@dataclass(frozen=True, slots=True)
class _Query:
    """What one decision needs from a table: its key and size, and the job's coordinates in it."""

    pair: list[Offering]
    od: Offering
    world: World
    key: tuple[object, ...]
    unit: float
    phases: int
    work: int
    sigma: int
    mode: int
    phase: int
    joint: int


@dataclass
class _Moment:
    """The inline solves of one moment (`ModelDP.max_inline_solves_per_tick`)."""

    at: datetime | None = None
    solves: int = 0


@dataclass(frozen=True)
class ModelDP:
    """The expected-value DP on the availability model's state space, `Overspill` as fallback (module docstring).

    Tables are shared: `prepare(now, book, states, outlook_at)`, called once per tick before the tick's
    decisions, solves every table those decisions will need (one per (model epoch, ordered pool pair, prices,
    phases), sized to the longest horizon seen), so `decide` is a look-up. The pools' chains are refitted once per
    `refit_hours` epoch, on the history as of the epoch's start (`outlook_at`; without it, the outlook of the
    first call in the epoch, which in a live loop ticking every few seconds is the same thing). `decide` without a
    prior `prepare` still works: it solves the missing table inline (counted in `stats["inline_solves"]`)."""

    name: ClassVar[str] = "model_dp"
    restart_hours: float = 0.25
    min_samples: int = 5
    up_buckets: int = 6
    down_buckets: int = 4
    prior_weight: float = 30.0
    exploit: bool = False
    refit_hours: float = 24.0
    max_tables: int = 16
    # the largest table (levels x slack x modes x joint states, one byte each) a decision may solve: a job with a
    # deadline weeks away would need gigabytes; beyond this, `Overspill` decides (the simulator's largest: ~11 M)
    max_table_cells: int = 32_000_000
    # the planning unit is at least this long: the live loop's 10 s tick and 6-minute changeover would otherwise
    # plan a 70 h job on 700 levels, a table over the cap (a unit longer than the changeover only overcounts it)
    min_unit_hours: float = 0.25
    # a decision that needs a table nobody solved yet solves it inline (the live loop calls no `prepare`): at most
    # this many per moment (one `state.now`: one tick), so a tick with many job shapes, each wanting its own table,
    # cannot stall on solves (~0.1-0.3 s each); beyond it `Overspill` decides, and a later tick solves the rest
    max_inline_solves_per_tick: int = 4
    fallback: Overspill = field(default_factory=Overspill)
    stats: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    _chains: dict[tuple[object, ...], PoolChain | None] = field(default_factory=dict, compare=False, repr=False)
    _tables: OrderedDict[tuple[object, ...], Table] = field(default_factory=OrderedDict, compare=False, repr=False)
    _inline: _Moment = field(default_factory=_Moment, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.fallback.restart_hours != self.restart_hours:
            object.__setattr__(self, "fallback", Overspill(restart_hours=self.restart_hours))

    def epoch(self, now: datetime) -> int:
        """The model epoch of `now`: chains are refitted once per `refit_hours`."""
        return math.floor((now - _EPOCH).total_seconds() / 3600 / self.refit_hours)

    def epoch_start(self, epoch: int) -> datetime:
        return _EPOCH + timedelta(hours=epoch * self.refit_hours)

    def prepare(
        self,
        now: datetime,
        book: PriceBook,
        states: Sequence[RunState],
        outlook_at: OutlookAt | None = None,
    ) -> int:
        """Solve, before the tick's decisions, every table the decisions of `states` at `now` will look up (each
        table once, sized to the largest of their horizons). Returns the number of tables solved."""
        need: dict[tuple[object, ...], tuple[_Query, int, int]] = {}
        for state in states:
            q = self._query(state, book, outlook_at)
            if isinstance(q, _Query):
                lv, sl = need.get(q.key, (q, 0, 0))[1:]
                need[q.key] = (q, max(lv, q.work + q.sigma), max(sl, q.sigma))
        solved = 0
        for key, (q, lv, sl) in need.items():
            if self._table(key, q, lv, sl, count="prepare_solves") is not None:
                solved += 1
        return solved

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        base = self.fallback.decide(state, book)
        if state.job.deadline_at is None or base.move is Move.PAUSE or not state.outlook:
            return base
        if self.exploit and current_alive(state) and state.on({CapacityType.SPOT}):
            return base  # `exploit`: a running spot pool is Overspill's to keep or leave
        q = self._query(state, book, None)
        if not isinstance(q, _Query):
            return base
        table = self._tables.get(q.key)
        if table is None or table.levels < q.work + q.sigma or table.slack < q.sigma:
            if not self._may_solve_inline(state.now):
                self.stats["inline_deferred"] = self.stats.get("inline_deferred", 0) + 1
                return base  # this tick's inline solves are spent: today's strategy, the DP on a later tick
            table = self._table(q.key, q, q.work + q.sigma, q.sigma, count="inline_solves")
        else:
            self._tables.move_to_end(q.key)
        act = int(table.action[q.work + q.sigma, q.sigma, q.mode, q.phase, q.joint]) if table is not None else -1
        if act < 0 or self._defers(state, book, q, act):
            return base  # every action risks the deadline on the DP's grid, or the DP's world is too small
        why = f"model DP (slack {q.sigma} x {q.unit:g} h, work {q.work} units)"
        if act == IDLE:
            return wait(self.name, f"{why}: waiting has the least expected cost")
        if act == OD:
            if q.mode == OD:
                return keep(state, self.name, f"{why}: stay on on-demand")
            return launch(state, self.name, q.od, f"{why}: on-demand has the least expected cost")
        target = q.pair[act - 2]
        up_spot = pools(state, book, frozenset({CapacityType.SPOT})) if state.job.preemptible else []
        if not any(o.key == target.key for o in up_spot):
            return base  # the book disagrees with the outlook: let today's strategy decide
        if q.mode == act:
            return keep(state, self.name, f"{why}: stay on spot {target.key}")
        return launch(state, self.name, target, f"{why}: spot {target.key} has the least expected cost")

    def _may_solve_inline(self, now: datetime) -> bool:
        """Whether a decision at `now` may still solve a table inside it (`max_inline_solves_per_tick`)."""
        moment = self._inline
        if moment.at != now:
            moment.at, moment.solves = now, 0
        if moment.solves >= self.max_inline_solves_per_tick:
            return False
        moment.solves += 1
        return True

    def _defers(self, state: RunState, book: PriceBook, q: _Query, act: int) -> bool:
        """Whether the DP's action `act` is left to `Overspill` (here: never; a subclass whose world leaves pools
        out may)."""
        return False

    def _query(self, state: RunState, book: PriceBook, outlook_at: OutlookAt | None) -> _Query | None:
        """The table and the coordinates `decide` would use for `state`; None where it defers to `Overspill`."""
        if state.job.deadline_at is None or not state.outlook:
            return None
        if self.exploit and current_alive(state) and state.on({CapacityType.SPOT}):
            return None
        safe = pools(state, book, NON_SPOT)
        if not safe:
            return None
        d, g = self.restart_hours, state.tick_hours
        unit = state.ticks(max(d, g, self.min_unit_hours))
        left = state.hours_to_deadline() or 0.0
        slack = left - state.work - state.restart_left_hours
        up_spot = pools(state, book, frozenset({CapacityType.SPOT})) if state.job.preemptible else []
        loss_h = max((state.spot_loss_hours(o.provider) for o in up_spot), default=0.0)
        margin = state.spot_margin_hours(d, loss_h)
        if slack < margin + d + g:
            return None  # the safety net's ground
        work = math.ceil((state.work + state.restart_left_hours) / unit - 1e-9)
        sigma = math.floor(slack / unit + 1e-9)
        if work <= 0:
            return None
        found = self._world(state, book, up_spot, unit, outlook_at)
        if found is None:
            return None
        pair, world, j = found
        # a reclaim without a usable notice loses the work since the last checkpoint: plan the checkpoint's phase
        phases = max(1, round(max((state.reclaim_loss_hours(o) for o in pair), default=0.0) / unit))
        if _cells(_grown(work + sigma, 48), _grown(sigma, 16), world, phases) > self.max_table_cells:
            return None  # a table this size is not worth its memory: far from the deadline, spot is easy anyway
        od = safe[0]
        mode = phase = IDLE
        if current_alive(state) and state.current is not None:
            if state.current.capacity_type is CapacityType.SPOT:
                keys = [o.key for o in pair]
                if state.current.key not in keys:
                    return None
                mode = 2 + keys.index(state.current.key)
                phase = min(phases - 1, round(state.unsaved_work_hours / unit))
            elif state.current.key == od.key:
                mode = OD
            else:
                return None  # on another safe pool (e.g. on-prem): today's strategy
        key = (world.key, round(float(od.price.hourly_usd), 6), round(unit, 9), phases)
        return _Query(pair, od, world, key, unit, phases, work, sigma, mode, phase, j)

    def _world(
        self, state: RunState, book: PriceBook, up_spot: list[Offering], unit: float, outlook_at: OutlookAt | None
    ) -> tuple[list[Offering], World, int] | None:
        """The spot pools the DP plans over (the running one first), their world for this model epoch, and the
        joint state they are in now; None to defer to `Overspill`. Here: the pair of independent pool chains."""
        pair = self._pair(state, book, up_spot)
        if pair is None:
            return None
        epoch = self.epoch(state.now)
        chains: list[PoolChain] = []
        for o in pair:
            c = self._chain(o, epoch, unit, state.outlook, outlook_at)
            if c is None:
                return None
            chains.append(c)
        looks = [state.outlook[o.key] for o in pair]
        j = joint_index(chains, [c.state_of(lk.up, lk.age_hours) for c, lk in zip(chains, looks, strict=True)])
        return pair, world_of(chains), j

    def _chain(
        self,
        off: Offering,
        epoch: int,
        unit: float,
        outlook: Mapping[str, PoolOutlook],
        outlook_at: OutlookAt | None,
    ) -> PoolChain | None:
        """Pool `off`'s chain for the model epoch: fitted once, on its history as of the epoch's start."""
        key = (off.key, epoch, round(float(off.price.hourly_usd), 6), round(unit, 9))
        if key in self._chains:
            return self._chains[key]
        if any(k[1] != epoch for k in self._chains):
            self._chains.clear()  # a new epoch: the old fits are not used again
        look = (outlook_at(self.epoch_start(epoch)) if outlook_at else outlook).get(off.key)
        chain = None
        if look is not None and min(len(look.up_runs.hours), len(look.down_runs.hours)) >= self.min_samples:
            chain = pool_chain(
                look, float(off.price.hourly_usd), unit, self.up_buckets, self.down_buckets, self.prior_weight
            )
        self._chains[key] = chain
        return chain

    def _table(self, key: tuple[object, ...], q: _Query, levels: int, slack: int, count: str) -> Table | None:
        """The solved table for `key` covering `levels` and `slack` (grown in steps of 48 levels and 16 slack
        units so that jobs share it), solving it if needed (counted in `stats[count]`)."""
        found = self._tables.get(key)
        if found is not None and found.levels >= levels and found.slack >= slack:
            self._tables.move_to_end(key)
            return found
        lv = _grown(max(levels, found.levels if found else 0), 48)
        sl = _grown(max(slack, found.slack if found else 0), 16)
        if _cells(lv, sl, q.world, q.phases) > self.max_table_cells:  # the union of two jobs' needs: this job's alone
            lv, sl = _grown(levels, 48), _grown(slack, 16)
        table = solve_world(q.world, float(q.od.price.hourly_usd), q.unit, q.phases, lv, sl)
        self.stats[count] = self.stats.get(count, 0) + 1
        self._tables[key] = table
        self._tables.move_to_end(key)
        while len(self._tables) > self.max_tables:
            self._tables.popitem(last=False)
        return table

    def _pair(self, state: RunState, book: PriceBook, up_spot: list[Offering]) -> list[Offering] | None:
        """Pool A (the running spot pool, or the best) and B (the next best): spot pools up by price per hour of
        progress, then pools down by expected remaining down time. None when a pool lacks history."""
        every = {o.key: o for o in pools_of_shape(state, book)}
        ranked: list[tuple[int, float, str]] = []
        for key, off in every.items():
            look = state.outlook.get(key)
            if look is None:
                continue
            if look.up:
                e = self.fallback.expected_up_hours(state, off)
                dd = self.restart_hours + state.reclaim_loss_hours(off) / 2
                eff = float(off.price.hourly_usd) * (e / (e - dd)) if math.isfinite(e) and e > dd else math.inf
                ranked.append((0 if math.isfinite(eff) else 1, eff, key))
            else:
                res = look.down_runs.mean_residual(look.age_hours, 1)
                ranked.append((2, res if res is not None else math.inf, key))
        ranked.sort()
        keys = [k for _, _, k in ranked]
        cur = state.current
        if cur is not None and current_alive(state) and cur.key in every and cur.capacity_type is CapacityType.SPOT:
            keys = [state.current.key] + [k for k in keys if k != state.current.key]
        pair = [every[k] for k in keys[:2]]
        if not pair:
            return None
        for o in pair:
            look = state.outlook[o.key]
            if len(look.up_runs.hours) < self.min_samples or len(look.down_runs.hours) < self.min_samples:
                return None
        # a pool up now but not in the book as available (or vice versa) is judged by the book at launch time
        return pair


register(ModelDP.name, ModelDP)
