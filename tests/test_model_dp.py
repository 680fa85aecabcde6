"""The expected-value DP policy on the availability model's state space (federation/model_dp.py): its solver against
a brute-force expectimax on a tiny model, its deadlines on traces, and that it decides from the past only."""

from __future__ import annotations

import functools
import itertools
import math
import random

import numpy as np
import pytest

from federation.model_dp import (
    IDLE,
    OD,
    ModelDP,
    PoolChain,
    chain_from_hazards,
    joint,
    pool_chain,
    solve_world,
    world_of,
)
from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.market import TraceMarket
from federation.simulate.optimum import optimum_cost
from federation.simulate.traces import SpotTrace
from federation.strategies import PoolOutlook, RunLengths, make_strategy
from tests.builders import future_randomised
from tests.data import shared_file


def tiny_chain(price: float, seed: int) -> PoolChain:
    """Two up buckets and one down bucket, hazards drawn at random (quantised as the policy quantises them)."""
    rng = random.Random(seed)
    hz = lambda: round(math.log(rng.uniform(0.05, 0.7)) * 8)  # noqa: E731
    return chain_from_hazards([hz(), hz()], [hz()], (0.0, 1.0), (0.0,), price, 1.0)


def brute_force(
    chains: list[PoolChain], od: float, phases: int, tau: int, sigma: int, mode: int, phase: int, states: tuple
) -> float:
    """Expectimax straight from the model's definition, one state at a time (no vectorisation, no shared
    arrays): the least expected cost to finish `tau - sigma` units of work within `tau` units, for a job that
    checkpoints every `phases` units of progress on a spot pool and is `phase` units past its last checkpoint."""

    @functools.cache
    def value(tau: int, sigma: int, mode: int, phase: int, states: tuple[int, ...]) -> float:
        if sigma < 0:
            return math.inf
        if tau - sigma <= 0:
            return 0.0
        if mode >= 2 and not chains[mode - 2].up[states[mode - 2]]:  # reclaimed: the unsaved work is done again
            return value(tau, sigma - phase, IDLE, 0, states)
        nexts = []
        for nxt in itertools.product(*(range(len(c.up)) for c in chains)):
            p = math.prod(float(c.matrix[a, b]) for c, a, b in zip(chains, states, nxt, strict=True))
            if p > 0:
                nexts.append((p, nxt))

        def expect(sig: int, m: int, ph: int) -> float:
            vals = [(p, value(tau - 1, sig, m, ph, nxt)) for p, nxt in nexts]
            if any(math.isinf(v) for _, v in vals):
                return math.inf
            return sum(p * v for p, v in vals)

        options = [expect(sigma - 1, IDLE, 0)]  # wait (a chosen stop saves first)
        options.append(od * 1.0 + expect(sigma if mode == OD else sigma - 1, OD, 0))
        for i, c in enumerate(chains):
            if c.up[states[i]]:
                kept = mode == 2 + i
                ph = (phase + 1) % phases if kept else 0  # a unit of progress, or a launch (which saved first)
                options.append(c.price + expect(sigma if kept else sigma - 1, 2 + i, ph))
        return min(options)

    return value(tau, sigma, mode, phase, states)


@pytest.mark.slow(20)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("phases", [1, 2, 3])
def test_the_dp_value_is_the_brute_force_expectimax_on_a_tiny_model(seed: int, phases: int) -> None:
    chains = [tiny_chain(1.0, seed), tiny_chain(1.4, seed + 100)]
    levels, slack = 7, 4
    table = solve_world(world_of(chains), 3.0, 1.0, phases, levels, slack, keep_values=True)
    checked = finite = 0
    for tau in range(levels + 1):
        for sigma in range(min(slack, tau) + 1):
            for mode in range(4):
                for phase in range(phases if mode >= 2 else 1):
                    for states in itertools.product(range(3), range(3)):
                        if mode >= 2 and not chains[mode - 2].up[states[mode - 2]]:
                            continue  # not a state a decision starts from (a reclaimed job is idle)
                        want = brute_force(chains, 3.0, phases, tau, sigma, mode, phase, states)
                        j = states[0] * 3 + states[1]
                        got = table.values[tau][sigma, mode, phase, j]
                        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (tau, sigma, mode, phase, states)
                        assert (table.action[tau, sigma, mode, phase, j] >= 0) == math.isfinite(want)
                        checked += 1
                        finite += math.isfinite(want) and want > 0
    assert checked > 500 and finite > 200  # the comparison covered real, feasible, costly states


def test_work_since_the_checkpoint_is_worth_keeping_on_a_risky_pool() -> None:
    """Without a notice, a job one unit past its checkpoint on a pool likely to be reclaimed expects more cost
    than one just checkpointed, and with the notice (one phase) the two are the same state."""
    chains = [tiny_chain(1.0, 7), tiny_chain(1.4, 8)]
    for phases in (1, 3):
        table = solve_world(world_of(chains), 3.0, 1.0, phases, 8, 4, keep_values=True)
        up = next(j for j in range(9) if chains[0].up[j // 3] and chains[1].up[j % 3])
        fresh, unsaved = (table.values[8][2, 2, k, up] for k in (0, min(1, phases - 1)))
        assert bool(unsaved > fresh + 1e-9) is (phases > 1), (phases, fresh, unsaved)


def test_the_chain_follows_the_history_age_dependence() -> None:
    """Up runs of 0.25 h, 0.25 h, 0.25 h and 8 h: a fresh run mostly ends within the unit, one up for 2 h
    (only the 8 h runs got there) mostly goes on."""
    look = PoolOutlook(True, 0.0, RunLengths.of([0.25] * 9 + [8.0] * 3), RunLengths.of([1.0] * 6))
    c = pool_chain(look, 1.0, 0.25)
    fresh, aged = c.state_of(True, 0.0), c.state_of(True, 2.0)
    down0 = c.state_of(False, 0.0)
    assert c.matrix[fresh, down0] > 0.5 > c.matrix[aged, down0]
    assert np.allclose(c.matrix.sum(axis=1), 1.0)
    m, ups = joint([c, c])
    assert m.shape == (100, 100) and np.allclose(m.sum(axis=1), 1.0) and ups[0].sum() == 60


def _random_trace(seed: int, n: int = 260) -> SpotTrace:
    rng = random.Random(seed)
    bits = {}
    for z in ("us-east-1a", "us-east-1b", "us-east-1c"):
        out, up = [], rng.random() < 0.5
        while len(out) < n:
            out += ["1" if up else "0"] * rng.choice([1, 1, 2, 3, 8] if up else [1, 2, 4])
            up = not up
        bits[z] = "".join(out[:n])
    prices = {"us-east-1a": 1.0, "us-east-1b": 1.2, "us-east-1c": 1.1}
    return SpotTrace.from_bits(bits, prices, on_demand_usd=3.0, gap_seconds=3600)


@pytest.mark.slow(20)
@pytest.mark.parametrize("seed", range(4))
def test_on_random_traces_it_meets_every_deadline_and_never_beats_the_optimum(seed: int) -> None:
    t = _random_trace(seed)
    m = TraceMarket(t)
    seen: set[str] = set()
    for start, work, dl in ((150, 20, 28), (160, 30, 36), (170, 10, 40)):
        job = DeadlineJob(f"j{start}", start, work, dl, 1, checkpoint_ticks=2)
        for notice in ({"aws": 120.0}, {}):
            run = run_deadline(m, job, _Spy(ModelDP(restart_hours=1.0), seen), record=True, notice_seconds=notice)
            assert run.met_deadline, (seed, start, notice)
            assert run.cost_usd >= optimum_cost(t, job) - 1e-9
    assert "model_dp" in seen  # the DP made decisions, not only its fallback


class _Spy:
    name = "spy"

    def __init__(self, inner: ModelDP, seen: set[str]) -> None:
        self.inner, self.seen = inner, seen

    def decide(self, state, book):  # type: ignore[no-untyped-def]
        plan = self.inner.decide(state, book)
        self.seen.add(plan.strategy)
        return plan


@pytest.mark.parametrize("seed", range(3))
def test_decisions_use_only_the_past_perturbing_the_future_changes_nothing_before_it(seed: int) -> None:
    t = _random_trace(seed)
    job = DeadlineJob("j", 150, 24, 40, 1, checkpoint_ticks=2)
    cut = 150 + 12
    other = future_randomised(t, cut, seed + 50)
    assert any(a.available[cut:] != b.available[cut:] for a, b in zip(t.zones, other.zones, strict=True))
    a = run_deadline(TraceMarket(t), job, ModelDP(restart_hours=1.0), record=True)
    b = run_deadline(TraceMarket(other), job, ModelDP(restart_hours=1.0), record=True)
    n = cut - job.start_tick
    assert a.moves[:n] == b.moves[:n] and len(a.moves) > n
    assert any("spot" in mv for mv in a.moves[:n])


def test_with_prepare_every_decision_is_a_look_up_and_tables_are_shared_across_jobs() -> None:
    """`run_deadline` calls `prepare` before each decision: no table is solved inside `decide`, and a job whose
    tables another job already needed solves none."""
    t = _random_trace(3)
    m = TraceMarket(t)
    dp = ModelDP(restart_hours=1.0)
    job = DeadlineJob("j", 150, 20, 34, 1, checkpoint_ticks=2)
    first = run_deadline(m, job, dp, record=True)
    solved = dp.stats.get("prepare_solves", 0)
    assert solved > 0 and dp.stats.get("inline_solves", 0) == 0
    again = run_deadline(m, DeadlineJob("k", 150, 20, 34, 1, checkpoint_ticks=2), dp, record=True)
    assert dp.stats["prepare_solves"] == solved and dp.stats.get("inline_solves", 0) == 0
    assert again.moves == first.moves


@pytest.mark.parametrize("seed", range(3))
def test_the_model_is_refitted_per_epoch_so_decisions_do_not_depend_on_which_jobs_ran_before(seed: int) -> None:
    """Chains are fitted once per `refit_hours` on the history as of the epoch's start (not on whatever a first
    job saw in it), so a job's decisions are the same on a fresh policy and after other jobs."""
    t = _random_trace(seed)
    m = TraceMarket(t)
    job = DeadlineJob("j", 100, 20, 34, 1, checkpoint_ticks=2)
    kw = {"restart_hours": 1.0, "refit_hours": 48.0, "prior_weight": 1.0}
    fresh = run_deadline(m, job, ModelDP(**kw), record=True)
    used = ModelDP(**kw)
    for start in (80, 90):  # both start inside the epoch of the job's start (72 h to 120 h of the trace)
        run_deadline(m, DeadlineJob(f"o{start}", start, 12, 30, 1, checkpoint_ticks=2), used)
    after = run_deadline(m, job, used, record=True)
    assert after.moves == fresh.moves
    assert any("spot" in mv for mv in fresh.moves)


def test_without_history_it_decides_as_overspill() -> None:
    t = _random_trace(7)
    m = TraceMarket(t)
    job = DeadlineJob("j", 0, 10, 16, 1)
    ours = run_deadline(m, job, make_strategy("overspill", restart_hours=1.0), record=True, outlook=False)
    dp = run_deadline(m, job, ModelDP(restart_hours=1.0), record=True, outlook=False)
    assert dp.moves == ours.moves


@pytest.mark.integration
@pytest.mark.slow(45)
def test_real_us_east_1_slice_meets_every_deadline() -> None:
    """The tight (52 h) and loose (70 h) jobs of a stretch of the real AWS V100 trace, us-east-1's 4 zones,
    with and without the interruption notice."""
    from federation.simulate import US_EAST_1
    from federation.simulate.experiments import DeadlineConfig, deadline_jobs, load_aws_v100_trace

    seg = shared_file("spot-probes-skynomad/aws_v100_p3.2xlarge_avail_price_segments_2023-02-15.csv")
    t = load_aws_v100_trace(str(seg.parent.parent), 300, US_EAST_1)
    jobs = [j for j in deadline_jobs(t, DeadlineConfig()) if j.name in ("52h@96h", "52h@384h", "70h@216h")]
    m = TraceMarket(t)
    for job in jobs:
        for notice in ({"aws": 120.0}, {}):
            run = run_deadline(m, job, ModelDP(), notice_seconds=notice)
            assert run.met_deadline, (job.name, notice)
            assert run.cost_usd >= optimum_cost(t, job) - 1e-6
