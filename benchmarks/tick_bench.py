"""The control loop at scale: how long one tick and each of its steps take with thousands of running jobs, on one
replica or shared by several (shard leases, broker/store/shards.py).

The built-in simulated market and on-prem cluster, on a clock the script moves by `--minutes` per set-up tick and
by `--step-seconds` (10, the broker's tick interval) per measured round. Setting
up: `--seed-jobs` jobs (5 accelerator choices, 1-8 GPUs, 20-26 h of work, so none finishes during the run) are
submitted through the service, placed and started by three ticks, then cloned in bulk (Core executemany of jobs,
placements and simulated instances; each clone carries its template's state) up to `--jobs` running jobs. Then
`--replicas` tick processes (1: this process) tick `--ticks` times together: every round each replica ticks at
the same simulated time, started together on a barrier, and the round's wall time is the slowest replica's tick.
Printed per round: wall, each replica's broker CPU (this process's CPU, not PostgreSQL's), the shards each holds,
and the steps that took time (the slowest replica's). The first rounds let the replicas settle their shares; the
steady rounds (from the 4th) are what a broker with that many running jobs pays every tick: sync, the
return-on-prem check, cost accrual. Target: 50,000 running jobs in <= 5 s wall on one replica; near-linear
speed-up with 2 and 4 replicas.

Run (from the repository root, in the environment where the project is installed):
    python benchmarks/tick_bench.py                          # 5,000 jobs, PostgreSQL (a throw-away server)
    python benchmarks/tick_bench.py --jobs 50000 --replicas 4
    python benchmarks/tick_bench.py --jobs 20000 --profile 25   # cProfile the steady ticks (one replica)
    python benchmarks/tick_bench.py --deadline-share 1 --profile 25 --profile-first   # ... or a fresh process's first
    python benchmarks/tick_bench.py --db sqlite --jobs 2000 --ticks 8
    python benchmarks/tick_bench.py --json
    python benchmarks/tick_bench.py --jobs 5000 --deadline-share 1 --move-check-seconds 0   # the move step, worst case
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import multiprocessing
import os
import pstats
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert, select

from broker.api.schemas import JobCreate
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.accrue import grid_point
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.services.jobs import new_id, submit_job
from broker.store.tables import Job, Placement, SimInstanceRow
from tests.builders import job_body
from tests.pg import start_postgres

ACCELERATORS = ["A100", "V100", "A10G", "L4", "H100"]
START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SHOWN = [
    "sync_instances",
    "return_onprem",
    "move_deadline_jobs",
    "accrue_costs",
    "read_mailboxes",
    "refresh_prices",
    "sweep_orphans",
]
_J, _P, _S = (t.__table__ for t in (Job, Placement, SimInstanceRow))  # type: ignore[attr-defined]


class Clock:
    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _settings(db_url: str, workdir: Path, jobs: int, minutes: float, move_check_seconds: float = 60.0) -> Settings:
    # leases outlive the simulated gap between two rounds, so every replica stays live for the others
    return Settings(
        database_url=db_url,
        data_dir=workdir,
        bootstrap_api_key=DEV_API_KEY,
        max_placements_per_tick=jobs,
        shard_lease_seconds=3 * minutes * 60,
        move_check_seconds=move_check_seconds,
    )


def generate(
    db_url: str, workdir: Path, jobs: int, seed_jobs: int, minutes: float, deadline_share: float = 0.0
) -> tuple[datetime, float]:
    """`jobs` running jobs in the database (the first `deadline_share` of every 100 seed jobs, and so of their
    clones, with a deadline 72 h out); returns the simulated time of the last set-up tick and the seconds."""
    started = time.perf_counter()
    clock = Clock()
    rt = build_runtime(_settings(db_url, workdir, jobs, minutes), clock=clock)
    tick(rt, clock())
    for i in range(min(seed_jobs, jobs)):
        body = job_body(
            name=f"bench-{i}",
            accelerators=ACCELERATORS,
            gpu_count=[1, 1, 2, 4, 8][i % 5],
            work_gpu_hours=str(20 + i % 7),
            max_total_usd="5000",
            **({"deadline": (clock() + timedelta(hours=72)).isoformat()} if i % 100 < deadline_share * 100 else {}),
        )
        submit_job(rt.engine, rt.catalog, tenant="demo", create=JobCreate(**body), idempotency_key=None, now=clock())
    for _ in range(3):  # placed, started, accrued once
        clock.now += timedelta(minutes=minutes)
        tick(rt, clock())
    _clone(rt, jobs)
    rt.engine.dispose()
    return clock.now, time.perf_counter() - started


def _clone(rt: Runtime, jobs: int) -> None:
    """Copy the running seed jobs (job, placement, simulated instance) until there are `jobs` running jobs."""
    cadence = timedelta(seconds=rt.settings.accrual_cadence_seconds or 1)
    with rt.engine.begin() as conn:
        placements = [dict(r) for r in conn.execute(select(_P).where(_P.c.state == "running")).mappings()]
        if not placements:
            raise SystemExit("no seed job is running after the set-up ticks")
        seeds = {r["id"]: dict(r) for r in conn.execute(select(_J)).mappings()}
        sims = {(r["provider"], r["launch_token"]): dict(r) for r in conn.execute(select(_S)).mappings()}
        missing = jobs - len(placements)
        for start in range(0, max(0, missing), 5000):
            job_rows, placement_rows, sim_rows = [], [], []
            for n in range(start, min(missing, start + 5000)):
                p = placements[n % len(placements)]
                job, sim = seeds[p["job_id"]], sims[(p["provider"], p["launch_token"])]
                job_id, pid, token = new_id("job"), new_id("plc"), f"bench-{n}-{os.urandom(6).hex()}"
                instance_id = f"{sim['instance_id'][:40]}-c{n}"
                job_rows.append({**job, "id": job_id, "name": f"clone-{n}", "current_placement_id": pid})
                # accrued up to the clone's own accrual grid point (its phase is its id's), as a placement that
                # has run a while is, rather than all at the template's mark
                mark = p["accrued_until"] and grid_point(pid, p["accrued_until"], cadence)
                placement_rows.append(
                    {**p, "id": pid, "job_id": job_id, "launch_token": token, "instance_id": instance_id}
                    | {"accrued_until": mark}
                )
                sim_rows.append({**sim, "launch_token": token, "instance_id": instance_id})
            conn.execute(insert(_J), job_rows)
            conn.execute(insert(_P), placement_rows)
            conn.execute(insert(_S), sim_rows)


def replica(
    index: int,
    db_url: str,
    workdir: str,
    jobs: int,
    minutes: float,
    step_seconds: float,
    first: str,
    ticks: int,
    barrier: Any,
    out: Any,
    profile_top: int,
    move_check_seconds: float = 60.0,
    profile_first: bool = False,
) -> None:
    """One tick replica: `ticks` rounds at the simulated times after `first`, each started on `barrier`; with
    `profile_top`, cProfile the steady rounds (from the 4th) or, with `profile_first`, the first round only."""
    logging.disable(logging.WARNING)
    clock = Clock(datetime.fromisoformat(first))
    rt = build_runtime(_settings(db_url, Path(workdir), jobs, minutes, move_check_seconds), clock=clock)
    rt.shares_work = True  # a long-running replica, as `overspill serve` runs one
    profiler = cProfile.Profile() if profile_top else None
    rows = []
    for n in range(ticks):
        clock.now = datetime.fromisoformat(first) + timedelta(seconds=step_seconds * (n + 1))
        barrier.wait()
        if profiler is not None and (n == 0 if profile_first else n >= 3):
            profiler.enable()
        cpu, wall = time.process_time(), time.perf_counter()
        report = tick(rt, clock())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if profiler is not None:
            profiler.disable()
        rows.append(
            {
                "wall": round(wall, 3),
                "cpu": round(cpu, 3),
                "shards": report.shards,
                "steps": {s.name: {"count": s.count, "seconds": round(s.seconds, 3)} for s in report.steps},
                "errors": [f"{s.name}: {s.error}" for s in report.steps if s.error],
            }
        )
    rt.engine.dispose()
    profile = ""
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(profile_top)
        profile = text.getvalue()
    out.put((index, rows, profile))


def run(
    db_url: str,
    jobs: int,
    ticks: int,
    minutes: float,
    replicas: int,
    seed_jobs: int,
    profile_top: int,
    step_seconds: float,
    deadline_share: float = 0.0,
    move_check_seconds: float = 60.0,
    profile_first: bool = False,
) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="tick-bench-"))
    first, setup_seconds = generate(db_url, workdir, jobs, seed_jobs, minutes, deadline_share)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(replicas), ctx.Queue()
    args = (db_url, str(workdir), jobs, minutes, step_seconds, first.isoformat(), ticks, barrier, out)
    procs = [
        ctx.Process(target=replica, args=(i, *args, profile_top if i == 0 else 0, move_check_seconds, profile_first))
        for i in range(replicas)
    ]
    for p in procs:
        p.start()
    results = {index: (rows, profile) for index, rows, profile in (out.get() for _ in procs)}
    for p in procs:
        p.join()
    by_replica = [results[i][0] for i in range(replicas)]
    rounds = []
    for n in range(ticks):
        ticks_n = [r[n] for r in by_replica]
        slowest = max(ticks_n, key=lambda t: t["wall"])
        rounds.append(
            {
                "round": n,
                "wall": max(t["wall"] for t in ticks_n),
                "cpu": [t["cpu"] for t in ticks_n],
                "shards": [t["shards"] for t in ticks_n],
                "steps": slowest["steps"],
                "errors": [e for t in ticks_n for e in t["errors"]],
            }
        )
    steady = rounds[3:]
    return {
        "jobs": jobs,
        "replicas": replicas,
        "setup_seconds": round(setup_seconds, 2),
        "rounds": rounds,
        "steady_wall_p50_seconds": statistics.median(r["wall"] for r in steady) if steady else None,
        "steady_wall_max_seconds": max(r["wall"] for r in steady) if steady else None,
        "steady_cpu_p50_seconds_per_replica": statistics.median(c for r in steady for c in r["cpu"])
        if steady
        else None,
        "profile": results[0][1],
    }


def table(result: dict[str, Any], backend: str) -> str:
    head = f"{'round':>5} {'wall s':>7} {'CPU s per replica':>22} {'shards':>14}  " + "  ".join(
        f"{name:>21}" for name in SHOWN
    )
    lines = [
        f"{backend}: {result['jobs']:,} running jobs generated in {result['setup_seconds']} s; "
        f"{result['replicas']} replica(s)",
        head,
        "-" * len(head),
    ]
    for row in result["rounds"]:
        cells = []
        for name in SHOWN:
            step = row["steps"].get(name)
            cells.append(f"{step['count']:>6} in {step['seconds']:>8.2f} s" if step else f"{'-':>21}")
        cpu = "/".join(f"{c:.2f}" for c in row["cpu"])
        shards = "/".join(str(s) for s in row["shards"])
        lines.append(f"{row['round']:>5} {row['wall']:>7.2f} {cpu:>22} {shards:>14}  " + "  ".join(cells))
        for error in row["errors"][:5]:
            lines.append(f"      ERROR {error}")
    if result["steady_wall_p50_seconds"] is not None:
        lines.append(
            f"steady rounds (from the 4th): wall p50 {result['steady_wall_p50_seconds']:.2f} s, "
            f"max {result['steady_wall_max_seconds']:.2f} s; broker CPU per replica tick p50 "
            f"{result['steady_cpu_p50_seconds_per_replica']:.2f} s"
        )
    lines.append(
        f"load average (1/5/15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
        f"on {os.cpu_count()} CPUs"
    )
    if result["profile"]:
        lines.append(result["profile"])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--ticks", type=int, default=6, help="rounds: every replica ticks once per round")
    parser.add_argument("--replicas", type=int, default=1, help="tick processes sharing the work")
    parser.add_argument("--seed-jobs", type=int, default=500, help="jobs submitted and placed; the rest are clones")
    parser.add_argument("--minutes", type=float, default=2.0, help="simulated minutes between the set-up ticks")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=10.0,
        help="simulated seconds between the measured rounds (default: the broker's tick interval)",
    )
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N of replica 0's profile")
    parser.add_argument(
        "--profile-first",
        action="store_true",
        help="profile the first measured round (a fresh process: nothing memoised yet) instead of the steady ones",
    )
    parser.add_argument(
        "--deadline-share",
        type=float,
        default=0.0,
        help="share of the jobs with a deadline (72 h out): the move step asks the deadline policy about those",
    )
    parser.add_argument(
        "--move-check-seconds",
        type=float,
        default=60.0,
        help="the move step's move_check_seconds (0: every deadline job on every tick, the worst case)",
    )
    parser.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    options = (
        args.jobs,
        args.ticks,
        args.minutes,
        args.replicas,
        args.seed_jobs,
        args.profile,
        args.step_seconds,
        args.deadline_share,
        args.move_check_seconds,
        args.profile_first,
    )
    if args.db == "postgresql":
        pg = start_postgres()
        try:
            result = run(pg.create_database(), *options)
        finally:
            pg.stop()
    else:
        path = Path(tempfile.mkdtemp(prefix="tick-bench-")) / "broker.store.db"
        result = run(f"sqlite:///{path}", *options)
    if args.json:
        print(json.dumps({"backend": args.db, **result}))
    else:
        print(table(result, args.db))
    sys.exit(1 if any(r["errors"] for r in result["rounds"]) else 0)


if __name__ == "__main__":
    main()
