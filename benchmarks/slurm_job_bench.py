"""What reading a held Slurm job costs a burst: `read_job` (scontrol write batch_script, scontrol show job, sacct
--env-vars, as the broker's non-root operator) and `cloud_job` (the command, environment and image), per job.

It starts the throw-away real cluster of the test suite (tests/slurm_cluster.py: slurmctld, two slurmd, slurmdbd
with `AccountingStoreFlags=job_env`), submits `--jobs` held jobs as alice with a script of `--script-kib` KiB from a
mapped directory, waits until accounting holds their environments, then reads and builds each one `--repeat` times
and prints the median and 95th percentile of both steps (milliseconds), and how many Slurm commands a burst adds.

Target: a burst adds three read-only Slurm commands and well under a second per job (it happens once per burst,
just before the hold, never per tick for jobs that do not burst).

Run (from the repository root, as root, in the environment where the project is installed):
    python benchmarks/slurm_job_bench.py                     # 10 jobs, 2 KiB scripts, 3 reads each
    python benchmarks/slurm_job_bench.py --script-kib 90     # near the 96 KiB bound
    python benchmarks/slurm_job_bench.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.slurm_job import cloud_job
from providers.slurm_script import read_job
from tests.slurm_cluster import start_slurm_cluster


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--script-kib", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cluster = start_slurm_cluster()
    try:
        work = cluster.root / "shared" / "bench"
        work.mkdir()
        alice = pwd.getpwnam("alice")
        os.chown(work, alice.pw_uid, alice.pw_gid)
        body = "".join(f": padding line {i} {'x' * 50}\n" for i in range(args.script_kib * 1024 // 70))
        (work / "job.sh").write_text(f"#!/bin/bash\n#SBATCH --gres=gpu:a100:1\n{body}echo $SLURM_JOB_ID\n")
        for _ in range(2):  # every GPU busy: the jobs pend for Resources, eligible (slurmdbd gets their records)
            fill = ["sbatch", "-A", "beta", "--gres=gpu:a100:4", "--output=/dev/null", "--wrap=sleep 600"]
            cluster.run_as("bob", fill, check=True)
        ids = []
        for _ in range(args.jobs):
            cmd = f"cd {work} && BENCH=1 sbatch --parsable -A acme --output=/dev/null job.sh"
            ids.append(cluster.run_as("alice", ["bash", "-c", cmd], check=True).stdout.strip())
        run = cluster.broker_runner()
        deadline = time.monotonic() + 60
        while not all("BENCH=1" in run(["sacct", "-j", i, "--env-vars"]).stdout for i in ids):
            if time.monotonic() > deadline:
                raise SystemExit("slurmdbd did not get the jobs' environments within 60 s")
            time.sleep(0.5)
        calls = 0

        def counting(argv: list[str]):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            return run(argv)

        reads, builds = [], []
        for _ in range(args.repeat):
            for i in ids:
                t0 = time.perf_counter()
                details = read_job(counting, i)
                t1 = time.perf_counter()
                cloud_job(details, gpus=1, paths={str(cluster.root): "/mnt/site"})
                t2 = time.perf_counter()
                reads.append((t1 - t0) * 1000)
                builds.append((t2 - t1) * 1000)
        out = {
            "jobs": args.jobs,
            "script_bytes": len((work / "job.sh").read_bytes()),
            "slurm_calls_per_burst": calls / (args.jobs * args.repeat),
            "read_ms_median": round(statistics.median(reads), 1),
            "read_ms_p95": round(_pct(reads, 0.95), 1),
            "build_ms_median": round(statistics.median(builds), 2),
            "build_ms_p95": round(_pct(builds, 0.95), 2),
        }
    finally:
        cluster.stop()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:24} {v}")


if __name__ == "__main__":
    main()
