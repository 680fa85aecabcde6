"""Where a deadline policy's excess over the omniscient optimum comes from, job by job (`simulate_bench --explain`).

Contract: `explain_jobs(trace, jobs, results, split)` is pure and deterministic. For every job and policy run (the
runs of `experiments.run_deadline_chunk`, which carry `DeadlineRun.costs`) it splits the run's excess over the
optimum, excess = cost - optimum, exactly into:
- `on_demand_usd`: the run's on-demand spend minus the optimum's (the optimum's on-demand hours are the derivative
  of its cost in the on-demand price, `optimum.optimum_on_demand_hours`, priced at the trace's cheapest on-demand);
- `spot_usd`: the run's spot spend minus the optimum's (the rest of the optimum's cost).
and names the parts of the run's spend an optimal plan mostly does without: `changeover_usd` (launch and restore
ticks), `lost_usd` (spot work a reclaim threw away and that was redone), and the timing of its on-demand hours:
`od_spot_up_hours` (on-demand while some spot pool was up: bought too early, or kept too long),
`od_forced_hours` (on-demand with the slack below the safety margin: bought too late to wait any more), and
`idle_spot_up_hours` (waiting while spot was up). `summarize` adds them up per half of the trace and policy;
`explain_table` prints that with the worst jobs of one policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from federation.simulate.deadline import DeadlineJob, DeadlineRun
from federation.simulate.market import usd
from federation.simulate.optimum import optimum_on_demand_hours
from federation.simulate.traces import SpotTrace


@dataclass(frozen=True, slots=True)
class JobGap:
    """One policy's excess over the optimum on one job (module docstring); excess = on_demand_usd + spot_usd."""

    job: str
    half: str
    policy: str
    cost_usd: float
    optimum_usd: float
    excess_usd: float
    on_demand_usd: float
    spot_usd: float
    changeover_usd: float
    lost_usd: float
    od_hours: float
    optimum_od_hours: float
    od_spot_up_hours: float
    od_forced_hours: float
    idle_spot_up_hours: float
    met_deadline: bool


def explain_jobs(
    trace: SpotTrace,
    jobs: Sequence[DeadlineJob],
    results: Sequence[tuple[float, Sequence[DeadlineRun]]],
    split: Sequence[str],
) -> list[JobGap]:
    """Every (job, policy) pair's `JobGap`, jobs in order; jobs with no feasible optimum are left out."""
    od_price = min(float(usd(p)) for p in trace.on_demand_usd.values())
    out: list[JobGap] = []
    for job, half, (opt, runs) in zip(jobs, split, results, strict=True):
        if not math.isfinite(opt):
            continue
        opt_od_h = optimum_on_demand_hours(trace, job, opt)
        opt_od = opt_od_h * od_price
        for r in runs:
            c = r.costs
            if c is None:
                raise ValueError(f"run {r.policy}/{r.job} has no cost ledger")
            out.append(
                JobGap(
                    job=job.name,
                    half=half or "neither",
                    policy=r.policy,
                    cost_usd=r.cost_usd,
                    optimum_usd=opt,
                    excess_usd=r.cost_usd - opt,
                    on_demand_usd=c.on_demand_usd - opt_od,
                    spot_usd=c.spot_usd - (opt - opt_od),
                    changeover_usd=c.changeover_usd,
                    lost_usd=c.lost_usd,
                    od_hours=r.on_demand_hours,
                    optimum_od_hours=opt_od_h,
                    od_spot_up_hours=c.on_demand_spot_up_hours,
                    od_forced_hours=c.on_demand_forced_hours,
                    idle_spot_up_hours=c.idle_spot_up_hours,
                    met_deadline=r.met_deadline,
                )
            )
    return out


SUMMED = (
    "cost_usd",
    "optimum_usd",
    "excess_usd",
    "on_demand_usd",
    "spot_usd",
    "changeover_usd",
    "lost_usd",
    "od_hours",
    "optimum_od_hours",
    "od_spot_up_hours",
    "od_forced_hours",
    "idle_spot_up_hours",
)


def summarize(gaps: Sequence[JobGap]) -> dict[str, dict[str, dict[str, float]]]:
    """half ("first", "second", "all") -> policy -> the sums of `SUMMED` plus `jobs` and `x_optimum`."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for half in ("first", "second", "all"):
        chosen = [g for g in gaps if half == "all" or g.half == half]
        per: dict[str, dict[str, float]] = {}
        for g in chosen:
            row = per.setdefault(g.policy, {k: 0.0 for k in ("jobs", *SUMMED)})
            row["jobs"] += 1
            for k in SUMMED:
                row[k] += getattr(g, k)
        for row in per.values():
            row["x_optimum"] = row["cost_usd"] / row["optimum_usd"] if row["optimum_usd"] else 0.0
        out[half] = per
    return out


def explain_table(gaps: Sequence[JobGap], worst_of: str = "overspill", worst: int = 5) -> str:
    """Per half of the trace, one line per policy with its excess and the parts above, then the `worst` jobs of
    policy `worst_of` by cost over the optimum."""
    header = (
        f"{'policy':<22}{'x opt':>7}{'excess $':>10}{'OD $':>9}{'spot $':>9}{'chgover $':>10}{'redone $':>9}"
        f"{'OD h':>8}{'opt OD h':>9}{'OD h spot up':>13}{'OD h forced':>12}{'idle h spot up':>15}"
    )
    lines = []
    sums = summarize(gaps)
    for half in ("first", "second"):
        rows = sums[half]
        if not rows:
            continue
        n = int(next(iter(rows.values()))["jobs"])
        lines.append(f"  {half} half ({n} jobs): excess = OD $ + spot $ (each over the optimum's)")
        lines.append("  " + header)
        for policy, r in rows.items():
            lines.append(
                f"  {policy:<22}{r['x_optimum']:>7.3f}{r['excess_usd']:>10,.0f}{r['on_demand_usd']:>9,.0f}"
                f"{r['spot_usd']:>9,.0f}{r['changeover_usd']:>10,.0f}{r['lost_usd']:>9,.0f}{r['od_hours']:>8,.0f}"
                f"{r['optimum_od_hours']:>9,.0f}{r['od_spot_up_hours']:>13,.0f}{r['od_forced_hours']:>12,.0f}"
                f"{r['idle_spot_up_hours']:>15,.0f}"
            )
        mine = sorted(
            (g for g in gaps if g.half == half and g.policy == worst_of),
            key=lambda g: -(g.cost_usd / g.optimum_usd if g.optimum_usd else 0.0),
        )[:worst]
        if mine:
            lines.append(f"  worst {len(mine)} jobs of {worst_of}:")
            for g in mine:
                lines.append(
                    f"    {g.job:<14}{g.cost_usd / g.optimum_usd:>6.2f}x  excess ${g.excess_usd:,.0f} = OD "
                    f"${g.on_demand_usd:,.0f} + spot ${g.spot_usd:,.0f}; changeover ${g.changeover_usd:,.0f}, "
                    f"redone ${g.lost_usd:,.0f}; OD {g.od_hours:.1f} h (optimum {g.optimum_od_hours:.1f} h, "
                    f"{g.od_spot_up_hours:.1f} h with spot up, {g.od_forced_hours:.1f} h forced); idle with spot "
                    f"up {g.idle_spot_up_hours:.1f} h"
                )
    return "\n".join(lines)


def gaps_json(gaps: Sequence[JobGap]) -> list[dict[str, object]]:
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(g).items()} for g in gaps]
