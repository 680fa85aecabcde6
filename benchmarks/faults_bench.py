"""Cloud faults, the long variant: jobs placed on AWS (moto) through a proxy failing 20% of EC2 calls with
capacity errors, throttling, 5xx and timeouts (tests/fault_proxy.py), by the real AWS adapter and boto3 clients in
an in-process broker ticking once per simulated minute (tests/fault_scenario.py). Prints attempts per placement,
retries and backoff, blocklist use, and checks every job is placed exactly once with nothing billing unseen.

Needs the PostgreSQL server binaries (`apt-get install postgresql`) and moto (the dev extra).

Run (from the repository root, in the environment where the project is installed):
    python benchmarks/faults_bench.py                       # 300 jobs, 20% faults, seed 1
    python benchmarks/faults_bench.py --jobs 100 --rate 0.3 --seed 7
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fault_proxy import running_fault_proxy
from tests.fault_scenario import run_fault_scenario
from tests.moto_server import running_moto_server
from tests.pg import start_postgres


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rate", type=float, default=0.2, help="share of EC2 calls that fail")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    pg = start_postgres()
    started = time.perf_counter()
    try:
        with running_moto_server() as url, running_fault_proxy(url, rate=args.rate, seed=args.seed) as proxy:
            report = run_fault_scenario(
                db_url=pg.create_database(),
                moto_url=url,
                proxy=proxy,
                workdir=Path(tempfile.mkdtemp(prefix="faults-bench-")),
                jobs=args.jobs,
            )
            by_action = {f"{kind} on {action}": n for (kind, action), n in sorted(proxy.stats.faults.items())}
    finally:
        pg.stop()
    print(f"EC2 fault rate {args.rate:.0%}, seed {args.seed}, {time.perf_counter() - started:.0f} s\n")
    print(report.table())
    print("\nfaults by action: " + ", ".join(f"{k}: {v}" for k, v in by_action.items()))
    for v in report.violations:
        print(f"VIOLATION: {v}")
    sys.exit(0 if not report.violations and report.placed == report.jobs else 1)


if __name__ == "__main__":
    main()
