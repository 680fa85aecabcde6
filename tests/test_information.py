"""The price of information (`federation.simulate.information`): the joint availability chain, the exact Bayes DP
against an expectimax written from the definition, and the bounds that make V* meaningful (hindsight optimum
below it in expectation, its greedy policy achieving it, a real policy above it)."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from federation.joint_chain import allowed
from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.information import (
    FEASIBLE,
    IDLE,
    KEEP,
    JointChain,
    by_start_state,
    coarsen,
    fit,
    restrict,
    restricted_states,
    run_bayes,
    sample_path,
    solve,
    solve_values,
    start_state_summary,
    states_of,
    to_trace,
)
from federation.simulate.market import TraceMarket
from federation.simulate.optimum import optimum_cost
from federation.strategies import NON_SPOT, Move, Plan, make_strategy, pools
from providers.model import CapacityType
from tests.data import shared_file

ZONES = ("us-east-1a", "us-east-1c")


def tiny_chain(edges: tuple[int, ...], seed: int, spot: tuple[float, float] = (1.0, 1.6)) -> JointChain:
    """A random chain with the structure `fit` produces (2 zones), on-demand $3.06/h."""
    rng = np.random.default_rng(seed)
    ok = allowed(edges, 2)
    raw = np.where(ok, rng.random(ok.shape) + 0.05, 0.0)
    nb = len(edges)
    for c in range(ok.shape[0]):  # make staying likelier than switching, like a real market
        stay = [d for d in (c, c + 1) if d < ok.shape[0] and ok[c, d] and d // nb == c // nb]
        raw[c, stay] *= 6
    return JointChain(
        ZONES,
        ("us-east-1", "us-east-1"),
        edges,
        raw / raw.sum(axis=1, keepdims=True),
        spot,
        {"us-east-1": 3.06},
    )


def expectimax(chain: JointChain, job: DeadlineJob, start_state: int) -> float:
    """V* from the definition: at each tick see the chain state, reclaim a spot pool whose zone is down, pick
    the action minimising this tick's bill plus the expected value of the next tick; a miss is infinite."""
    h = chain.step_seconds / 3600
    cost = [3.06 * h] + [p * h for p in chain.spot_usd]
    up = chain.up()
    k = job.restart_ticks
    P = chain.transition

    @cache
    def v(t: int, remaining: int, pool: int | None, left: int, c: int) -> float:
        if remaining == 0:
            return 0.0
        if t == job.deadline_ticks:
            return math.inf
        if pool is not None and pool > 0 and not up[c, pool - 1]:
            pool, left = None, 0
        choices: list[tuple[int | None, int]] = [(None, 0)]
        if pool is not None:
            choices.append((pool, left))
        choices += [(p, k) for p in range(len(cost)) if p == 0 or up[c, p - 1]]
        best = math.inf
        for p, lf in choices:
            bill, rem, nl = 0.0, remaining, lf
            if p is not None:
                bill = cost[p]
                if nl > 0:
                    nl -= 1
                else:
                    rem -= 1
            total = bill
            for d in range(chain.states):
                if P[c, d] > 0:
                    total += P[c, d] * v(t + 1, rem, p, nl, d)
            best = min(best, total)
        return best

    return v(0, job.work_ticks, None, 0, start_state)


@pytest.mark.parametrize(
    ("edges", "work", "deadline", "restart"), [((1,), 3, 6, 1), ((1, 2), 4, 6, 1), ((1, 2), 3, 7, 2)]
)
def test_the_table_is_the_expectimax_of_the_definition(edges, work, deadline, restart) -> None:
    chain = tiny_chain(edges, seed=len(edges) * 10 + work)
    table = solve(chain, deadline, deadline - work, restart)
    job = DeadlineJob("j", 0, work, deadline, restart)
    for c in range(chain.states):
        want = expectimax(chain, job, c)
        got = table.value(job, c)
        if math.isinf(want):
            assert got >= FEASIBLE
        else:
            assert got == pytest.approx(want, rel=1e-9)
    # a job with no slack for a changeover has no safe policy
    tight = DeadlineJob("t", 0, deadline, deadline, restart)
    assert all(math.isinf(expectimax(chain, tight, c)) for c in range(chain.states))
    assert min(table.value(tight, c) for c in range(chain.states)) >= FEASIBLE


def test_fit_counts_the_coarsened_trace_and_sampling_reproduces_it() -> None:
    from federation.simulate.traces import SpotTrace

    # 5-minute ticks; a step of 15 min is up only if all three ticks are up
    bits_a = "111110111111000111" * 1
    bits_c = "000000111111111111"
    trace = SpotTrace.from_bits(
        {"us-east-1a": bits_a, "us-east-1c": bits_c}, {"us-east-1a": 1.0, "us-east-1c": 2.0}, 3.06, 300
    )
    coarse = coarsen(trace)
    assert coarse.gap_seconds == 900
    assert [z.available for z in coarse.zones] == [
        (True, False, True, True, False, True),
        (False, False, True, True, True, True),
    ]
    # masks: a=bit0, c=bit1 -> 1, 0, 3, 3, 2, 3; with edges (1, 2): ages 1,1,1,2,1,1
    assert list(states_of(coarse, (1, 2))) == [2, 0, 6, 7, 4, 6]
    chain = fit(trace, ZONES, edges=(1, 2), pseudo=0.0)
    assert chain.transition[2, 0] == 1.0 and chain.transition[6, 7] == 1.0 and chain.transition[7, 4] == 1.0
    assert chain.spot_usd == (1.0, 2.0)
    # a long sample of a fitted chain has the chain's transition frequencies
    big = tiny_chain((1, 2, 5), seed=3)
    path = sample_path(big, 40_000, np.random.default_rng(0))
    counts = np.zeros_like(big.transition)
    np.add.at(counts, (path[:-1], path[1:]), 1)
    seen = counts.sum(axis=1) > 2000
    freq = counts[seen] / counts[seen].sum(axis=1, keepdims=True)
    assert np.abs(freq - big.transition[seen]).max() < 0.05
    trace2 = to_trace(big, path[:10])
    assert trace2.zones[0].available == tuple(bool(x) for x in big.up()[path[:10], 0])


class Scripted:
    """Replays a fixed list of `run_bayes` actions through `run_deadline` (KEEP, IDLE, or a pool to launch)."""

    name = "scripted"

    def __init__(self, actions: tuple[int, ...], zones: tuple[str, ...]) -> None:
        self.actions = list(actions)
        self.zones = zones

    def decide(self, state, book) -> Plan:
        a = self.actions.pop(0)
        if a == KEEP:
            return Plan(Move.KEEP, "", self.name, state.current)
        if a == IDLE:
            return Plan(Move.WAIT, "", self.name)
        if a == 0:
            return Plan(Move.LAUNCH, "", self.name, pools(state, book, NON_SPOT)[0])
        spot = [o for o in pools(state, book, frozenset({CapacityType.SPOT})) if o.zone == self.zones[a - 1]]
        return Plan(Move.LAUNCH, "", self.name, spot[0])


def _world(seed: int = 7, restart: int = 1):
    chain = tiny_chain((1, 2, 5), seed=seed, spot=(0.9, 1.2))
    job = DeadlineJob("j", 0, 16, 24, restart)
    return chain, job, solve(chain, job.deadline_ticks, job.deadline_ticks - job.work_ticks, restart)


@pytest.mark.parametrize("restart", [1, 2])
def test_the_bayes_executor_bills_as_run_deadline_does(restart: int) -> None:
    """Including reclaims during a changeover (with 2-tick changeovers): the same bill, launches and reclaims."""
    chain, job, table = _world(restart=restart)
    rng = np.random.default_rng(1)
    reclaims = 0
    for _ in range(8):
        path = sample_path(chain, 2 * job.deadline_ticks, rng)
        run = run_bayes(table, path, job)
        trace = to_trace(chain, path)
        ref = run_deadline(TraceMarket(trace), job, Scripted(run.actions, chain.zones))
        assert ref.met_deadline == run.met_deadline
        assert ref.cost_usd == pytest.approx(run.cost_usd, abs=1e-9)
        assert ref.preemptions == run.preemptions and ref.launches == run.launches
        reclaims += run.preemptions
    assert reclaims > 0  # the paths exercised the reclaim rule


def test_v_star_sits_between_the_hindsight_optimum_and_any_causal_policy() -> None:
    chain, job, table = _world()
    rng = np.random.default_rng(2024)
    pi = chain.stationary()
    warm = 96  # history for `overspill`'s outlook
    late = DeadlineJob("j", warm, job.work_ticks, job.deadline_ticks, 1)
    overspill = make_strategy("overspill", restart_hours=0.25)
    opt, bayes, ours, vstar = [], [], [], []
    for _ in range(300):
        path = sample_path(chain, warm + 2 * job.deadline_ticks, rng)
        trace = to_trace(chain, path)
        opt.append(optimum_cost(trace, late))
        run = run_bayes(table, path, late)
        assert run.met_deadline
        bayes.append(run.cost_usd)
        vstar.append(table.value(job, int(path[warm])))
        r = run_deadline(TraceMarket(trace), late, overspill)
        assert r.met_deadline
        ours.append(r.cost_usd)
    n = len(opt)

    def se(x: list[float]) -> float:
        return float(np.std(x, ddof=1)) / math.sqrt(n)

    v = table.expected_value(job, pi)
    assert abs(np.mean(vstar) - v) < 4 * se(vstar) + 1e-9  # the start states are stationary draws
    assert np.mean(opt) <= v + 3 * se(opt)  # hindsight cannot do worse than the best causal policy
    assert np.mean(opt) < np.mean(bayes)  # ... and here it does strictly better
    diff = np.asarray(bayes) - np.asarray(vstar)  # the greedy policy on the table achieves V*
    assert abs(diff.mean()) < 4 * diff.std(ddof=1) / math.sqrt(n)
    gap = np.asarray(ours) - np.asarray(vstar)  # no causal policy beats V*
    assert gap.mean() >= -3 * gap.std(ddof=1) / math.sqrt(n)


def test_by_start_state_averages_back_to_the_unconditional_figures() -> None:
    """Stationary-weighted V*(s0) is the V* the benchmark reports; E[opt | s0] averages back to E[opt]."""
    chain, job, table = _world()
    rng = np.random.default_rng(5)
    rows = by_start_state(table, job, 40, rng)
    pi = chain.stationary()
    assert abs(sum(r.mass * r.vstar for r in rows) - table.expected_value(job, pi)) < 1e-9
    assert all(r.opt_mean <= r.vstar + 4 * r.opt_se + 1e-9 for r in rows)  # hindsight beats causal per state
    weighted = sum(r.mass * r.opt_mean for r in rows)
    weighted_se = math.sqrt(sum((r.mass * r.opt_se) ** 2 for r in rows))
    direct = []
    for _ in range(400):  # the unconditional mean, from stationary starts
        path = sample_path(chain, job.deadline_ticks + 1, rng)
        direct.append(optimum_cost(to_trace(chain, path), job))
    direct_se = float(np.std(direct, ddof=1)) / math.sqrt(len(direct))
    assert abs(weighted - np.mean(direct)) < 4 * math.hypot(weighted_se, direct_se)
    summary = start_state_summary(rows, (1.0, 100.0), jobs=51)
    assert summary["worst_ratio"] == max(r.ratio for r in rows) > 1.0
    assert summary["mass_over_100.0"] == 0.0 == summary["p_any_of_51_over_100.0"]
    m = summary["mass_over_1.0"]
    assert 0 < m <= 1 and abs(summary["p_any_of_51_over_1.0"] - (1 - (1 - m) ** 51)) < 1e-12


def test_solve_values_and_restrict_agree_with_the_full_table() -> None:
    """The memory-light solve gives `solve`'s V*; restricting to every mask is the same chain; restricting to
    some masks keeps each kept state's zones and renormalises the rows."""
    chain, job, table = _world()
    other = DeadlineJob("k", 0, 14, 20, 1)
    light = solve_values(chain, [job, other])
    for j in (job, other):
        assert np.allclose(
            light.values[(j.deadline_ticks, j.work_ticks)], [table.value(j, c) for c in range(chain.states)]
        )
    same = restrict(chain, range(4))
    assert np.allclose(same.transition, chain.transition) and (same.up() == chain.up()).all()
    sub = restrict(chain, [3, 1])  # both up, only zone 0 up
    nb = chain.buckets
    assert sub.states == 2 * nb and np.allclose(sub.transition.sum(axis=1), 1.0)
    assert (sub.up()[:nb] == [True, False]).all() and sub.up()[nb:].all()
    assert (restricted_states(sub, np.array([3 * nb + 1, nb, 2 * nb])) == [nb + 1, 0, -1]).all()
    row = chain.transition[nb, [nb + b for b in range(nb)] + [3 * nb + b for b in range(nb)]]
    assert np.allclose(sub.transition[0], row / row.sum())
    v = solve_values(sub, [job]).values[(job.deadline_ticks, job.work_ticks)]
    assert (v > 0).all() and (v < FEASIBLE).all()  # on-demand always meets the deadline


@pytest.mark.integration
def test_the_us_east_1_chain_fits_the_real_trace() -> None:
    from federation.simulate import US_EAST_1
    from federation.simulate.experiments import load_aws_v100_trace

    seg = shared_file("spot-probes-skynomad/aws_v100_p3.2xlarge_avail_price_segments_2023-02-15.csv")
    trace = load_aws_v100_trace(str(seg.parent.parent), 300, US_EAST_1)
    chain = fit(trace, US_EAST_1)
    assert chain.states == 16 * 4
    np.testing.assert_allclose(chain.transition.sum(axis=1), 1.0)
    # the chain's long-run share of time each zone is up matches the coarsened trace's within a few points
    coarse = coarsen(trace)
    share = chain.stationary() @ chain.up()
    real = np.array([np.mean(z.available) for z in coarse.zones])
    assert np.abs(share - real).max() < 0.05
    assert all(0 < p < 3.06 for p in chain.spot_usd)
