"""Decision time of the deadline policies: how long one `decide` call takes per job per tick.

What it runs: the deadline jobs of the deadline suite (48 h of work due in 52, 60 or 70 h, 15-minute changeover,
30-minute checkpoints) on the real AWS V100 trace (us-east-1's 4 zones, or all 9 with `--all-zones`, 5-minute
ticks), one job starting every `--start-every` hours, through `run_deadline` with each policy wrapped in a timer:
every call of the policy's `decide` (through `federation.strategies.decide`, as the broker's placement step
calls it) is timed with `time.perf_counter`. It prints, per policy, the number of decisions and their p50, p99
and maximum in milliseconds; for a policy with a per-tick `prepare` step (`model_dp`: it solves the shared tables
before the tick's decisions), that step is timed separately and printed on its own line with the number of
tables solved there and inline in `decide` (0 when every decision is a look-up). This is the policy's own time
on prebuilt books and outlooks (the simulator's market); the live loop adds
its database reads (availability history, placements) around it.

Run (from the repository root):
    python benchmarks/decision_bench.py
    python benchmarks/decision_bench.py --all-zones --start-every 48
    python benchmarks/decision_bench.py --policies overspill,model_dp
    python benchmarks/decision_bench.py --policies overspill,chain_dp --live

`--live` runs the policies as the live loop does (`broker/loop/place.py` calls `decide` only): a DP policy then
solves a missing table inside the decision that first needs it, and that decision's time includes the solve.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import federation.policies  # noqa: F401  (registers model_dp, chain_dp and forecast)
from federation.simulate import US_EAST_1
from federation.simulate.deadline import run_deadline
from federation.simulate.experiments import DeadlineConfig, deadline_jobs, load_aws_v100_trace, percentile
from federation.simulate.market import TraceMarket
from federation.strategies import make_strategy

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir(given: str | None) -> Path:
    for candidate in (given, os.environ.get("OVERSPILL_SHARED_DATA"), str(REPO_ROOT.parent / "shared" / "data")):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    raise SystemExit("shared data folder not found: pass --data or set OVERSPILL_SHARED_DATA")


@dataclass
class Timed:
    inner: Any
    times: list[float] = field(default_factory=list)
    prepare_times: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.inner.name)

    live: bool = False  # as the live loop: no `prepare` step, so decisions solve their tables inline

    def __post_init__(self) -> None:
        if hasattr(self.inner, "prepare") and not self.live:  # only for policies with it (run_deadline looks)
            self.prepare = self._prepare

    def _prepare(self, now: Any, book: Any, states: Any, outlook_at: Any = None) -> int:
        t0 = time.perf_counter()
        solved = int(self.inner.prepare(now, book, states, outlook_at))
        self.prepare_times.append(time.perf_counter() - t0)
        return solved

    def decide(self, state: Any, book: Any) -> Any:
        t0 = time.perf_counter()
        plan = self.inner.decide(state, book)
        self.times.append(time.perf_counter() - t0)
        return plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="shared data folder (default: $OVERSPILL_SHARED_DATA or ../shared/data)")
    ap.add_argument("--all-zones", action="store_true", help="all 9 zones instead of us-east-1's 4")
    ap.add_argument("--start-every", type=float, default=96.0, help="hours between job starts (default 96)")
    ap.add_argument("--policies", default="overspill,forecast")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument(
        "--live",
        action="store_true",
        help="no per-tick prepare step, as the live loop runs a policy: DP tables are solved inside decide",
    )
    args = ap.parse_args(argv)
    trace = load_aws_v100_trace(str(data_dir(args.data)), 300, None if args.all_zones else US_EAST_1)
    cfg = DeadlineConfig(start_every_hours=args.start_every)
    jobs = deadline_jobs(trace, cfg)
    market = TraceMarket(trace)
    scenario = "all 9 zones" if args.all_zones else "us-east-1 (4 zones)"
    out: dict[str, dict[str, float]] = {}
    for name in args.policies.split(","):
        timed = Timed(make_strategy(name, restart_hours=cfg.restart_hours), live=args.live)
        for job in jobs:
            run_deadline(market, job, timed)  # type: ignore[arg-type]
        ms = [t * 1000 for t in timed.times]
        prep = [t * 1000 for t in timed.prepare_times]
        stats = getattr(timed.inner, "stats", {})
        out[name] = {
            "decisions": len(ms),
            "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99),
            "max_ms": max(ms, default=0.0),
            "prepares": len(prep),
            "prepare_p50_ms": percentile(prep, 50) if prep else 0.0,
            "prepare_p99_ms": percentile(prep, 99) if prep else 0.0,
            "prepare_max_ms": max(prep, default=0.0),
            "prepare_total_s": sum(prep) / 1000,
            "prepare_solves": stats.get("prepare_solves", 0),
            "inline_solves": stats.get("inline_solves", 0),
        }
    if args.json:
        print(json.dumps({"jobs": len(jobs), "scenario": scenario, "policies": out}, indent=2))
        return 0
    print(f"{len(jobs)} jobs, {scenario}, 5-minute ticks")
    print(f"{'policy':<12} {'decisions':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, r in out.items():
        print(f"{name:<12} {r['decisions']:>9} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.2f}")
    for name, r in out.items():
        if r["prepares"]:
            print(
                f"{name}: prepare (once per tick, before the decisions) {r['prepares']} calls, p50 "
                f"{r['prepare_p50_ms']:.2f} ms, p99 {r['prepare_p99_ms']:.2f} ms, max {r['prepare_max_ms']:.2f} ms, "
                f"total {r['prepare_total_s']:.1f} s; tables solved in prepare {r['prepare_solves']}, "
                f"inline in decide {r['inline_solves']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
