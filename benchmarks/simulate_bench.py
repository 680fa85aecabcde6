"""Trace-driven policy benchmark: preemption strategies on real spot traces, bursting on a real job trace.

What it runs (`federation.simulate.run_simulation`, the code behind `overspill simulate`):
  1. Deadline jobs on the real AWS V100 (p3.2xlarge) availability + spot price traces (SkyNomad segments, 9 zones,
     2023-02-15 to 03-17, resampled to 5-minute ticks), on-demand $3.06/h from the SkyPilot AWS catalog: 48 h of
     work due in 52, 60 or 70 h, one job starting every 12 h of the trace per deadline, 15 minutes of changeover
     per launch, a checkpoint every 30 minutes (60 s to save). Policies: on-demand only; greedy cheapest spot
     with EAGER_NEXT_REGION failover (SkyPilot managed jobs); greedy spot with a deadline safety net (commits to
     on-demand once the slack is gone); Uniform Progress (Can't Be Late, NSDI'24); ours (`overspill`), and ours
     without the pools' availability history (`overspill_no_history`, as a broker without an availability feed
     runs it); the omniscient optimum (exact DP). Two scenarios: all 9 zones, and us-east-1's 4 zones only
     (scarcer, pricier spot), each twice: with AWS's 2-minute interruption notice (the job saves before every
     reclaim: nothing is lost, the same as free checkpoints) and with no notice (a reclaim loses the work since
     the last checkpoint; column "lost h"). Each table also gives cost / optimum over the jobs of the first half
     of the trace (windows ending by its middle: the set Overspill's parameters were tuned on) and of the second
     half (held out), and a line ranking the policies that met every deadline. Everything is deterministic (no
     random seeds): the same command gives the same tables.
  2. Other markets (`--suite markets`, also in `all`): every other spot availability trace in the shared data that
     fits the deadline model - the 2022 AWS V100 windows (spot-traces aws-10-26-2022, us-west-2a/b, 10-minute
     ticks, 1 GPU p3.2xlarge and 8 GPUs p3.16xlarge) - one table each (with and without notice), the same jobs;
     those traces carry no price, so each zone's spot price is the catalog's cheapest us-west-2 spot price for
     the type. Nothing was tuned on them (the policies' parameters come from the first half of the 2023 trace).
  3. Bursting with the Philly job trace (10,000 jobs from the 300th, ~250 h of arrivals) on a 1,024-GPU on-prem
     cluster (FIFO + EASY backfill), cloud V100 on-demand from the catalog; every 10th job has a deadline of
     arrival + 2 x its runtime + 30 min. Policies: on-prem only; fixed timeout (SkyPilot's Slurm burst, 2 min,
     plus longer timeouts); fixed spill order with a cloud quota (Kueue MultiKueue); ours at several values of
     GPU time. Then, for each baseline point, ours' best p95 wait among our runs that spent no more.

Output: the tables (and the matched-spend lines), or one JSON object with `--json` (summaries, and under
deadline.jobs, per scenario, every job's start, deadline, work, optimum and per policy its cost, whether it met
the deadline, finish time and work lost, for outside evaluators; plus the command line); `--png PATH` also
writes a chart (needs matplotlib). Data is read in place from `--data`, `$OVERSPILL_SHARED_DATA`, or
`../shared/data` next to the repository. `--quick` runs a smaller version; `--workers` sets processes (default 2).
`--explain` adds after each deadline table, per half of the trace, where each policy's excess over the optimum comes
from (on-demand $ and spot $ over the optimum's, changeovers, redone work, on-demand hours bought while spot was up
or once the slack was gone, idle hours while spot was up) and the worst jobs of ours
(`federation/simulate/explain.py`); `--only TEXT` runs just the deadline tables whose title contains TEXT.
`--policies a,b,c` runs those deadline policies instead of the default set (the optimum is always there; include
`on_demand` for the "x on-demand" column), e.g. to add `model_dp` (`federation/model_dp.py`, not in the default set).
`--hindsight` re-tunes ours (`Overspill`) on a grid (`federation/simulate/tuning.py`) on the first half of each
table's trace, scores that choice on the second, and also tunes it on the second half itself: the best the family
reaches with parameters chosen knowing the jobs it is scored on (an upper bound for tuning; decisions still see only
the past).

Run (from the repository root):
    python benchmarks/simulate_bench.py
    python benchmarks/simulate_bench.py --json --png /tmp/simulate.png
    python benchmarks/simulate_bench.py --suite deadline --quick
    python benchmarks/simulate_bench.py --suite markets --json > markets.json   # per-job export included
    python benchmarks/simulate_bench.py --suite deadline --explain --only "us-east-1 only"
    python benchmarks/simulate_bench.py --model-check
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from federation.simulate import DeadlineConfig, run_simulation

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir(given: str | None) -> Path:
    for candidate in (given, os.environ.get("OVERSPILL_SHARED_DATA"), str(REPO_ROOT.parent / "shared" / "data")):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    raise SystemExit("shared data folder not found: pass --data or set OVERSPILL_SHARED_DATA")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="shared data folder (default: $OVERSPILL_SHARED_DATA or ../shared/data)")
    ap.add_argument("--suite", choices=("all", "deadline", "markets", "gcp", "burst"), default="all")
    ap.add_argument("--quick", action="store_true", help="smaller experiments (a smoke run)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument(
        "--explain",
        action="store_true",
        help="after each deadline table, where each policy's excess over the optimum comes from, per half",
    )
    ap.add_argument(
        "--hindsight",
        action="store_true",
        help="re-tune ours on a grid on the first half (scored on the second) and on the second half itself",
    )
    ap.add_argument(
        "--model-check",
        action="store_true",
        help="only score the availability model on the 2023 trace's held-out half (federation/simulate/modelcheck.py)",
    )
    ap.add_argument("--only", help="run only the deadline tables whose title contains this (e.g. 'us-east-1')")
    ap.add_argument(
        "--policies",
        help="comma-separated deadline policies instead of the default set (e.g. add model_dp: "
        "on_demand,greedy_safety_net,uniform_progress,overspill,model_dp)",
    )
    ap.add_argument("--png", type=Path, help="also write a chart to this PNG file (needs matplotlib)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    if args.model_check:
        from federation.simulate.experiments import load_aws_v100_trace
        from federation.simulate.modelcheck import model_check, model_table

        trace = load_aws_v100_trace(str(data_dir(args.data)), 300, None)
        print(f"Availability model, fitted on the first half of {trace.source}, scored on the second (9 zones):")
        print(model_table(model_check(trace, (0.0, 0.5, 1.0, 2.0))))
        return 0
    deadline = DeadlineConfig(policies=tuple(args.policies.split(","))) if args.policies else None
    report = run_simulation(
        data_dir(args.data),
        deadline=deadline,
        suite=args.suite,
        quick=args.quick,
        workers=args.workers,
        png=args.png,
        explain=args.explain,
        only=args.only,
        hindsight=args.hindsight,
    )
    elapsed = time.perf_counter() - started
    if args.json:
        doc = report.to_json()
        doc["elapsed_seconds"] = round(elapsed, 1)
        doc["command"] = " ".join(
            ["python", "benchmarks/simulate_bench.py", *(argv if argv is not None else sys.argv[1:])]
        )
        json.dump(doc, sys.stdout, indent=2, default=str)
        print()
    else:
        print(report.tables())
        print(f"\n({elapsed:.1f} s{'' if args.png is None else f', chart: {args.png}'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
