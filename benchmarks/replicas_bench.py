"""Many replicas, the long variant: N tick processes and M uvicorn API processes against one PostgreSQL, with
5,000 jobs submitted concurrently over HTTP (httpx, 64 in flight, each with an Idempotency-Key) to the built-in
simulated market. Prints submission and placement throughput, the share of each tick replica, how long the
replicas' ticks take while placing and then at full load (`--steady-ticks` more ticks each once every job is
placed), and the exactly-once check (tests/replicas.py): every accepted job stored once and placed once, no
overlapping placements, attempts = placements (no lost update), unique launch tokens, one instance per token,
ledger = spend, and no step error (deadlock, serialisation failure) in any replica. Progress goes to stderr
every 10 s; each process's own output stays in the work directory printed at the end.

Needs the PostgreSQL server binaries (`apt-get install postgresql`).

Run (from the repository root, in the environment where the project is installed):
    python benchmarks/replicas_bench.py                         # 5,000 jobs, 4 tick + 2 API processes (~3 min)
    python benchmarks/replicas_bench.py --steady-ticks 40       # then ~4 min at full load: every instance started
    python benchmarks/replicas_bench.py --jobs 1000 --tick-procs 2 --api-procs 1 --concurrency 32
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pg import start_postgres
from tests.replicas import run_replicas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--tick-procs", type=int, default=4)
    parser.add_argument("--api-procs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tick-seconds", type=float, default=0.5, help="pause between one replica's ticks")
    parser.add_argument("--steady-ticks", type=int, default=3, help="ticks per replica once every job is placed")
    parser.add_argument("--json", action="store_true", help="print one JSON object of figures")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    pg = start_postgres()
    try:
        report = run_replicas(
            db_url=pg.create_database(),
            jobs=args.jobs,
            tick_procs=args.tick_procs,
            api_procs=args.api_procs,
            concurrency=args.concurrency,
            tick_seconds=args.tick_seconds,
            steady_ticks=args.steady_ticks,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    finally:
        pg.stop()
    if args.json:
        figures = {k: v for k, v in dataclasses.asdict(report).items() if k != "workdir"}
        print(json.dumps({**figures, "placements_per_second": report.placements_per_second}))
        sys.exit(0 if not report.step_errors and not report.violations else 1)
    print(report.table(args.tick_procs, args.api_procs))
    print(
        f"load average (1/5/15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
        f"on {os.cpu_count()} CPUs"
    )
    print(f"process logs: {report.workdir}")
    for line in (report.step_errors + report.violations)[:20]:
        print(f"PROBLEM: {line}")
    sys.exit(0 if not report.step_errors and not report.violations else 1)


if __name__ == "__main__":
    main()
