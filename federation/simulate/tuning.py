"""How good the deadline policy's family could be on one half of a trace if tuned on that very half (hindsight).

Role: an upper bound for tuning, for honesty about targets. `hindsight_sweep` runs `Overspill` (the deadline
policy, `federation.strategies`) at every point of a parameter grid on the jobs of one half of a trace
(`experiments.halves`) and returns each point's cost over the optimum on that half, whether it met every
deadline, and its worst job. The best point that meets every deadline is what the family reaches when its
parameters are chosen knowing the half it is scored on: if even that misses a target, no tuning of this family
reaches it without knowing the future. The policy itself still sees only the past at every decision.

Contract: pure and deterministic (no seeds; the same grid gives the same rows); `workers` > 1 spreads grid points
over processes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.experiments import DeadlineConfig, deadline_jobs, halves
from federation.simulate.market import TraceMarket
from federation.simulate.optimum import optimum_cost
from federation.simulate.traces import SpotTrace
from federation.strategies import NOTICE_SECONDS, make_strategy

# Overspill's tunable parameters and the values swept (the shipped defaults are inside each range).
GRID: Mapping[str, tuple[float, ...]] = {
    "pace": (0.25, 0.5, 0.75, 0.9, 1.0),
    "return_factor": (1.0, 1.5, 2.5, 4.0, 6.0),
    "min_saving": (0.1, 0.25),
    "hysteresis": (0.0, 2.0),
}


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One grid point scored on one half: total cost / total optimum, every deadline met, the worst job."""

    params: tuple[tuple[str, float], ...]
    x_optimum: float
    all_met: bool
    worst_job: float


def grid_points(grid: Mapping[str, Sequence[float]] = GRID) -> list[dict[str, float]]:
    names = sorted(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(grid[n] for n in names))]


def half_jobs(trace: SpotTrace, cfg: DeadlineConfig, half: str) -> list[DeadlineJob]:
    jobs = deadline_jobs(trace, cfg)
    return [j for j, h in zip(jobs, halves(jobs, len(trace)), strict=True) if h == half]


def score(
    trace: SpotTrace,
    jobs: Sequence[DeadlineJob],
    optima: Sequence[float],
    cfg: DeadlineConfig,
    params: Mapping[str, float | bool],
) -> SweepPoint:
    """`Overspill` with `params` (and the config's changeover) on `jobs`; `optima`: their optimum costs."""
    market = TraceMarket(trace)
    strategy = make_strategy("overspill", restart_hours=cfg.restart_hours, **params)
    notice = NOTICE_SECONDS if cfg.notice else {}
    cost = opt = 0.0
    worst = 0.0
    met = True
    for job, o in zip(jobs, optima, strict=True):
        if not math.isfinite(o):
            continue
        r = run_deadline(market, job, strategy, notice_seconds=notice)
        cost, opt = cost + r.cost_usd, opt + o
        worst = max(worst, r.cost_usd / o if o > 0 else 0.0)
        met = met and r.met_deadline
    return SweepPoint(tuple(sorted(params.items())), cost / opt if opt else 0.0, met, worst)


def hindsight_sweep(
    trace: SpotTrace,
    cfg: DeadlineConfig,
    half: str = "second",
    grid: Mapping[str, Sequence[float]] = GRID,
    workers: int = 1,
) -> list[SweepPoint]:
    """Every grid point scored on the jobs of `half`, best first (points that miss a deadline last)."""
    jobs = half_jobs(trace, cfg, half)
    optima = [optimum_cost(trace, j) for j in jobs]
    points = grid_points(grid)
    if workers > 1:
        n = len(points)
        with ProcessPoolExecutor(workers) as pool:
            rows = list(pool.map(score, [trace] * n, [jobs] * n, [optima] * n, [cfg] * n, points))
    else:
        rows = [score(trace, jobs, optima, cfg, p) for p in points]
    return sorted(rows, key=lambda r: (not r.all_met, r.x_optimum))


def sweep_table(rows: Sequence[SweepPoint], shown: int = 3) -> str:
    """The best `shown` points and the spread of the grid, one line each."""
    met = [r for r in rows if r.all_met]
    lines = [
        f"    {', '.join(f'{k}={v:g}' for k, v in r.params)}: {r.x_optimum:.3f}x, worst job {r.worst_job:.2f}x"
        + ("" if r.all_met else " (misses a deadline)")
        for r in rows[:shown]
    ]
    if met:
        lines.append(
            f"    grid: {len(rows)} points, {len(met)} meet every deadline, from {met[0].x_optimum:.3f}x to "
            f"{met[-1].x_optimum:.3f}x"
        )
    return "\n".join(lines)


def tuning_report(first: Sequence[SweepPoint], second: Sequence[SweepPoint]) -> tuple[str, dict[str, object]]:
    """Text and JSON for one table: the grid point tuned on the first half and its second-half score (what an
    honest tuning gets), and the best point on the second half tuned on the second half itself (hindsight)."""
    by_params = {r.params: r for r in second}
    doc: dict[str, object] = {"grid": {k: list(v) for k, v in GRID.items()}, "points": len(second)}
    lines = []
    tuned = next((r for r in first if r.all_met), None)
    if tuned is not None:
        held = by_params[tuned.params]
        doc["tuned_on_first_half"] = {
            "params": dict(tuned.params),
            "first": tuned.x_optimum,
            "second": held.x_optimum,
            "second_all_met": held.all_met,
            "second_worst_job": held.worst_job,
        }
        lines.append(
            f"  tuned on the first half: {', '.join(f'{k}={v:g}' for k, v in tuned.params)} -> first half "
            f"{tuned.x_optimum:.3f}x, second half {held.x_optimum:.3f}x (worst job {held.worst_job:.2f}x"
            + (")" if held.all_met else ", misses a deadline)")
        )
    best = next((r for r in second if r.all_met), None)
    if best is not None:
        doc["hindsight_second_half"] = {"params": dict(best.params), "second": best.x_optimum, "worst": best.worst_job}
    lines.append("  tuned on the second half itself (hindsight, an upper bound for tuning this family):")
    lines.append(sweep_table(second))
    return "\n".join(lines), doc
