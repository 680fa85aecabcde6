"""Fair share: a tenant flooding the queue with never-placeable top-priority jobs does not delay another tenant.

What it measures
  1. A broker on the simulated market (SQLite in a temp dir, or `--database-url`), one tick to load the catalog.
  2. Tenant `acme` submits `--flood` jobs (default 10,000) at priority 1000 that no pool can ever run (5,000
     GPU-hours under a $1 ceiling): they wait forever. One full tick runs with only the flood waiting.
  3. Tenant `beta` then submits one ordinary job at the lowest priority (-1000). Full ticks run (the clock moves
     `--interval` seconds per tick) until it is placed, at most `--max-ticks`.
  4. Printed: the ticks from beta's submission to its placement (`ticks_to_placement`: 1 means the first tick
     after it placed it), each tick's wall time and its `place_pending` step's, and how many of acme's jobs the
     rounds judged (the rest were skipped or left to later rounds).
  5. Then `--steady` more ticks with only the flood waiting, to show a round skips the jobs whose wait cannot have
     changed (`WaitMemo`): their tick and place times.

Run (from the repository root):
    python benchmarks/fairshare_bench.py
    python benchmarks/fairshare_bench.py --flood 10000 --json
    python benchmarks/fairshare_bench.py --database-url postgresql://... --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, func, select

from broker.api.schemas import JobCreate
from broker.config.settings import Settings
from broker.loop.tick import TickReport, tick
from broker.runtime import Runtime, build_runtime
from broker.services.jobs import submit_job
from broker.store.tables import Job

START = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


def body(name: str, **extra: Any) -> JobCreate:
    fields: dict[str, Any] = {
        "name": name,
        "team": "ml",
        "project": "p",
        "image": "ghcr.io/acme/train:1.0",
        "command": ["python", "train.py"],
        "accelerators": ["A100"],
        "gpu_count": 1,
        "work_gpu_hours": "2",
        "max_total_usd": "50",
    }
    fields.update(extra)
    return JobCreate(**fields)


def submit(rt: Runtime, clock: Clock, tenant: str, create: JobCreate) -> str:
    job, _ = submit_job(rt.engine, rt.catalog, tenant=tenant, create=create, idempotency_key=None, now=clock())
    return job.id


def judged(rt: Runtime) -> int:
    """How many of acme's jobs a round has judged so far (their wait reason is no longer the submission's)."""
    with Session(rt.engine) as s:
        return int(
            s.exec(
                select(func.count())
                .select_from(Job)
                .where(Job.tenant == "acme", col(Job.wait_reason) != "waiting for the next placement round")
            ).one()
        )


def timed_tick(rt: Runtime, clock: Clock, interval: float) -> tuple[TickReport, float]:
    clock.now += timedelta(seconds=interval)
    started = time.perf_counter()
    report = tick(rt, clock())
    return report, time.perf_counter() - started


def place_seconds(report: TickReport) -> float:
    return sum(s.seconds for s in report.steps if s.name == "place_pending")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flood", type=int, default=10_000, help="acme's never-placeable top-priority jobs")
    ap.add_argument("--max-ticks", type=int, default=10)
    ap.add_argument("--steady", type=int, default=3, help="ticks with only the flood waiting, after beta's")
    ap.add_argument("--interval", type=float, default=60.0, help="simulated seconds per tick")
    ap.add_argument("--database-url", default="", help="default: SQLite in a temp dir")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    clock = Clock()
    data = Path(tempfile.mkdtemp(prefix="fairshare-bench-"))
    settings = Settings(data_dir=data, database_url=args.database_url, tick_interval_seconds=args.interval)
    rt = build_runtime(settings, clock=clock)
    tick(rt, clock())

    started = time.perf_counter()
    for i in range(args.flood):
        submit(rt, clock, "acme", body(f"flood{i}", work_gpu_hours="5000", max_total_usd="1", priority=1000))
    flood_submit_s = time.perf_counter() - started

    first, first_s = timed_tick(rt, clock, args.interval)  # the flood alone
    victim = submit(rt, clock, "beta", body("victim", priority=-1000))
    ticks: list[dict[str, Any]] = []
    placed_after: int | None = None
    for n in range(1, args.max_ticks + 1):
        report, seconds = timed_tick(rt, clock, args.interval)
        ticks.append({"tick_seconds": round(seconds, 4), "place_seconds": round(place_seconds(report), 4)})
        with Session(rt.engine) as s:
            state = s.exec(select(Job.state).where(Job.id == victim)).one()
        if state in ("running", "succeeded"):
            placed_after = n
            break
    steady = []
    for _ in range(args.steady):
        report, seconds = timed_tick(rt, clock, args.interval)
        steady.append({"tick_seconds": round(seconds, 4), "place_seconds": round(place_seconds(report), 4)})

    result = {
        "database": rt.engine.dialect.name,
        "flood_jobs": args.flood,
        "max_placements_per_tick": settings.max_placements_per_tick,
        "flood_submit_seconds": round(flood_submit_s, 2),
        "first_flood_tick_seconds": round(first_s, 4),
        "first_flood_place_seconds": round(place_seconds(first), 4),
        "ticks_to_placement": placed_after,
        "victim_ticks": ticks,
        "tick_seconds_mean": round(statistics.fmean(t["tick_seconds"] for t in ticks + steady), 4),
        "steady_ticks": steady,
        "steady_place_seconds_mean": round(statistics.fmean(t["place_seconds"] for t in steady), 4) if steady else None,
        "flood_jobs_judged": judged(rt),
        "remembered_waits": len(rt.wait_memo),
    }
    rt.engine.dispose()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"database: {result['database']}; acme's flood: {args.flood} never-placeable jobs at priority 1000")
        print(f"first tick with the flood alone: {first_s:.3f} s (place_pending {place_seconds(first):.3f} s)")
        print(f"beta's job placed after {placed_after} tick(s) (1 = the first tick after its submission)")
        for i, t in enumerate(ticks, 1):
            print(f"  tick {i}: {t['tick_seconds']:.3f} s, place_pending {t['place_seconds']:.3f} s")
        for i, t in enumerate(steady, 1):
            print(f"  steady tick {i}: {t['tick_seconds']:.3f} s, place_pending {t['place_seconds']:.3f} s")
        print(f"acme's jobs judged so far: {result['flood_jobs_judged']}; remembered waits: {len(rt.wait_memo)}")
    return 0 if placed_after == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
