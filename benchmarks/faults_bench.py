"""Cloud faults, the long variant: jobs placed on AWS (moto), GCP and Azure (the local Compute Engine and ARM stand-ins)
and through the generic libcloud adapter (libcloud's EC2 driver on moto) through a proxy failing 20% of each cloud's API
calls with capacity errors, throttling, 5xx and timeouts in that cloud's own shapes (tests/fault_proxy.py), by the real
adapters and SDK clients that the broker's settings build (broker/config/providers.py), in an in-process broker ticking
once per simulated minute (tests/fault_scenario.py). Prints one table per cloud: attempts per placement, retries and
backoff, blocklist use; and checks every job is placed exactly once with nothing billing unseen.

Needs the PostgreSQL server binaries (`apt-get install postgresql`) and moto (the dev extra) for AWS and libcloud.

Run (from the repository root, in the environment where the project is installed):
    python benchmarks/faults_bench.py                       # every cloud, 300 jobs each, 20% faults, seed 1
    python benchmarks/faults_bench.py --cloud gcp --jobs 100 --rate 0.3 --seed 7
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fault_scenario import CLOUDS, FaultReport, fault_cloud, run_fault_scenario
from tests.pg import PgServer, start_postgres

MAX_TICKS = 120  # Azure prices one location: every capacity error there idles it for the blocklist's 3 minutes


def run_one(cloud: str, pg: PgServer, *, jobs: int, rate: float, seed: int) -> tuple[FaultReport, str, float]:
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix=f"faults-bench-{cloud}-"))
    with fault_cloud(cloud, rate=rate, seed=seed, workdir=workdir) as env:
        report = run_fault_scenario(env, db_url=pg.create_database(), workdir=workdir, jobs=jobs, max_ticks=MAX_TICKS)
        by_action = ", ".join(
            f"{kind} on {action}: {n}" for (kind, action), n in sorted(env.proxy.stats.faults.items())
        )
    return report, by_action, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cloud", choices=[*CLOUDS, "all"], default="all")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rate", type=float, default=0.2, help="share of cloud API calls that fail")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    clouds = list(CLOUDS) if args.cloud == "all" else [args.cloud]
    pg = start_postgres()
    failed = False
    try:
        for cloud in clouds:
            report, by_action, seconds = run_one(cloud, pg, jobs=args.jobs, rate=args.rate, seed=args.seed)
            print(f"{cloud}: {report.api_label} fault rate {args.rate:.0%}, seed {args.seed}, {seconds:.0f} s\n")
            print(report.table())
            print(f"\nfaults by action: {by_action}")
            for v in report.violations:
                print(f"VIOLATION: {v}")
            print()
            failed = failed or bool(report.violations) or report.placed != report.jobs
    finally:
        pg.stop()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
