"""The price of information: the exact Bayes-optimal causal deadline policy in a Markov world fitted to a trace.

Role: measure how far ANY causal policy must stay above the omniscient optimum (`federation.simulate.optimum`)
on a market, by building a synthetic world statistically like it in which the best causal policy is computable.

World (`JointChain`, counted by `federation.joint_chain`): the zones' joint availability as a Markov chain at a
step of one changeover unit (15 min).
A state is (bitmask of the zones that are up, age bucket of that bitmask); ages count steps the bitmask has held
(1 = it changed this step), bucketed by `edges` (default 1 / 2-4 / 5-16 / 17+ steps: 0-15 min, 15-60 min, 1-4 h,
4 h+). From (mask, b) the chain goes to (mask, b) (a bucket wider than one step, or the last), to (mask, b + 1),
or to (other mask, 0); `fit` counts exactly those transitions on the trace, so sampling from the chain and
solving on it are the same world (bucket advance and exit are the counted probabilities: the chain is Markov by
construction). A zone is up in a step only if it is up in ALL the trace's ticks of that step (a spot job would
be reclaimed by any down tick). Spot prices are constant: each zone's time-mean over the fitted slice.

Decision problem (`solve`): one deadline job in the tick model of `federation.simulate.deadline` with one tick =
one step and the AWS notice (no work lost to a reclaim): at each tick the policy sees the chain state (so which
zones are up now), a spot pool whose zone is down is reclaimed at that tick (mode -> idle; a reclaim during a
changeover loses the changeover paid so far, as `run_deadline` does), then it keeps running, idles, or launches
any pool (on-demand, or a zone up now) with `restart_ticks` of changeover billed at the new pool's price - the
actions of `optimum.py`. A deadline miss costs infinity (`BIG` here). `BayesTable.value` is V*, the least
expected cost over every non-anticipative policy; `run_bayes` executes the greedy policy on the table.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np

from federation.joint_chain import EDGES, masks_of, states_of_masks, transition_matrix
from federation.simulate.deadline import DeadlineJob
from federation.simulate.market import usd
from federation.simulate.optimum import optimum_cost
from federation.simulate.traces import EPOCH, SpotTrace, ZoneSeries

STEP_SECONDS = 900
BIG = 1e15  # the cost of a deadline miss (infinity; finite so that 0 x BIG = 0 in expectations)
FEASIBLE = 1e12  # values at or above this are misses


@dataclass(frozen=True)
class JointChain:
    """A Markov chain over (up-bitmask, age bucket) of `zones` at `step_seconds`, with constant prices.
    Bit z of a mask is zone z (in `zones`' order); state id = mask * len(edges) + bucket."""

    zones: tuple[str, ...]
    regions: tuple[str, ...]
    edges: tuple[int, ...]
    transition: np.ndarray  # (states, states), rows sum to 1
    spot_usd: tuple[float, ...]  # per zone, per hour
    on_demand_usd: dict[str, float]
    step_seconds: int = STEP_SECONDS
    provider: str = "aws"
    instance_type: str = "p3.2xlarge"
    accelerator: str = "V100"
    gpus: int = 1
    masks: tuple[int, ...] | None = None  # `restrict`ed: state id = index into masks * len(edges) + bucket
    _stationary: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def buckets(self) -> int:
        return len(self.edges)

    @property
    def states(self) -> int:
        return (len(self.masks) if self.masks is not None else 1 << len(self.zones)) * len(self.edges)

    def up(self) -> np.ndarray:
        """(states, zones) bool: zone z is up in state c."""
        masks = np.arange(self.states) // self.buckets
        if self.masks is not None:
            masks = np.asarray(self.masks, dtype=np.int64)[masks]
        return ((masks[:, None] >> np.arange(len(self.zones))[None, :]) & 1).astype(bool)

    def stationary(self) -> np.ndarray:
        """The chain's long-run distribution over states (power iteration from uniform), computed once per chain
        (read-only: every sample drawn from a stationary start reads it)."""
        if self._stationary is None:
            pi = np.full(self.states, 1.0 / self.states)
            for _ in range(20000):
                nxt = pi @ self.transition
                settled = np.abs(nxt - pi).sum() < 1e-13
                pi = nxt
                if settled:
                    break
            pi.setflags(write=False)
            object.__setattr__(self, "_stationary", pi)
        return self._stationary  # type: ignore[return-value]


def coarsen(trace: SpotTrace, step_seconds: int = STEP_SECONDS) -> SpotTrace:
    """`trace` on a grid of `step_seconds` (a multiple of its gap): a zone is up in a step only if up in all its
    ticks; its price in the step is the mean of its ticks' prices (4 decimals). A last partial step is dropped."""
    if step_seconds % trace.gap_seconds:
        raise ValueError(f"step {step_seconds} s is not a multiple of the trace's {trace.gap_seconds} s")
    f = step_seconds // trace.gap_seconds
    n = len(trace) // f
    zones = []
    for z in trace.zones:
        a = np.asarray(z.available[: n * f], dtype=bool).reshape(n, f).all(axis=1)
        p = np.asarray(z.spot_usd[: n * f], dtype=float).reshape(n, f).mean(axis=1)
        zones.append(ZoneSeries(z.zone, z.region, tuple(bool(x) for x in a), tuple(round(float(x), 4) for x in p)))
    return SpotTrace(
        trace.start_at,
        step_seconds,
        tuple(zones),
        trace.on_demand_usd,
        trace.provider,
        trace.instance_type,
        trace.accelerator,
        trace.gpus,
        f"{trace.source} (all-up per {step_seconds} s)",
    )


def states_of(trace: SpotTrace, edges: Sequence[int] = EDGES) -> np.ndarray:
    """The chain state at each tick of `trace` (whose gap is the chain's step), ages counted from the trace's
    start (the first run's age is truncated there)."""
    return states_of_masks(masks_of(np.array([z.available for z in trace.zones], dtype=bool)), edges)


def fit(
    trace: SpotTrace,
    zones: Sequence[str],
    start_tick: int = 0,
    end_tick: int | None = None,
    edges: Sequence[int] = EDGES,
    pseudo: float = 0.1,
    step_seconds: int = STEP_SECONDS,
) -> JointChain:
    """The chain of `zones` fitted on ticks `start_tick` .. `end_tick` of `trace` (ticks of the trace's own gap):
    transitions counted on the trace coarsened to `step_seconds` (all-up rule), plus `pseudo` on every allowed
    transition (a Dirichlet prior); prices: each zone's time-mean spot price over the slice."""
    sub = trace.only(list(zones))
    end = len(sub) if end_tick is None else end_tick
    f = step_seconds // sub.gap_seconds
    coarse = coarsen(sub, step_seconds)
    st = states_of(coarse, edges)
    lo, hi = start_tick // f, min(len(st), end // f)
    transition = transition_matrix(st[lo:hi], edges, len(zones), pseudo)
    prices = tuple(round(float(np.mean(z.spot_usd[start_tick:end])), 4) for z in sub.zones)
    regions = tuple(z.region for z in sub.zones)
    return JointChain(
        tuple(zones),
        regions,
        tuple(edges),
        transition,
        prices,
        {r: float(sub.on_demand_usd[r]) for r in set(regions)},
        step_seconds,
        sub.provider,
        sub.instance_type,
        sub.accelerator,
        sub.gpus,
    )


def restrict(chain: JointChain, masks: Sequence[int]) -> JointChain:
    """`chain` on the states of `masks` only (every age bucket of each): the transition rows restricted to them
    and renormalised, so `fit`'s pseudo-count survives only among these masks (for a many-zone market, where
    most of the 2^zones bitmasks are never seen). Transitions counted on the fitted slice between observed
    masks are unchanged in count; the restricted chain is a different (smaller) world, not a bound on the full."""
    if chain.masks is not None:
        raise ValueError("already restricted")
    nb = chain.buckets
    masks = sorted(set(int(m) for m in masks))
    idx = np.array([m * nb + b for m in masks for b in range(nb)], dtype=np.int64)
    sub = chain.transition[np.ix_(idx, idx)]
    sub = sub / sub.sum(axis=1, keepdims=True)
    return replace(chain, transition=sub, masks=tuple(masks))


def restricted_states(chain: JointChain, full_states: np.ndarray) -> np.ndarray:
    """Map `states_of` ids (full numbering) to a restricted chain's ids (-1: a mask outside the chain)."""
    nb = chain.buckets
    if chain.masks is None:
        return full_states
    pos = {m: i for i, m in enumerate(chain.masks)}
    return np.array([pos[int(c) // nb] * nb + int(c) % nb if int(c) // nb in pos else -1 for c in full_states])


def sample_path(chain: JointChain, steps: int, rng: np.random.Generator, start: int | None = None) -> np.ndarray:
    """`steps` chain states, from `start` (default: drawn from the stationary distribution)."""
    cum = np.cumsum(chain.transition, axis=1)
    cum[:, -1] = 1.0
    out = np.empty(steps, dtype=np.int64)
    c = int(rng.choice(chain.states, p=chain.stationary())) if start is None else start
    draws = rng.random(steps)
    for i in range(steps):
        out[i] = c
        c = int(np.searchsorted(cum[c], draws[i], side="right"))
    return out


def to_trace(chain: JointChain, states: np.ndarray, start_at: datetime = EPOCH) -> SpotTrace:
    """The `SpotTrace` (gap = the chain's step, constant prices) of a path of chain states."""
    up = chain.up()[states]
    zones = tuple(
        ZoneSeries(z, r, tuple(bool(x) for x in up[:, i]), (chain.spot_usd[i],) * len(states))
        for i, (z, r) in enumerate(zip(chain.zones, chain.regions, strict=True))
    )
    return SpotTrace(
        start_at,
        chain.step_seconds,
        zones,
        dict(chain.on_demand_usd),
        chain.provider,
        chain.instance_type,
        chain.accelerator,
        chain.gpus,
        "joint availability chain",
    )


def sample(chain: JointChain, steps: int, rng: np.random.Generator) -> SpotTrace:
    """A `SpotTrace` of `steps` ticks drawn from `chain`."""
    return to_trace(chain, sample_path(chain, steps, rng))


# --- the Bayes-optimal DP -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BayesTable:
    """Vpre[tau][s, m, c]: least expected cost to go with `tau` ticks to the deadline, `s` ticks of slack left
    (tau - work left), mode m BEFORE this tick's reclaim, chain state c. Modes: 0 idle; 1 + p * k + j: pool p
    (0 on-demand, 1 + z spot zone z) with j changeover ticks left (0: running)."""

    chain: JointChain
    restart_ticks: int
    cost: np.ndarray  # per pool, per tick, USD
    vpre: np.ndarray  # (tau, s, modes, states)

    @property
    def pools(self) -> int:
        return len(self.cost)

    def mode(self, pool: int, left: int) -> int:
        return 1 + pool * self.restart_ticks + left

    def value(self, job: DeadlineJob, state: int) -> float:
        """V* of `job` starting idle in chain state `state` (>= FEASIBLE: no policy meets the deadline)."""
        return float(self.vpre[job.deadline_ticks, job.deadline_ticks - job.work_ticks, 0, state])

    def expected_value(self, job: DeadlineJob, dist: np.ndarray) -> float:
        return float(self.vpre[job.deadline_ticks, job.deadline_ticks - job.work_ticks, 0, :] @ dist)


def pool_costs(chain: JointChain) -> np.ndarray:
    """Per pool (on-demand first, then each zone's spot), the cost of one tick in USD, as `optimum.py` bills."""
    h = chain.step_seconds / 3600
    od = min(float(usd(chain.on_demand_usd[r])) for r in chain.regions)
    return np.array([od * h] + [float(usd(p)) * h for p in chain.spot_usd])


def solve(chain: JointChain, max_ticks: int, max_slack: int, restart_ticks: int) -> BayesTable:
    """V* for every job of up to `max_ticks` to its deadline and `max_slack` of slack, by backward induction."""
    cost = pool_costs(chain)
    vpre = np.empty((max_ticks + 1, max_slack + 1, 1 + len(cost) * restart_ticks, chain.states))
    for tau, v in _induct(chain, max_ticks, max_slack, restart_ticks):
        vpre[tau] = v
    return BayesTable(chain, restart_ticks, cost, vpre)


@dataclass(frozen=True)
class StartValues:
    """V*(job, start state) for a few jobs only (`solve_values`): the memory-light stand-in for a `BayesTable`
    where only `value` is needed (`by_start_state`), for chains too big to keep the whole table."""

    chain: JointChain
    values: dict[tuple[int, int], np.ndarray]  # (deadline ticks, work ticks) -> per start state

    def value(self, job: DeadlineJob, state: int) -> float:
        return float(self.values[(job.deadline_ticks, job.work_ticks)][state])

    def expected_value(self, job: DeadlineJob, dist: np.ndarray) -> float:
        return float(self.values[(job.deadline_ticks, job.work_ticks)] @ dist)


def solve_values(chain: JointChain, jobs: Sequence[DeadlineJob]) -> StartValues:
    """`solve`'s V* for `jobs` (one changeover), keeping one tick of the table at a time."""
    k = jobs[0].restart_ticks
    if any(j.restart_ticks != k for j in jobs):
        raise ValueError("one changeover for all jobs")
    want = {j.deadline_ticks: [] for j in jobs}
    for j in jobs:
        want[j.deadline_ticks].append(j.work_ticks)
    out: dict[tuple[int, int], np.ndarray] = {}
    max_slack = max(j.deadline_ticks - j.work_ticks for j in jobs)
    for tau, v in _induct(chain, max(want), max_slack, k):
        for w in want.get(tau, ()):
            out[(tau, w)] = v[tau - w, 0].copy()
    return StartValues(chain, out)


def _induct(chain: JointChain, max_ticks: int, max_slack: int, restart_ticks: int) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (tau, Vpre[tau]) for tau = 0 .. max_ticks (the array is reused: copy what you keep)."""
    k = restart_ticks
    if k < 1:
        raise ValueError("the Bayes DP needs a changeover of at least one tick")
    cost = pool_costs(chain)
    npools, C, S = len(cost), chain.states, max_slack + 1
    M = 1 + npools * k
    up = chain.up()  # (C, Z)
    pool_up = np.concatenate([np.ones((C, 1), dtype=bool), up], axis=1)  # (C, pools)
    # eff[m, c]: the mode after this tick's reclaim
    eff = np.zeros((M, C), dtype=np.int64)
    for p in range(npools):
        for j in range(k):
            m = 1 + p * k + j
            eff[m] = np.where(pool_up[:, p], m, 0)
    prev = np.zeros((S, M, C))  # tau = 0 with s >= 0: the work is done
    yield 0, prev
    PT = chain.transition.T
    s_idx = np.arange(S)
    for tau in range(1, max_ticks + 1):
        nxt = (prev.reshape(S * M, C) @ PT).reshape(S, M, C)  # E[Vpre_{tau-1}[s, m, c'] | c]
        waste = np.full((S, M, C), BIG)
        waste[1:] = nxt[:-1]  # the value one tick of slack later (s - 1); s - 1 < 0 is a miss
        best_launch = waste[:, 0, :].copy()  # idle
        for p in range(npools):
            v = cost[p] + waste[:, 1 + p * k + k - 1, :]
            v = np.where(pool_up[None, :, p], v, BIG)
            best_launch = np.minimum(best_launch, v)
        post = np.empty((S, M, C))
        post[:, 0, :] = best_launch
        for p in range(npools):
            for j in range(k):
                m = 1 + p * k + j
                keep = cost[p] + (nxt[:, m, :] if j == 0 else waste[:, m - 1, :])
                post[:, m, :] = np.minimum(best_launch, keep)
        post = np.minimum(post, BIG)
        post[s_idx >= tau] = 0.0  # work left = tau - s <= 0: done
        prev = np.take_along_axis(post, np.broadcast_to(eff[None], (S, M, C)), axis=1)
        yield tau, prev


KEEP, IDLE = -1, -2  # actions besides "launch pool p" (p >= 0)


def decide_bayes(table: BayesTable, tau: int, s: int, mode: int, state: int) -> int:
    """The optimal action (KEEP, IDLE or a pool to launch) at `tau` ticks to go, slack `s`, mode after the
    reclaim `mode`, chain state `state`. Ties go to KEEP, then IDLE, then the lowest pool."""
    k = table.restart_ticks
    row = table.chain.transition[state]
    prev = table.vpre[tau - 1]
    cur = prev[s] @ row  # (modes,)
    low = prev[s - 1] @ row if s >= 1 else np.full(cur.shape, BIG)
    options: list[tuple[float, int]] = []
    if mode:
        p, j = divmod(mode - 1, k)
        options.append((table.cost[p] + (cur[mode] if j == 0 else low[mode - 1]), KEEP))
    options.append((low[0], IDLE))
    up = table.chain.up()[state]
    for p in range(table.pools):
        if p == 0 or up[p - 1]:
            options.append((table.cost[p] + low[1 + p * k + k - 1], p))
    best = min(v for v, _ in options)
    return next(a for v, a in options if v <= best + 1e-9 * max(1.0, abs(best)))


@dataclass(frozen=True, slots=True)
class BayesRun:
    cost_usd: float
    met_deadline: bool
    launches: int
    preemptions: int
    actions: tuple[int, ...]


def run_bayes(table: BayesTable, states: Sequence[int], job: DeadlineJob) -> BayesRun:
    """Execute the table's greedy policy on one path of chain states, in `run_deadline`'s tick model (with the
    notice: a reclaim loses no work). `states[t]` is the chain state at trace tick t; the job starts at
    `job.start_tick` and must use the table's changeover."""
    if job.restart_ticks != table.restart_ticks:
        raise ValueError("the job's changeover differs from the table's")
    k = table.restart_ticks
    up = table.chain.up()
    remaining, restart_left, pool = job.work_ticks, 0, None
    spent, launches, preemptions = 0.0, 0, 0
    actions: list[int] = []
    tick = job.start_tick
    end = job.start_tick + job.deadline_ticks
    while remaining > 0 and tick < end:
        c = int(states[tick])
        if pool is not None and pool > 0 and not up[c, pool - 1]:
            preemptions += 1
            pool, restart_left = None, 0
        tau = end - tick
        mode = 0 if pool is None else table.mode(pool, restart_left)
        s = tau - remaining
        a = decide_bayes(table, tau, s, mode, c)
        actions.append(a)
        if a == IDLE:
            pool, restart_left = None, 0
        elif a >= 0:
            pool, restart_left = a, k
            launches += 1
        if pool is not None:
            spent += float(table.cost[pool])
            if restart_left > 0:
                restart_left -= 1
            else:
                remaining -= 1
        tick += 1
    return BayesRun(spent, remaining == 0, launches, preemptions, tuple(actions))


def ratio_ci(num: Sequence[float], den: Sequence[float]) -> tuple[float, float]:
    """mean(num) / mean(den) of paired samples and its 95% half-width (delta method)."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    n = len(a)
    r = float(a.mean() / b.mean())
    if n < 2:
        return r, math.inf
    resid = (a - r * b) / b.mean()
    return r, 1.96 * float(resid.std(ddof=1)) / math.sqrt(n)


# --- the price of information by start state ------------------------------------------------------------------


@dataclass(frozen=True)
class StartStateRow:
    """One start state s0: V*(job, s0) (a lower bound on the EXPECTED cost of every causal policy for a job
    starting idle in s0), and the Monte Carlo mean of the hindsight optimum over traces started in s0."""

    state: int
    mass: float  # stationary probability of s0
    vstar: float
    opt_mean: float
    opt_se: float
    samples: int

    @property
    def ratio(self) -> float:
        return self.vstar / self.opt_mean if self.opt_mean > 0 else math.inf


def by_start_state(
    table: BayesTable | StartValues, job: DeadlineJob, samples: int, rng: np.random.Generator, min_mass: float = 0.0
) -> list[StartStateRow]:
    """Per chain state s0 with stationary mass > `min_mass`: V*(job, s0) and E[hindsight optimum | start in s0]
    from `samples` traces sampled from the chain started in s0 (no warm-up: the optimum needs no history).
    `job.start_tick` is ignored (the trace starts at the job's start)."""
    chain = table.chain
    pi = chain.stationary()
    at0 = DeadlineJob(job.name, 0, job.work_ticks, job.deadline_ticks, job.restart_ticks)
    rows = []
    for s0 in range(chain.states):
        if pi[s0] <= min_mass:
            continue
        opts = [
            optimum_cost(to_trace(chain, sample_path(chain, job.deadline_ticks + 1, rng, start=s0)), at0)
            for _ in range(samples)
        ]
        se = float(np.std(opts, ddof=1)) / math.sqrt(samples) if samples > 1 else math.inf
        rows.append(StartStateRow(s0, float(pi[s0]), table.value(job, s0), float(np.mean(opts)), se, samples))
    return rows


def start_state_summary(rows: Sequence[StartStateRow], thresholds: Sequence[float], jobs: int) -> dict:
    """Stationary mass of start states whose ratio V*(s0)/E[opt|s0] exceeds each threshold, the worst state's
    ratio, and the probability that at least one of `jobs` stationary start draws lands in such a state."""
    total = sum(r.mass for r in rows)
    worst = max(rows, key=lambda r: r.ratio)
    out: dict = {"worst_state": worst.state, "worst_ratio": worst.ratio, "worst_mass": worst.mass / total}
    for t in thresholds:
        m = sum(r.mass for r in rows if r.ratio > t) / total
        out[f"mass_over_{t}"] = m
        out[f"p_any_of_{jobs}_over_{t}"] = 1.0 - (1.0 - m) ** jobs
    return out
