"""The forecasting policy (federation/forecast.py): its DP against the exact optimum, its availability sampler,
its fallback without history, and its runs on traces."""

from __future__ import annotations

import random

import numpy as np
import pytest

from federation.forecast import Forecast, sample_runs, solve
from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.market import TraceMarket
from federation.simulate.optimum import optimum_cost
from federation.simulate.traces import SpotTrace
from federation.strategies import PoolOutlook, RunLengths, make_strategy


@pytest.mark.parametrize("seed", range(6))
def test_the_planners_dp_is_the_exact_optimum_in_a_known_future(seed: int) -> None:
    rng = random.Random(seed)
    n = 24
    zones = {z: "".join(rng.choice("1110") for _ in range(n + 3)) for z in ("us-east-1a", "us-east-1b")}
    prices = {"us-east-1a": 1.0, "us-east-1b": 1.3}
    t = SpotTrace.from_bits(zones, prices, on_demand_usd=3.0, gap_seconds=3600)
    for work, k in ((10, 1), (14, 2), (8, 0)):
        job = DeadlineJob("j", 0, work, n, k)
        avail = np.array([[[c == "1" for c in zones[z]] for z in sorted(zones)]])[:, :, : n + k + 1]
        got = solve(avail, np.array([prices[z] for z in sorted(zones)]), 3.0, 1.0, work, k, float(k))
        best = min(got["wait"], got["od"], *got["spot"])  # type: ignore[arg-type]
        assert best == pytest.approx(optimum_cost(t, job)), (seed, work, k)


def test_sampled_futures_continue_the_current_run_by_its_age() -> None:
    """Up runs of 1, 1, 1, 10 and 10 h; a pool up for 2 h can only be in a 10 h run: 8 more hours up."""
    look = PoolOutlook(True, 2.0, RunLengths.of([1, 1, 1, 10, 10]), RunLengths.of([3, 3]))
    for seed in range(5):
        fut = sample_runs(look, 14, 1.0, random.Random(seed))
        assert fut == [True] * 8 + [False] * 3 + fut[11:]
    assert len(fut) == 14


def test_without_history_it_decides_as_overspill() -> None:
    rng = random.Random(4)
    bits = {z: "".join(rng.choice("1110") for _ in range(80)) for z in ("us-east-1a", "us-east-1b")}
    t = SpotTrace.from_bits(bits, {"us-east-1a": 1.0, "us-east-1b": 1.2}, on_demand_usd=3.0, gap_seconds=3600)
    m = TraceMarket(t)
    job = DeadlineJob("j", 0, 10, 16, 1)
    ours = run_deadline(m, job, make_strategy("overspill", restart_hours=1.0), record=True, outlook=False)
    fc = run_deadline(m, job, Forecast(restart_hours=1.0), record=True, outlook=False)
    assert [x.split(":", 1)[1] for x in fc.moves] == [x.split(":", 1)[1] for x in ours.moves]


@pytest.mark.parametrize("seed", range(3))
def test_with_history_it_meets_deadlines_and_never_beats_the_optimum(seed: int) -> None:
    rng = random.Random(seed)
    bits = {z: "".join(rng.choice("11110") for _ in range(200)) for z in ("us-east-1a", "us-east-1b")}
    t = SpotTrace.from_bits(bits, {"us-east-1a": 1.0, "us-east-1b": 1.2}, on_demand_usd=3.0, gap_seconds=3600)
    m = TraceMarket(t)
    for start in (120, 140):
        job = DeadlineJob(f"j{start}", start, 20, 28, 1)
        run = run_deadline(m, job, Forecast(restart_hours=1.0), record=True)
        assert run.met_deadline, (seed, start)
        assert run.cost_usd >= optimum_cost(t, job) - 1e-9


def test_it_plans_when_idle_without_spot_and_history_exists() -> None:
    """With enough history and no spot up, the wait-or-on-demand choice comes from the planner (its reason says
    so); with spot up it is Overspill's."""
    seen: list[str] = []

    class Spy:
        name = "spy"

        def __init__(self) -> None:
            self.inner = Forecast(restart_hours=1.0)

        def decide(self, state, book):  # type: ignore[no-untyped-def]
            plan = self.inner.decide(state, book)
            seen.append(plan.strategy)
            return plan

    bits = {"us-east-1a": ("1100" * 40) + "0000000000" + "1" * 30}
    t = SpotTrace.from_bits(bits, {"us-east-1a": 1.0}, on_demand_usd=3.0, gap_seconds=3600)
    run = run_deadline(TraceMarket(t), DeadlineJob("j", 160, 10, 30, 1), Spy())
    assert run.met_deadline
    assert "forecast" in seen and "overspill" in seen
