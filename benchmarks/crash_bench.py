"""Crash consistency, the long variant: SIGKILL the broker at every crash point, at many arrival counts, restart it
and check the invariants (no job lost, none running twice, no instance billing without a placement, ledger =
placements, ceilings honoured; for checkpoint copies: the resumed copy is byte-identical and reuses the parts
already uploaded). The harness is tests/crash_harness.py; tests/test_crash.py runs a subset in CI.

Each broker injection: a fresh PostgreSQL database and a reset moto account, `--jobs` jobs on AWS spot (g5.xlarge
through the real EC2 adapter against moto), the scenario for its point (placed, started, warned of a reclaim,
cancelled or accruing), one `overspill tick` process killed at `point:N` for N = 1..--jobs, two clean `overspill
tick` processes (each with an orphan sweep, no grace), then the checks. Copy injections: a 27.5 MiB checkpoint in
5 MiB parts, killed after part N = 1..6, then rerun.

Needs the PostgreSQL server binaries (`apt-get install postgresql`) and moto (the dev extra).

Run (from the repository root, in the environment where the project is installed):
    python benchmarks/crash_bench.py                # 6 broker points x 8 + 6 copy injections = 54
    python benchmarks/crash_bench.py --jobs 4 --points accrue.after_commit,copy.between_parts
    python benchmarks/crash_bench.py --json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.crash_harness import COPY_PARTS, COPY_POINT, POINTS, Env, format_table, run_injection
from tests.moto_server import running_moto_server
from tests.pg import start_postgres


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=8, help="jobs per broker injection (= arrivals N tried)")
    parser.add_argument("--points", default=",".join(POINTS), help="comma-separated crash points")
    parser.add_argument("--json", action="store_true", help="print one JSON object per injection")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    points = [p.strip() for p in args.points.split(",") if p.strip()]
    unknown = set(points) - set(POINTS)
    if unknown:
        parser.error(f"unknown crash points {sorted(unknown)}; known: {', '.join(POINTS)}")
    plan = [(p, n) for p in points for n in range(1, (COPY_PARTS if p == COPY_POINT else args.jobs) + 1)]
    pg = start_postgres()
    started = time.perf_counter()
    outcomes = []
    try:
        with running_moto_server() as url:
            env = Env(pg.admin_url, url, Path(tempfile.mkdtemp(prefix="crash-bench-")), pg.create_database)
            for i, (point, nth) in enumerate(plan, 1):
                outcome = run_injection(env, point, nth, jobs=args.jobs)
                outcomes.append(outcome)
                if args.json:
                    print(json.dumps({**outcome.__dict__, "survived": outcome.survived}), flush=True)
                else:
                    status = "ok" if outcome.survived else ("NOT KILLED" if not outcome.crashed else "VIOLATED")
                    print(f"[{i}/{len(plan)}] {point}:{nth} {status} ({outcome.seconds:.1f} s)", flush=True)
                    for v in outcome.violations:
                        print(f"    {v}", flush=True)
    finally:
        pg.stop()
    if not args.json:
        print()
        print(format_table(outcomes))
        print(
            f"\n{sum(o.survived for o in outcomes)}/{len(outcomes)} injections survived "
            f"in {time.perf_counter() - started:.0f} s"
        )
    sys.exit(0 if all(o.survived for o in outcomes) else 1)


if __name__ == "__main__":
    main()
