"""The price of information (issue 18): how close to the hindsight optimum can ANY causal policy get?

In a synthetic market statistically like a real one - a joint availability chain of its zones (up-bitmask x age
bucket, 15-minute steps, `federation/simulate/information.py`) fitted (a) on the whole trace ("oracle
statistics"), (b) on its first half only, (c) on its second half only (the half issue 18 scores) - the exact
Bayes-optimal causal policy's expected cost V* is computable. For each fitted chain, N sampled traces (seeded;
each a warm-up so `overspill` has history, then one job per deadline), and per deadline and overall: E[hindsight
optimum] and, as x E[optimum] with a 95% CI, V* (exact over the start state, and its greedy policy's simulated
mean), `overspill` and `greedy_safety_net` run through `run_deadline`. Then on the REAL trace (resampled to the
chain's step, a zone up in a step only if up in all its ticks), the second-half jobs: the Bayes policy of each
fitted chain, causally, against `optimum_cost` and `overspill` on the same trace ("knowing the month's statistics
but not its realisation").

Jobs: 48 h of work due in 52, 60 or 70 h, changeover 15 min, AWS interruption notice (no work lost to a reclaim;
a checkpoint every 30 min, 60 s to save, as in simulate_bench's "notice" tables).

Markets: us-east-1's 4 zones of the AWS V100 2023 trace (default), and with `--markets 2022` the two-zone AWS 2022
markets (10-minute ticks: the chain's step is 10 min and the changeover 2 steps, as simulate_bench runs them).

Data is read in place from `--data`, `$OVERSPILL_SHARED_DATA` or ../shared/data (skipped with a message when
absent). Run (from the repository root):
    python benchmarks/information_bound.py                         # 200 samples, seed 18
    python benchmarks/information_bound.py --samples 50 --seed 1 --json
    python benchmarks/information_bound.py --markets 2022 --samples 300   # the 2022 two-zone markets
    python benchmarks/information_bound.py --samples 500 --edges 1        # sensitivity: no age buckets
    python benchmarks/information_bound.py --samples 500 --pseudo 0       # sensitivity: no Dirichlet prior
    python benchmarks/information_bound.py --by-start-state --samples 40  # worst-job evidence: V*(s0)/E[opt|s0]
    python benchmarks/information_bound.py --nine-zones --samples 100      # all 9 zones (observed bitmasks only)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from federation.simulate import US_EAST_1
from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.experiments import (
    EXTRA_MARKETS,
    DeadlineConfig,
    load_aws_v100_trace,
    load_extra_market,
)
from federation.simulate.information import (
    EDGES,
    BayesTable,
    JointChain,
    by_start_state,
    coarsen,
    fit,
    ratio_ci,
    restrict,
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
from federation.simulate.traces import SpotTrace
from federation.simulate.tuning import half_jobs
from federation.strategies import make_strategy

REPO_ROOT = Path(__file__).resolve().parents[1]
CFG = DeadlineConfig()  # 48 h work, deadlines 52/60/70 h, 15 min changeover, checkpoint 30 min, 60 s save
POLICIES = ("overspill", "greedy_safety_net")
WARM_HOURS = 96.0


def data_dir(given: str | None) -> Path | None:
    for candidate in (given, os.environ.get("OVERSPILL_SHARED_DATA"), str(REPO_ROOT.parent / "shared" / "data")):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


@dataclass(frozen=True)
class Market:
    title: str
    trace: SpotTrace  # on the chain's step
    native: SpotTrace  # as loaded (fit reads this)
    zones: tuple[str, ...]
    step_seconds: int
    edges: tuple[int, ...]

    def per_hour(self) -> float:
        return 3600 / self.step_seconds

    def jobs_at(self, start: int) -> list[DeadlineJob]:
        ph = self.per_hour()
        return [
            DeadlineJob(
                f"{dl:g}h",
                start,
                round(CFG.work_hours * ph),
                round(dl * ph),
                round(CFG.restart_hours * ph),
                checkpoint_ticks=round(CFG.checkpoint_hours * ph),
                save_seconds=CFG.save_seconds,
            )
            for dl in CFG.deadlines_hours
        ]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def strategies() -> dict[str, object]:
    return {p: make_strategy(p, restart_hours=CFG.restart_hours) for p in POLICIES}


def synthetic(market: Market, chain: JointChain, table: BayesTable, samples: int, seed: int) -> dict:
    """Per deadline: per-sample costs of the optimum, V*(start state), the Bayes policy and each policy."""
    rng = np.random.default_rng(seed)
    warm = round(WARM_HOURS * market.per_hour())
    jobs = market.jobs_at(warm)
    length = warm + 2 * max(j.deadline_ticks for j in jobs)
    out: dict[str, dict[str, list[float]]] = {
        j.name: {k: [] for k in ("optimum", "vstar", "bayes", *POLICIES, "bayes_met", *(f"{p}_met" for p in POLICIES))}
        for j in jobs
    }
    pols = strategies()
    started = time.perf_counter()
    for i in range(samples):
        path = sample_path(chain, length, rng)
        trace = to_trace(chain, path)
        market_i = TraceMarket(trace)
        for job in jobs:
            row = out[job.name]
            row["optimum"].append(optimum_cost(trace, job))
            row["vstar"].append(table.value(job, int(path[warm])))
            run = run_bayes(table, path, job)
            row["bayes"].append(run.cost_usd)
            row["bayes_met"].append(float(run.met_deadline))
            for name, strat in pols.items():
                r = run_deadline(market_i, job, strat, name)  # type: ignore[arg-type]
                row[name].append(r.cost_usd)
                row[f"{name}_met"].append(float(r.met_deadline))
        if (i + 1) % max(1, samples // 10) == 0:
            log(f"  {i + 1}/{samples} samples ({time.perf_counter() - started:.0f} s)")
    exact = {j.name: table.expected_value(j, chain.stationary()) for j in jobs}
    return {"per_deadline": out, "vstar_exact": exact}


def real(market: Market, tables: dict[str, BayesTable]) -> dict:
    """The second-half jobs of the real trace (on the chain's step): optimum, each policy, each chain's Bayes."""
    trace = market.trace
    ph = market.per_hour()
    second = half_jobs(trace, CFG, "second")
    assert all(j.restart_ticks == round(CFG.restart_hours * ph) for j in second)
    states = {name: states_of(trace, t.chain.edges) for name, t in tables.items()}
    tm = TraceMarket(trace)
    pols = strategies()
    rows: dict[str, dict[str, list[float]]] = {}
    for job in second:
        dl = f"{job.deadline_ticks / ph:g}h"
        row = rows.setdefault(dl, {})
        row.setdefault("optimum", []).append(optimum_cost(trace, job))
        for name, strat in pols.items():
            r = run_deadline(tm, job, strat, name)  # type: ignore[arg-type]
            row.setdefault(name, []).append(r.cost_usd)
            row.setdefault(f"{name}_met", []).append(float(r.met_deadline))
        for name, t in tables.items():
            run = run_bayes(t, states[name], job)
            row.setdefault(f"bayes[{name}]", []).append(run.cost_usd)
            row.setdefault(f"bayes[{name}]_met", []).append(float(run.met_deadline))
    return rows


def dist(x: np.ndarray) -> dict:
    """p50, p95, max and the share over 1.25 / 1.05 of per-job ratios."""
    return {
        "p50": float(np.percentile(x, 50)),
        "p95": float(np.percentile(x, 95)),
        "max": float(x.max()),
        "share_over_1.25": float((x > 1.25).mean()),
        "share_over_1.05": float((x > 1.05).mean()),
    }


def start_state_report(m: Market, samples: int, seed: int, pseudo: float, jobs_n: int = 51) -> tuple[str, dict]:
    """Step 1 of the worst-job evidence: per fit (whole trace, second half) and deadline, V*(s0) / E[opt | s0]
    over start states (`samples` traces per state of stationary mass > 1e-4), summarised; the per-job ratio
    distribution of the Bayes policy and `overspill` in the world; the Bayes policy's worst real second-half jobs."""
    n = len(m.native)
    jobs = m.jobs_at(0)
    max_ticks = max(j.deadline_ticks for j in jobs)
    max_slack = max(j.deadline_ticks - j.work_ticks for j in jobs)
    lines: list[str] = []
    doc: dict = {}
    for k, (fname, (lo, hi)) in enumerate({"whole trace": (0, n), "second half": (n // 2, n)}.items()):
        chain = fit(m.native, m.zones, lo, hi, m.edges, pseudo, m.step_seconds)
        table = solve(chain, max_ticks, max_slack, jobs[0].restart_ticks)
        rng = np.random.default_rng(seed + k)
        fdoc: dict = {"by_deadline": {}}
        lines.append(f"\n{m.title}, chain fitted on the {fname}: V*(s0) / E[opt | s0], {samples} traces per state")
        for job in jobs:
            log(f"  {fname}, {job.name}: by start state")
            rows = by_start_state(table, job, samples, rng, min_mass=1e-4)
            summ = start_state_summary(rows, (1.25, 1.05), jobs_n)
            worst = max(rows, key=lambda r: r.ratio)
            summ["worst_ci95"] = 1.96 * worst.opt_se * worst.vstar / worst.opt_mean**2
            summ["states_covered_mass"] = sum(r.mass for r in rows)
            fdoc["by_deadline"][job.name] = summ
            lines.append(
                f"  {job.name}: worst state {worst.state} (mass {worst.mass:.4f}) ratio {worst.ratio:.3f} "
                f"(± {summ['worst_ci95']:.3f}); mass > 1.25x {summ['mass_over_1.25']:.3f} "
                f"(P[any of {jobs_n}] {summ[f'p_any_of_{jobs_n}_over_1.25']:.3f}); mass > 1.05x "
                f"{summ['mass_over_1.05']:.3f} (P[any of {jobs_n}] {summ[f'p_any_of_{jobs_n}_over_1.05']:.3f})"
            )
        log(f"  {fname}: per-job distribution in the world")
        res = synthetic(m, chain, table, samples, seed + 10 + k)["per_deadline"]
        for pol in ("bayes", "overspill"):
            x = np.concatenate([np.asarray(r[pol]) / np.maximum(np.asarray(r["optimum"]), 1e-12) for r in res.values()])
            fdoc[f"world_per_job_{pol}"] = d = dist(x)
            lines.append(
                f"  world per-job x opt, {pol}: p50 {d['p50']:.3f} p95 {d['p95']:.3f} max {d['max']:.3f} "
                f"share > 1.25x {d['share_over_1.25']:.3f}, > 1.05x {d['share_over_1.05']:.3f}"
            )
        trace = m.trace
        second = half_jobs(trace, CFG, "second")
        states = states_of(trace, chain.edges)
        real_rows = []
        for job in second:
            opt = optimum_cost(trace, job)
            run = run_bayes(table, states, job)
            s0 = int(states[job.start_tick])
            real_rows.append((run.cost_usd / opt, job.name, job.start_tick, s0, run.met_deadline))
        real_rows.sort(reverse=True)
        fdoc["real_second_half_bayes_worst"] = [
            {"x": r[0], "job": r[1], "start_tick": r[2], "start_state": r[3], "met": r[4]} for r in real_rows[:5]
        ]
        lines.append(
            f"  REAL second-half jobs ({len(real_rows)}), Bayes policy worst: "
            + "; ".join(f"{r[1]}@{r[2]} {r[0]:.3f}x state {r[3]}" for r in real_rows[:5])
        )
        doc[fname] = fdoc
    return "\n".join(lines), doc


def nine_zone_report(base: Path, samples: int, seed: int, pseudo: float, jobs_n: int = 51) -> tuple[str, dict]:
    """Step 2: all 9 zones of the AWS V100 2023 trace, the chain restricted to the bitmasks seen in the fitted
    slice (pseudo-count only among them), V* by `solve_values`; V*/E[opt] (stationary starts, `samples` traces)
    and the by-start-state figures (`samples` traces per state of stationary mass > 1e-3) against 1.01x/1.05x."""
    native = load_aws_v100_trace(str(base), 300, None)
    zones = tuple(z.zone for z in native.zones)
    m = Market("AWS V100 2023, all 9 zones", coarsen(native, 900), native, zones, 900, EDGES)
    n = len(native)
    jobs = m.jobs_at(0)
    lines: list[str] = []
    doc: dict = {}
    for k, (fname, (lo, hi)) in enumerate({"whole trace": (0, n), "second half": (n // 2, n)}.items()):
        full = fit(native, zones, lo, hi, EDGES, pseudo, 900)
        f = 900 // native.gap_seconds
        st = states_of(m.trace, EDGES)[lo // f : hi // f]
        chain = restrict(full, np.unique(st // len(EDGES)))
        t0 = time.perf_counter()
        vals = solve_values(chain, jobs)
        solve_s = time.perf_counter() - t0
        log(f"  9 zones, {fname}: {chain.states} states, solved in {solve_s:.0f} s")
        rng = np.random.default_rng(seed + 20 + k)
        pi = chain.stationary()
        fdoc: dict = {"masks": len(chain.masks or ()), "states": chain.states, "solve_seconds": solve_s}
        lines.append(
            f"\nAWS V100 2023, all 9 zones, chain fitted on the {fname} restricted to its {len(chain.masks or ())} "
            f"observed bitmasks ({chain.states} states), solved in {solve_s:.0f} s"
        )
        for job in jobs:
            opts = [
                optimum_cost(to_trace(chain, sample_path(chain, job.deadline_ticks + 1, rng)), job)
                for _ in range(samples)
            ]
            r, ci = ratio_ci([vals.expected_value(job, pi)] * samples, opts)
            rows = by_start_state(vals, job, max(2, samples // 10), rng, min_mass=1e-3)
            summ = start_state_summary(rows, (1.05, 1.01), jobs_n)
            summ["mean_vstar_x"], summ["mean_ci95"] = r, ci
            summ["states_covered_mass"] = sum(x.mass for x in rows)
            fdoc[job.name] = summ
            lines.append(
                f"  {job.name}: V*/E[opt] {r:.4f} (± {ci:.4f}); worst start state ratio {summ['worst_ratio']:.3f}; "
                f"mass > 1.05x {summ['mass_over_1.05']:.3f} (P[any of {jobs_n}] "
                f"{summ[f'p_any_of_{jobs_n}_over_1.05']:.3f}); mass > 1.01x {summ['mass_over_1.01']:.3f} "
                f"(states covered: mass {summ['states_covered_mass']:.3f})"
            )
        doc[fname] = fdoc
    return "\n".join(lines), doc


def merged(per: dict[str, dict[str, list[float]]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in per.values():
        for k, v in row.items():
            out.setdefault(k, []).extend(v)
    return out


def fmt(r: tuple[float, float]) -> str:
    return f"{r[0]:.3f} ± {r[1]:.3f}" if math.isfinite(r[1]) else f"{r[0]:.3f}"


def synthetic_table(title: str, res: dict, jobs: list[DeadlineJob]) -> tuple[str, dict]:
    per = res["per_deadline"]
    lines = [
        f"\n{title}",
        "| deadline | n | E[optimum] $ | V* exact x | V* sampled x | Bayes policy x | overspill x "
        "| greedy_safety_net x | met (Bayes/overspill/greedy) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    doc: dict[str, dict] = {}
    groups = [(j.name, per[j.name]) for j in jobs] + [("all", merged(per))]
    for name, row in groups:
        opt = row["optimum"]
        n = len(opt)
        e_opt = float(np.mean(opt))
        exact = (
            res["vstar_exact"][name] / e_opt
            if name != "all"
            else float(np.mean([res["vstar_exact"][j.name] for j in jobs])) / e_opt
        )
        # V* exact is a number; its ratio's uncertainty is E[optimum]'s sampling error alone
        exact_ci = exact * 1.96 * float(np.std(opt, ddof=1)) / math.sqrt(n) / e_opt if n > 1 else math.inf
        cols = {k: ratio_ci(row[k], opt) for k in ("vstar", "bayes", *POLICIES)}
        met = "/".join(f"{100 * np.mean(row[k]):.1f}%" for k in ("bayes_met", *(f"{p}_met" for p in POLICIES)))
        lines.append(
            f"| {name} | {n} | {e_opt:.2f} | {fmt((exact, exact_ci))} | {fmt(cols['vstar'])} | {fmt(cols['bayes'])} | "
            f"{fmt(cols['overspill'])} | {fmt(cols['greedy_safety_net'])} | {met} |"
        )
        doc[name] = {
            "n": n,
            "e_optimum_usd": e_opt,
            "vstar_exact_x": exact,
            "vstar_exact_ci95": exact_ci,
            **{f"{k}_x": v[0] for k, v in cols.items()},
            **{f"{k}_ci95": v[1] for k, v in cols.items()},
            "met": {k: float(np.mean(row[k])) for k in ("bayes_met", *(f"{p}_met" for p in POLICIES))},
        }
    return "\n".join(lines), doc


def real_table(title: str, rows: dict[str, dict[str, list[float]]]) -> tuple[str, dict]:
    cols = [k for k in next(iter(rows.values())) if k != "optimum" and not k.endswith("_met")]
    lines = [
        f"\n{title}",
        "| deadline | jobs | optimum $ | " + " | ".join(f"{c} x" for c in cols) + " | all met |",
        "|---|---|---|" + "---|" * (len(cols) + 1),
    ]
    doc: dict[str, dict] = {}
    for name, row in [*rows.items(), ("all", merged(rows))]:
        opt = row["optimum"]
        ratios = {c: float(np.sum(row[c]) / np.sum(opt)) for c in cols}
        met = all(all(v == 1.0 for v in row[k]) for k in row if k.endswith("_met"))
        lines.append(
            f"| {name} | {len(opt)} | {np.mean(opt):.2f} | "
            + " | ".join(f"{ratios[c]:.3f}" for c in cols)
            + f" | {'yes' if met else 'NO'} |"
        )
        doc[name] = {
            "jobs": len(opt),
            "mean_optimum_usd": float(np.mean(opt)),
            **{f"{c}_x": v for c, v in ratios.items()},
        }
    return "\n".join(lines), doc


def markets(base: Path, which: str, edges: tuple[int, ...] = EDGES) -> list[Market]:
    out = []
    if which in ("us-east-1", "all"):
        native = load_aws_v100_trace(str(base), 300, US_EAST_1)
        out.append(Market("AWS V100 2023, us-east-1 (4 zones)", coarsen(native, 900), native, US_EAST_1, 900, edges))
    if which in ("2022", "all"):
        for name in EXTRA_MARKETS:
            t = load_extra_market(str(base), name)
            zones = tuple(z.zone for z in t.zones)
            # 10-minute steps: buckets 0-20 min, 20-60 min, 1-4 h, 4 h+
            out.append(Market(f"{name.split(',')[0]} ({len(zones)} zones)", t, t, zones, t.gap_seconds, (1, 3, 7, 25)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="shared data folder (default: $OVERSPILL_SHARED_DATA or ../shared/data)")
    ap.add_argument("--samples", type=int, default=200, help="sampled traces per fitted chain (default 200)")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument(
        "--markets",
        choices=("us-east-1", "2022", "all"),
        default="us-east-1",
        help="us-east-1's 4 zones of the 2023 trace (default), the two-zone AWS 2022 markets, or both",
    )
    ap.add_argument(
        "--edges",
        default=",".join(map(str, EDGES)),
        help="us-east-1's age buckets: first age (in 15-min steps) of each bucket (default 1,2,5,17: 0-15 min, "
        "15-60 min, 1-4 h, 4 h+; '1': no age, one bucket per bitmask)",
    )
    ap.add_argument(
        "--pseudo", type=float, default=0.1, help="Dirichlet pseudo-count on every allowed transition (default 0.1)"
    )
    ap.add_argument(
        "--by-start-state",
        action="store_true",
        help="instead of the tables: V*(s0) / E[opt | s0] per start state, the per-job distributions and the "
        "Bayes policy's worst real jobs (chains fitted on the whole trace and the second half; --samples per state)",
    )
    ap.add_argument(
        "--nine-zones",
        action="store_true",
        help="instead of the tables: V* in the 9-zone world (chain restricted to observed bitmasks), mean and by "
        "start state (--samples traces for the mean, a tenth of that per start state)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = ap.parse_args(argv)
    edges = tuple(int(x) for x in args.edges.split(","))
    if edges[0] != 1 or any(b <= a for a, b in pairwise(edges)):
        ap.error("--edges: increasing ages starting at 1")
    base = data_dir(args.data)
    if base is None:
        print("SKIPPED: shared data folder not found (pass --data or set OVERSPILL_SHARED_DATA)")
        return 0
    started = time.perf_counter()
    text: list[str] = []
    doc: dict = {
        "command": " ".join(
            ["python", "benchmarks/information_bound.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "seed": args.seed,
        "samples": args.samples,
        "edges": list(edges),
        "pseudo": args.pseudo,
        "markets": {},
    }
    if args.nine_zones:
        s, d = nine_zone_report(base, args.samples, args.seed, args.pseudo)
        doc["markets"]["AWS V100 2023, all 9 zones"] = d
        doc["elapsed_seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps(doc, indent=2) if args.json else s)
        return 0
    if args.by_start_state:
        for m in markets(base, args.markets, edges):
            s, d = start_state_report(m, args.samples, args.seed, args.pseudo)
            text.append(s)
            doc["markets"][m.title] = d
        doc["elapsed_seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps(doc, indent=2) if args.json else "\n".join(text))
        return 0
    for m in markets(base, args.markets, edges):
        log(f"{m.title}: fitting chains")
        n = len(m.native)
        fits = {"whole trace": (0, n), "first half": (0, n // 2), "second half": (n // 2, n)}
        jobs = m.jobs_at(0)
        max_ticks = max(j.deadline_ticks for j in jobs)
        max_slack = max(j.deadline_ticks - j.work_ticks for j in jobs)
        tables: dict[str, BayesTable] = {}
        mdoc: dict = {"step_seconds": m.step_seconds, "edges": list(m.edges), "fits": {}}
        for k, (fname, (lo, hi)) in enumerate(fits.items()):
            chain = fit(m.native, m.zones, lo, hi, m.edges, args.pseudo, m.step_seconds)
            t0 = time.perf_counter()
            table = solve(chain, max_ticks, max_slack, jobs[0].restart_ticks)
            solve_s = time.perf_counter() - t0
            tables[fname] = table
            up = chain.stationary() @ chain.up()
            log(f"  chain fitted on the {fname}: solved in {solve_s:.1f} s; sampling {args.samples} traces")
            res = synthetic(m, chain, table, args.samples, args.seed + k)
            title = (
                f"{m.title}, chain fitted on the {fname} (age buckets from {list(m.edges)} steps, pseudo-count "
                f"{args.pseudo:g}; "
                f"spot $/h {', '.join(f'{p:.4f}' for p in chain.spot_usd)}; "
                f"long-run up share {', '.join(f'{u:.2f}' for u in up)}): {args.samples} sampled traces, seed "
                f"{args.seed + k}; x E[optimum] with 95% CI"
            )
            s, d = synthetic_table(title, res, m.jobs_at(0))
            text.append(s)
            mdoc["fits"][fname] = {"solve_seconds": solve_s, "spot_usd": list(chain.spot_usd), "table": d}
        log("  the real trace's second-half jobs")
        s, d = real_table(
            f"{m.title}, the REAL trace's second-half jobs ("
            + (f"{m.step_seconds // 60}-min steps, all-up rule" if m.trace is not m.native else "as loaded")
            + "): "
            "x optimum (sum of costs / sum of optima); bayes[fit] = Bayes policy of the chain fitted on that part",
            real(m, tables),
        )
        text.append(s)
        mdoc["real_second_half"] = d
        doc["markets"][m.title] = mdoc
        del tables
    elapsed = time.perf_counter() - started
    doc["elapsed_seconds"] = round(elapsed, 1)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        us = doc["markets"].get("AWS V100 2023, us-east-1 (4 zones)")
        print("\n".join(text))
        if us:
            print("\nHeadline (us-east-1):")
            for fname, f in us["fits"].items():
                head = f["table"]["all"]
                print(
                    f"  chain fitted on the {fname}: the best causal policy in this world pays "
                    f"{head['vstar_exact_x']:.3f}x (± {head['vstar_exact_ci95']:.3f}) the hindsight optimum "
                    f"(its policy simulated: {head['bayes_x']:.3f} ± {head['bayes_ci95']:.3f}; overspill "
                    f"{head['overspill_x']:.3f} ± {head['overspill_ci95']:.3f})"
                )
        print(f"\n({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
