"""Where a policy's excess over the optimum comes from (federation/simulate/explain.py): the run ledger
(`DeadlineRun.costs`), the optimum's on-demand hours, and the exact split excess = on-demand $ + spot $."""

from __future__ import annotations

import random

import pytest

from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.experiments import DeadlineConfig, deadline_jobs, halves, run_deadline_chunk
from federation.simulate.explain import explain_jobs, explain_table, summarize
from federation.simulate.market import TraceMarket
from federation.simulate.optimum import optimum_cost, optimum_on_demand_hours
from federation.simulate.traces import SpotTrace
from federation.strategies import make_strategy


def test_run_ledger_splits_the_cost_by_kind_changeover_and_redone_work() -> None:
    """Spot ($1) up t=0..5, down t=6..7, up again; on-demand $3; 1 h ticks, a 1-tick changeover, a checkpoint
    every 4 ticks, no notice. eager_next_region: t=0 changeover, t=1..5 progress (5 ticks, 4 checkpointed, 1
    unsaved), reclaim at t=6 loses that tick ($1); idle t=6..7; t=8 changeover, then 4 ticks of work to t=12."""
    t = SpotTrace.from_bits({"us-east-1a": "111111001111111111111"}, {"us-east-1a": 1.0}, on_demand_usd=3.0)
    run = run_deadline(
        TraceMarket(t),
        DeadlineJob("j", 0, 8, 16, 1, checkpoint_ticks=4),
        make_strategy("eager_next_region"),
        notice_seconds={},
    )
    c = run.costs
    assert c is not None
    assert run.cost_usd == 11.0 and run.lost_hours == 1.0
    assert (c.spot_usd, c.on_demand_usd, c.changeover_usd, c.lost_usd) == (11.0, 0.0, 2.0, 1.0)
    assert c.idle_spot_up_hours == 0.0  # idle only while the one zone was down


def test_on_demand_ledger_counts_hours_bought_while_spot_was_up() -> None:
    t = SpotTrace.from_bits({"us-east-1a": "0011000000"}, {"us-east-1a": 1.0}, on_demand_usd=3.0)
    run = run_deadline(TraceMarket(t), DeadlineJob("j", 0, 4, 6, 1), make_strategy("on_demand"))
    c = run.costs
    assert c is not None
    assert (c.on_demand_usd, c.spot_usd, c.changeover_usd) == (15.0, 0.0, 3.0)
    assert c.on_demand_spot_up_hours == 2.0  # t=2 and t=3


def test_optimum_on_demand_hours_by_hand() -> None:
    never = SpotTrace.from_bits({"us-east-1a": "000000"}, {"us-east-1a": 1.0}, on_demand_usd=3.0)
    assert optimum_on_demand_hours(never, DeadlineJob("a", 0, 3, 6, 1)) == pytest.approx(4.0)  # work + changeover
    always = SpotTrace.from_bits({"us-east-1a": "111111"}, {"us-east-1a": 1.0}, on_demand_usd=3.0)
    assert optimum_on_demand_hours(always, DeadlineJob("b", 0, 3, 6, 1)) == 0.0
    # spot up for the first 2 ticks only: 1 changeover + 1 h of work on spot, then on-demand 1 + 2 h
    half = SpotTrace.from_bits({"us-east-1a": "110000"}, {"us-east-1a": 1.0}, on_demand_usd=3.0)
    job = DeadlineJob("c", 0, 3, 5, 1)
    assert optimum_cost(half, job) == pytest.approx(2 + 9)
    assert optimum_on_demand_hours(half, job) == pytest.approx(3.0)
    assert optimum_on_demand_hours(half, DeadlineJob("d", 0, 6, 6, 1)) == 0.0  # infeasible: nothing to split


@pytest.mark.parametrize("seed", [1, 2])
def test_excess_splits_exactly_into_on_demand_and_spot_on_random_traces(seed: int) -> None:
    rng = random.Random(seed)
    bits = {z: "".join(rng.choice("1110") for _ in range(120)) for z in ("us-east-1a", "us-west-2a")}
    prices = {"us-east-1a": [rng.uniform(0.8, 1.2) for _ in range(120)], "us-west-2a": 0.9}
    t = SpotTrace.from_bits(bits, prices, on_demand_usd=3.0, gap_seconds=1800)
    cfg = DeadlineConfig(
        work_hours=8,
        deadlines_hours=(10, 14),
        restart_hours=0.5,
        start_every_hours=10,
        policies=("on_demand", "greedy_safety_net", "uniform_progress", "overspill"),
        notice=False,
    )
    jobs = deadline_jobs(t, cfg)
    results = run_deadline_chunk(t, jobs, cfg)
    gaps = explain_jobs(t, jobs, results, halves(jobs, len(t)))
    assert len(gaps) == len(jobs) * len(cfg.policies)
    for g in gaps:
        assert g.excess_usd == pytest.approx(g.on_demand_usd + g.spot_usd)
        assert g.excess_usd >= -1e-9 or not g.met_deadline  # nothing that met its deadline beats the optimum
        assert 0 <= g.changeover_usd <= g.cost_usd + 1e-9 and 0 <= g.lost_usd <= g.cost_usd + 1e-9
        assert g.od_spot_up_hours <= g.od_hours + 1e-9 and g.od_forced_hours <= g.od_hours + 1e-9
        if g.policy == "on_demand":  # all on-demand: its spot $ over the optimum is minus the optimum's spot spend
            assert g.od_hours * 3.0 == pytest.approx(g.cost_usd)
            assert g.spot_usd == pytest.approx(-(g.optimum_usd - g.optimum_od_hours * 3.0))
    sums = summarize(gaps)
    for policy, row in sums["all"].items():
        mine = [g for g in gaps if g.policy == policy]
        assert row["excess_usd"] == pytest.approx(sum(g.excess_usd for g in mine))
        assert row["x_optimum"] == pytest.approx(sum(g.cost_usd for g in mine) / sum(g.optimum_usd for g in mine))
    text = explain_table(gaps)
    assert "first half" in text and "worst" in text and "overspill" in text


def test_hindsight_sweep_scores_every_grid_point_and_the_best_is_no_worse_than_the_defaults() -> None:
    from federation.simulate.tuning import grid_points, hindsight_sweep, tuning_report

    rng = random.Random(5)
    bits = {z: "".join(rng.choice("11110") for _ in range(160)) for z in ("us-east-1a", "us-east-1b")}
    t = SpotTrace.from_bits(bits, {"us-east-1a": 1.0, "us-east-1b": 1.2}, on_demand_usd=3.0, gap_seconds=1800)
    cfg = DeadlineConfig(work_hours=8, deadlines_hours=(10, 14), restart_hours=0.5, start_every_hours=6)
    grid = {"pace": (0.5, 0.75), "return_factor": (1.0, 2.5)}
    assert len(grid_points(grid)) == 4
    second = hindsight_sweep(t, cfg, "second", grid=grid)
    first = hindsight_sweep(t, cfg, "first", grid=grid)
    assert len(second) == len(first) == 4
    assert all(r.x_optimum >= 1 - 1e-9 for r in second if r.all_met)  # nothing meets its deadlines below the optimum
    assert [r.x_optimum for r in second if r.all_met] == sorted(r.x_optimum for r in second if r.all_met)
    default = next(r for r in second if dict(r.params) == {"pace": 0.75, "return_factor": 2.5})
    best = next(r for r in second if r.all_met)
    assert best.x_optimum <= default.x_optimum
    # the shipped policy on the same jobs scores what the default grid point scores
    jobs = deadline_jobs(t, cfg)
    split = halves(jobs, len(t))
    results = run_deadline_chunk(t, [j for j, h in zip(jobs, split, strict=True) if h == "second"], cfg)
    runs = [next(r for r in rs if r.policy == "overspill") for _, rs in results]
    assert sum(r.cost_usd for r in runs) / sum(o for o, _ in results) == pytest.approx(default.x_optimum)
    text, doc = tuning_report(first, second)
    assert "hindsight" in text and doc["points"] == 4
