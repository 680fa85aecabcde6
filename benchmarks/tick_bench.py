"""The control loop at scale: how long one tick and each of its steps take with thousands of jobs.

One broker process (no API), the built-in simulated market and on-prem cluster, on a clock the script moves by
`--minutes` per tick. It submits `--jobs` jobs (5 accelerator choices, 1-8 GPUs, 20-26 h of work, so none
finishes during the run), then ticks `--ticks` times and prints each tick's total and the steps that took time:
the first tick places everything, the next ones see the instances start (state changes for every placement),
then the steady ticks are what a broker with that many running jobs pays every tick (sync, return-on-prem check,
cost accrual). Target: a steady tick well under the tick interval (10 s by default), so the loop keeps up.

Run (from the repository root, in the environment where the project is installed):
    python benchmarks/tick_bench.py                          # 5,000 jobs, PostgreSQL (a throw-away server)
    python benchmarks/tick_bench.py --db sqlite --jobs 2000 --ticks 8
    python benchmarks/tick_bench.py --json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.schemas import JobCreate
from broker.services.jobs import submit_job
from broker.settings import DEV_API_KEY, Settings
from tests.builders import job_body
from tests.pg import start_postgres

ACCELERATORS = ["A100", "V100", "A10G", "L4", "H100"]


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def run(db_url: str, jobs: int, ticks: int, minutes: float, progress: bool) -> dict[str, Any]:
    clock = Clock()
    workdir = Path(tempfile.mkdtemp(prefix="tick-bench-"))
    settings = Settings(
        database_url=db_url, data_dir=workdir, bootstrap_api_key=DEV_API_KEY, max_placements_per_tick=jobs
    )
    rt = build_runtime(settings, clock=clock)
    tick(rt, clock())
    started = time.perf_counter()
    for i in range(jobs):
        body = job_body(
            name=f"bench-{i}",
            accelerators=ACCELERATORS,
            gpu_count=[1, 1, 2, 4, 8][i % 5],
            work_gpu_hours=str(20 + i % 7),
            max_total_usd="5000",
        )
        submit_job(rt.engine, rt.catalog, tenant="demo", create=JobCreate(**body), idempotency_key=None, now=clock())
    submit_seconds = time.perf_counter() - started
    rows = []
    for n in range(ticks):
        clock.now += timedelta(minutes=minutes)
        report = tick(rt, clock())
        steps = {s.name: {"count": s.count, "seconds": round(s.seconds, 3)} for s in report.steps}
        total = sum(s.seconds for s in report.steps)
        errors = [f"{s.name}: {s.error}" for s in report.steps if s.error]
        rows.append({"tick": n, "seconds": round(total, 3), "steps": steps, "errors": errors})
        if progress:
            print(f"tick {n}: {total:.1f} s", file=sys.stderr, flush=True)
    rt.engine.dispose()
    steady = [r["seconds"] for r in rows[3:]]
    return {
        "jobs": jobs,
        "submit_seconds": round(submit_seconds, 2),
        "ticks": rows,
        "steady_tick_p50_seconds": statistics.median(steady) if steady else None,
        "steady_tick_max_seconds": max(steady) if steady else None,
    }


def table(result: dict[str, Any], backend: str) -> str:
    shown = [
        "place_pending",
        "sync_instances",
        "return_onprem",
        "accrue_costs",
        "refresh_prices",
        "sweep_orphans",
        "check_budgets",
    ]
    head = f"{'tick':>4} {'total s':>8}  " + "  ".join(f"{name:>22}" for name in shown)
    lines = [f"{backend}: {result['jobs']:,} jobs submitted in {result['submit_seconds']} s", head, "-" * len(head)]
    for row in result["ticks"]:
        cells = []
        for name in shown:
            step = row["steps"].get(name)
            cells.append(f"{step['count']:>7} in {step['seconds']:>8.2f} s" if step else f"{'-':>22}")
        lines.append(f"{row['tick']:>4} {row['seconds']:>8.2f}  " + "  ".join(f"{c:>22}" for c in cells))
        for error in row["errors"]:
            lines.append(f"     ERROR {error}")
    if result["steady_tick_p50_seconds"] is not None:
        lines.append(
            f"steady ticks (from the 4th): p50 {result['steady_tick_p50_seconds']:.2f} s, "
            f"max {result['steady_tick_max_seconds']:.2f} s"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--ticks", type=int, default=6)
    parser.add_argument("--minutes", type=float, default=2.0, help="simulated minutes between ticks")
    parser.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    if args.db == "postgresql":
        pg = start_postgres()
        try:
            result = run(pg.create_database(), args.jobs, args.ticks, args.minutes, not args.json)
        finally:
            pg.stop()
    else:
        path = Path(tempfile.mkdtemp(prefix="tick-bench-")) / "broker.db"
        result = run(f"sqlite:///{path}", args.jobs, args.ticks, args.minutes, not args.json)
    if args.json:
        print(json.dumps({"backend": args.db, **result}))
    else:
        print(table(result, args.db))
    sys.exit(1 if any(r["errors"] for r in result["ticks"]) else 0)


if __name__ == "__main__":
    main()
