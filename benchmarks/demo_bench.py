"""`overspill demo` wall time, as a newcomer runs it: the whole command in a fresh process (imports, migrations,
24 jobs, the simulated day and a half, the summary), with its default persistent database in an empty temporary
data directory, and with `--throwaway`.

Target (issue 16): under 20 s wall on the 2-core development machine. Prints, per mode and run, the wall time,
the CPU time of the process (user + system) and the simulated hours, then the best wall time per mode.

Run (from the repository root):
    python benchmarks/demo_bench.py
    python benchmarks/demo_bench.py --runs 3 --jobs 24
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def run_once(jobs: int, throwaway: bool) -> tuple[float, float, float]:
    """One `overspill demo --json` in a new process: (wall seconds, CPU seconds, simulated hours)."""
    with tempfile.TemporaryDirectory(prefix="overspill-demo-bench-") as data_dir:
        env = {**os.environ, "OVERSPILL_DATA_DIR": data_dir}
        env.pop("OVERSPILL_DATABASE_URL", None)
        cmd = [sys.executable, "-c", "from broker.cli.main import main; main()", "demo", "--jobs", str(jobs), "--json"]
        if throwaway:
            cmd.append("--throwaway")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = json.loads(out.stdout)
    done = sum(1 for j in result["jobs"] if j["state"] == "succeeded")
    if done != jobs:
        raise SystemExit(f"only {done}/{jobs} demo jobs finished")
    return wall, cpu, float(result["simulated_hours"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1, help="runs per mode")
    parser.add_argument("--jobs", type=int, default=24, help="demo jobs (the command's default is 24)")
    args = parser.parse_args()
    print(f"overspill demo, {args.jobs} jobs, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    for mode, throwaway in (("persistent (default)", False), ("--throwaway", True)):
        walls = []
        for i in range(args.runs):
            wall, cpu, hours = run_once(args.jobs, throwaway)
            walls.append(wall)
            print(f"  {mode:22s} run {i + 1}: {wall:6.2f} s wall, {cpu:6.2f} s CPU, {hours:.1f} simulated hours")
        print(f"{mode:24s} best {min(walls):.2f} s wall (target < 20 s)")


if __name__ == "__main__":
    main()
