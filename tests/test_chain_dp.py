"""The joint-chain DP policy (federation/chain_dp.py) and its model (federation/joint_chain.py): the chain fitted
on dated timelines is the one the Bayes bound fits on the trace, the all-up rule on a step, correlated outages
seen as one event, deadlines met on traces, decisions from the past only, and the live loop's setting."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from broker.config.settings import Settings
from broker.runtime import Runtime
from federation.chain_dp import ChainDP
from federation.joint_chain import EDGES, fit_timelines, grid_up, masks_of, states_of_masks
from federation.model_dp import ModelDP
from federation.policies import build_deadline_policy
from federation.simulate.deadline import DeadlineJob, job_spec, run_deadline
from federation.simulate.information import fit
from federation.simulate.market import TraceMarket
from federation.simulate.optimum import optimum_cost
from federation.simulate.traces import SpotTrace
from federation.strategies import Move, Overspill, Plan, RunState, Timeline, make_strategy, pools
from pricing.book import PriceBook
from providers.model import CapacityType
from tests.builders import future_randomised

T = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_timeline_keeps_only_the_changes() -> None:
    at = [T + timedelta(minutes=m) for m in (0, 5, 10, 20, 25)]
    line = Timeline.of(zip(at, (True, True, False, True, True), strict=True))
    assert line == Timeline(T, True, (600.0, 1200.0))
    assert Timeline.of([]) is None


def test_a_step_is_up_only_if_the_pool_is_up_for_all_of_it() -> None:
    """Up from 0, down at 10 min, up at 20 min; 15-minute steps: [0, 15) holds the drop and [15, 30) the return,
    so both are down; [30, 45) is up. Without the return, the pool stays down."""
    line = Timeline(T, True, (600.0, 1200.0))
    assert grid_up(line, T, 3, 900).tolist() == [False, False, True]
    assert grid_up(Timeline(T, True, (600.0,)), T, 3, 900).tolist() == [False, False, False]
    assert grid_up(line, T + timedelta(minutes=30), 2, 900).tolist() == [True, True]
    # a flip exactly at a step's end belongs to the next step
    assert grid_up(Timeline(T, True, (900.0,)), T, 2, 900).tolist() == [True, False]
    with pytest.raises(ValueError, match="before the pool's history"):
        grid_up(line, T - timedelta(minutes=15), 1, 900)


def _random_trace(seed: int, n: int = 600, correlated: bool = False, region: str = "tr-1") -> SpotTrace:
    """Three zones of `region` on 5-minute ticks; `correlated`: b and c go down whenever a does (a region-wide
    shortage)."""
    rng = random.Random(seed)
    bits = {}
    for z in (f"{region}a", f"{region}b", f"{region}c"):
        out, up = [], rng.random() < 0.5
        while len(out) < n:
            out += ["1" if up else "0"] * rng.choice([2, 5, 9, 20, 40] if up else [1, 3, 6, 12])
            up = not up
        bits[z] = "".join(out[:n])
    if correlated:
        a = bits[f"{region}a"]
        for z in (f"{region}b", f"{region}c"):
            bits[z] = "".join(x if y == "1" else "0" for x, y in zip(bits[z], a, strict=True))
    prices = {f"{region}a": 1.0, f"{region}b": 1.2, f"{region}c": 1.1}
    return SpotTrace.from_bits(bits, prices, on_demand_usd=3.0, gap_seconds=300)


@pytest.mark.parametrize("seed", range(3))
def test_the_chain_fitted_on_timelines_is_the_bayes_bounds_chain_of_the_trace(seed: int) -> None:
    """The strategy sees the pools only through the outlook's timelines; fitted on them to the end of the trace,
    its chain is exactly `information.fit` on the trace (coarsened to 15 minutes, all-up rule)."""
    t = _random_trace(seed)
    n = len(t) - len(t) % 3
    look = TraceMarket(t).outlook(n - 1)
    lines = [look[k].timeline for k in sorted(look)]
    assert all(line is not None for line in lines)
    matrix, steps = fit_timelines(lines, t.at(n), 900.0, EDGES, 0.1)  # type: ignore[arg-type]
    expected = fit(t, [z.zone for z in t.zones], 0, n, EDGES, 0.1, 900)
    assert steps == n // 3
    np.testing.assert_allclose(matrix, expected.transition, rtol=0, atol=1e-12)


def test_correlated_outages_are_one_event_in_the_joint_chain() -> None:
    """b and c go down whenever a does: from 'all up', the chain counts no move to 'a down, b and c up' (only
    the pseudo-count is left), while independent chains would give it the product of the marginals."""
    t = _random_trace(4, n=3000, correlated=True)
    n = len(t)
    look = TraceMarket(t).outlook(n - 1)
    lines = [look[k].timeline for k in sorted(look)]  # key order: tr-1a, tr-1b, tr-1c -> bits 0, 1, 2
    matrix, steps = fit_timelines(lines, t.at(n), 900.0, EDGES, 0.0)  # type: ignore[arg-type]
    nb = len(EDGES)
    up = np.array([grid_up(line, t.start_at, steps, 900.0) for line in lines])  # type: ignore[arg-type]
    visited = set(states_of_masks(masks_of(up), EDGES)[:-1].tolist())
    all_up = [0b111 * nb + b for b in range(nb) if 0b111 * nb + b in visited]  # (pseudo 0: unvisited rows are flat)
    assert all_up
    only_a_down = 0b110 * nb
    assert matrix[all_up][:, only_a_down].max() == 0.0
    a_down_moves = matrix[all_up][:, [m * nb for m in range(8) if not m & 1]].sum(axis=1)
    assert a_down_moves.max() > 0  # a does go down from 'all up'...
    assert matrix[all_up][:, [0b000 * nb, 0b010 * nb, 0b100 * nb]].sum() > 0  # ...and takes b and c with it


@pytest.mark.parametrize("seed", range(3))
def test_on_random_traces_it_meets_every_deadline_and_the_dp_decides(seed: int) -> None:
    t = _random_trace(seed, n=1400, correlated=seed == 2)
    m = TraceMarket(t)
    policy = ChainDP(restart_hours=0.25, min_history_hours=24.0)
    seen: set[str] = set()
    for start, work, dl in ((600, 120, 200), (800, 60, 150), (1000, 100, 130)):  # 5-minute ticks
        job = DeadlineJob(f"j{start}", start, work, dl, 3, checkpoint_ticks=6)
        for notice in ({"aws": 120.0}, {}):
            run = run_deadline(m, job, policy, record=True, notice_seconds=notice)
            assert run.met_deadline, (seed, start, notice)
            assert run.cost_usd >= optimum_cost(t, job) - 1e-9
            seen.update(mv.split(":")[1] for mv in run.moves)
    assert policy.stats.get("prepare_solves", 0) > 0  # the DP was asked, not only its fallback
    assert "launch" in seen


@pytest.mark.parametrize("seed", range(2))
def test_decisions_use_only_the_past_perturbing_the_future_changes_nothing_before_it(seed: int) -> None:
    t = _random_trace(seed, n=1000)
    job = DeadlineJob("j", 600, 60, 150, 3, checkpoint_ticks=6)
    cut = 600 + 60
    other = future_randomised(t, cut, seed + 50)
    kw = {"restart_hours": 0.25, "min_history_hours": 24.0}
    policy = ChainDP(**kw)
    a = run_deadline(TraceMarket(t), job, policy, record=True)
    b = run_deadline(TraceMarket(other), job, ChainDP(**kw), record=True)
    k = cut - job.start_tick
    assert a.moves[:k] == b.moves[:k] and len(a.moves) > k
    assert policy.stats.get("prepare_solves", 0) > 0


def test_without_enough_history_it_decides_as_overspill() -> None:
    t = _random_trace(7, n=400)
    m = TraceMarket(t)
    job = DeadlineJob("j", 100, 60, 150, 3, checkpoint_ticks=6)  # 8 h 20 min of history, 72 h needed
    ours = run_deadline(m, job, Overspill(restart_hours=0.25), record=True)
    policy = ChainDP(restart_hours=0.25)
    dp = run_deadline(m, job, policy, record=True)
    assert dp.moves == ours.moves
    assert policy.stats.get("prepare_solves", 0) == 0


def test_where_a_reclaim_loses_work_the_dp_decides_unless_told_not_to() -> None:
    """No usable notice (a reclaim loses the work since the last checkpoint): the DP decides, with the job's
    checkpoint phase in its tables; with `with_loss` off, or when its chain holds only some of the pools (here 2
    of 3), `Overspill` does. With the AWS notice, one phase, also on 2 of 3 pools."""
    t = _random_trace(1, n=1000)
    m = TraceMarket(t)
    job = DeadlineJob("j", 600, 60, 150, 3, checkpoint_ticks=6)
    ours = run_deadline(m, job, Overspill(restart_hours=0.25), record=True, notice_seconds={})
    aws = {"aws": 120.0}
    cases = (({}, False, 4, None), (aws, False, 4, 1), ({}, True, 4, 2), ({}, True, 2, None), (aws, True, 2, 1))
    for notice, with_loss, zones, phases in cases:
        policy = ChainDP(restart_hours=0.25, min_history_hours=24.0, with_loss=with_loss, max_zones=zones)
        run = run_deadline(m, job, policy, record=True, notice_seconds=notice)
        assert run.met_deadline
        assert {k[-1] for k in policy._tables} == (set() if phases is None else {phases}), (notice, with_loss, zones)
        if phases is None:
            assert run.moves == ours.moves


def test_the_deadline_policy_is_chosen_by_name_with_a_clear_error() -> None:
    assert isinstance(build_deadline_policy("chain_dp", 0.25), ChainDP)
    assert isinstance(make_strategy("chain_dp", restart_hours=0.25), ChainDP)
    with pytest.raises(ValueError, match=r"'nope' is not one of: chain_dp, .*overspill"):
        build_deadline_policy("nope", 0.25)


def test_the_broker_setting_picks_the_policy_once_per_process(
    tmp_path: Path, db_url: str, make_runtime: Callable[..., Runtime]
) -> None:
    """`OVERSPILL_DEADLINE_POLICY` names the live loop's deadline policy; an unknown name is refused at start-up
    naming the setting and the choices; the runtime builds the policy once, so a DP's tables outlive a tick."""
    with pytest.raises(ValidationError, match=r"deadline_policy[\s\S]*'nope' is not one of: chain_dp"):
        Settings(data_dir=tmp_path, deadline_policy="nope")
    rt = make_runtime(db_url, deadline_policy="chain_dp", restart_hours=0.25)
    policy = rt.deadline_strategy()
    assert isinstance(policy, ChainDP) and policy.restart_hours == 0.25
    assert rt.deadline_strategy() is policy
    assert isinstance(make_runtime(db_url).deadline_strategy(), Overspill)


def test_a_pool_outside_the_dps_set_that_is_up_is_left_to_overspill() -> None:
    """With one pool in the DP's world (`max_zones` 1) and three in the market: the DP never waits or stays on
    on-demand while another spot pool is up (those decisions are `Overspill`'s), and it does decide otherwise."""
    t = _random_trace(2, n=1000)
    m = TraceMarket(t)
    policy = ChainDP(restart_hours=0.25, min_history_hours=24.0, max_zones=1)
    seen: list[tuple[str, bool]] = []

    class Spy:
        name = "spy"

        def decide(self, state: RunState, book: PriceBook) -> Plan:
            plan = policy.decide(state, book)
            q = policy._query(state, book, None)
            if q is not None:
                mine = {o.key for o in q.pair}
                outside_up = any(o.key not in mine for o in pools(state, book, frozenset({CapacityType.SPOT})))
                cautious = plan.move is Move.WAIT or (
                    plan.offering is not None and plan.offering.capacity_type is CapacityType.ON_DEMAND
                )
                if plan.strategy == "chain_dp" and cautious:
                    assert not outside_up
                seen.append((plan.strategy, outside_up))
            return plan

        def prepare(self, *args: object) -> int:
            return policy.prepare(*args)  # type: ignore[arg-type]

    for start in (600, 700, 800):
        job = DeadlineJob(f"j{start}", start, 60, 150, 3, checkpoint_ticks=6)
        assert run_deadline(m, job, Spy(), notice_seconds={"aws": 120.0}).met_deadline  # type: ignore[arg-type]
    assert ("chain_dp", False) in seen and ("overspill", True) in seen


@pytest.mark.parametrize("factory", [ChainDP, ModelDP])
def test_a_table_too_big_for_its_memory_cap_is_not_solved(factory: type[ModelDP]) -> None:
    """A job with a deadline weeks away would need a table of gigabytes: beyond `max_table_cells` the DP
    policies leave the decision to `Overspill` instead of allocating it (here with a cap that any table passes)."""
    t = _random_trace(1, n=1000)
    m = TraceMarket(t)
    job = DeadlineJob("j", 600, 60, 150, 3, checkpoint_ticks=6)
    notice = {"aws": 120.0}
    ours = run_deadline(m, job, Overspill(restart_hours=0.25), record=True, notice_seconds=notice)
    kw = {"restart_hours": 0.25, "min_history_hours": 24.0} if factory is ChainDP else {"restart_hours": 0.25}
    capped = factory(max_table_cells=1000, **kw)  # type: ignore[arg-type]
    run = run_deadline(m, job, capped, record=True, notice_seconds=notice)
    assert capped.stats == {} and run.moves == ours.moves
    free = factory(**kw)  # type: ignore[arg-type]
    run_deadline(m, job, free, record=True, notice_seconds=notice)
    assert free.stats.get("prepare_solves", 0) > 0


def test_prices_on_a_grid_reuse_a_table_for_small_moves() -> None:
    from federation.chain_dp import _on_grid

    assert _on_grid(0.918, 0.05) == _on_grid(0.925, 0.05)  # a 0.8% move: the same table
    assert _on_grid(0.918, 0.05) != _on_grid(0.918 * 1.06, 0.05)  # a step further: another
    assert abs(_on_grid(0.918, 0.05) / 0.918 - 1) <= 0.025
    assert _on_grid(0.918, 0.0) == 0.918


def test_at_the_live_loops_tick_a_multi_day_job_still_gets_a_table() -> None:
    """The live loop ticks every 10 s with a 6-minute changeover: planned on that unit, 48 h of work due in 70 h
    would need a table over the memory cap; the planning unit is at least 15 minutes, so it is solved."""
    t = _random_trace(1, n=2000)
    m = TraceMarket(t)
    tick = 1500
    job = DeadlineJob("j", tick, 48 * 12, 70 * 12, 3)
    state = RunState(
        job=job_spec(m, job),
        now=t.at(tick),
        started_at=t.at(tick),
        remaining_work_hours=Decimal(48),
        tick_hours=10 / 3600,
        outlook=m.outlook(tick),
        notice_seconds={"aws": 120.0},
    )
    kw = {"restart_hours": 0.1, "min_history_hours": 24.0, "max_table_cells": 10_000_000}
    q = ChainDP(**kw)._query(state, m.book(tick), None)  # type: ignore[arg-type]
    assert q is not None and q.work == 48 * 4 and q.sigma == 22 * 4  # 289 x 97 x 5 x 32 cells: 4.5 M
    fine = ChainDP(**kw, min_unit_hours=0.0)  # type: ignore[arg-type]
    assert fine._query(state, m.book(tick), None) is None  # 6-minute units: 529 x 225 x 5 x 32 = 19 M


def test_a_tick_solves_at_most_its_budget_of_tables_inline_and_the_rest_wait_for_a_later_tick() -> None:
    """As the live loop calls it (no `prepare`), a decision needing an unsolved table solves it inline, but at most
    `max_inline_solves_per_tick` per moment: with a budget of 1, jobs of two regions (two worlds) at one moment get
    one DP decision and one `Overspill` decision; at the next moment the second table is solved."""
    markets = [TraceMarket(_random_trace(1, n=1000, region=r)) for r in ("tr-1", "tr-2")]
    policy = ChainDP(restart_hours=0.25, min_history_hours=24.0, max_inline_solves_per_tick=1)

    def decide(m: TraceMarket, tick: int) -> str:
        job = DeadlineJob("j", tick, 60, 150, 3)
        state = RunState(
            job=job_spec(m, job),
            now=m.trace.at(tick),
            started_at=m.trace.at(tick),
            remaining_work_hours=Decimal(5),
            tick_hours=m.trace.gap_hours,
            outlook=m.outlook(tick),
            notice_seconds={"aws": 120.0},
        )
        return policy.decide(state, m.book(tick)).strategy

    assert [decide(m, 700) for m in markets] == ["chain_dp", "overspill"]
    assert policy.stats == {"inline_solves": 1, "inline_deferred": 1}
    assert [decide(m, 701) for m in markets] == ["chain_dp", "chain_dp"]
    assert policy.stats == {"inline_solves": 2, "inline_deferred": 1}
