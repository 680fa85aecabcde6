"""What a burst costs on the real cluster: reading the held job, and how long a burst takes to reach the cloud.

1. Reading: `read_job` (scontrol write batch_script, scontrol show job, sacct --env-vars, as the broker's non-root
   operator) and `cloud_job` (the command, environment and image), per job. `--jobs` held jobs are submitted as
   alice with a script of `--script-kib` KiB from a mapped directory; once accounting holds their environments each
   is read and built `--repeat` times: median and 95th percentile of both steps (milliseconds), and how many Slurm
   commands a burst adds. Target: three read-only commands and well under a second per job (once per burst).
2. Latency, per transport (`--transports cli,rest`: the Slurm tools, or slurmrestd v0.0.38 with a JWT), over
   `--latency-rounds` bursts: a real broker runtime (settings, tick with every step) over the real cluster and a
   scripted cloud stand-in (tests/scripted.py, whose instances run as soon as they are requested); every GPU busy,
   one opted-in job pending. Ticks run back to back from the tick whose burst step decides:
   - `hold_to_request_ms`: from the held job's verified hold (the provider's `hold` returned held) to the cloud
     launch call of its burst;
   - `decision_to_running_ms`: from the burst decision (the provider's `hold` called) to the end of the tick after
     which the broker's job is running in the cloud; `ticks` is how many ticks that took. A live broker adds
     (ticks - 1) x OVERSPILL_TICK_INTERVAL_SECONDS (10 s by default) of waiting between them.

It starts the throw-away real cluster of the test suite (tests/slurm_cluster.py: slurmctld, two slurmd, slurmdbd
with `AccountingStoreFlags=job_env`, slurmrestd on first use).

Run (from the repository root, as root, in the environment where the project is installed):
    python benchmarks/slurm_job_bench.py                     # 10 jobs, 2 KiB scripts, 3 reads; 3 bursts each way
    python benchmarks/slurm_job_bench.py --script-kib 90     # near the 96 KiB bound
    python benchmarks/slurm_job_bench.py --latency-rounds 0  # reading only
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.loop.tick import tick
from broker.slurm.job import cloud_job
from broker.store.tables import Job
from providers.slurm.script import read_job
from tests.slurm_cluster import SlurmCluster, start_slurm_cluster


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def burst_latency(cluster: SlurmCluster, transport: str, rounds: int, work: Path) -> dict[str, object]:
    """Hold -> cloud request and decision -> running in the cloud, over `rounds` bursts (module docstring)."""
    from decimal import Decimal

    from sqlmodel import Session, select

    from tests.scripted import ScriptedCloud
    from tests.test_e2e_slurm_burst import _opted_in, _runtime
    from tests.test_provider_slurm import fill_gpus, job

    holds, requests, running, ticks = [], [], [], []
    for rnd in range(rounds):
        cluster.cancel_all()
        cloud = ScriptedCloud("scripted", lambda: datetime.now(UTC))
        cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
        tmp = work / f"latency-{transport}-{rnd}"
        tmp.mkdir()
        rt = _runtime(cluster, tmp, cloud, transport=transport)
        provider: Any = rt.providers["onprem-slurm"]
        fill_gpus(cluster, minutes=60)
        slurm_id = _opted_in(cluster)
        deadline = time.monotonic() + 30
        while job(provider, slurm_id).state_reason not in ("Resources", "Priority"):
            if time.monotonic() > deadline:
                raise SystemExit(f"job {slurm_id} never pended")
            time.sleep(0.1)
        marks: dict[str, float] = {}
        hold, launch = provider.hold, cloud.launch

        def timed_hold(target: Any, reason: str, hold: Any = hold, marks: dict[str, float] = marks) -> Any:
            marks.setdefault("decided", time.perf_counter())
            outcome = hold(target, reason)
            if outcome.held:
                marks.setdefault("held", time.perf_counter())
            return outcome

        def timed_launch(request: Any, launch: Any = launch, marks: dict[str, float] = marks) -> Any:
            marks.setdefault("requested", time.perf_counter())
            return launch(request)

        provider.hold, cloud.launch = timed_hold, timed_launch
        for n in range(1, 6):
            tick(rt, datetime.now(UTC))
            with Session(rt.engine) as s:
                found = s.exec(select(Job).where(Job.origin == f"onprem-slurm:{slurm_id}")).first()
            if found is not None and found.state == "running":
                running.append((time.perf_counter() - marks["decided"]) * 1000)
                ticks.append(n)
                break
        else:
            raise SystemExit(f"{transport}: burst of job {slurm_id} not running after 5 ticks: {marks}")
        holds.append(marks["held"] - marks["decided"])
        requests.append((marks["requested"] - marks["held"]) * 1000)
        rt.engine.dispose()
    cluster.cancel_all()
    return {
        "transport": transport,
        "bursts": rounds,
        "hold_ms_median": round(statistics.median(holds) * 1000, 1),
        "hold_to_request_ms_median": round(statistics.median(requests), 1),
        "hold_to_request_ms_max": round(max(requests), 1),
        "decision_to_running_ms_median": round(statistics.median(running), 1),
        "decision_to_running_ms_max": round(max(running), 1),
        "ticks": sorted(set(ticks)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--script-kib", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-rounds", type=int, default=3)
    parser.add_argument("--transports", default="cli,rest")
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
        cluster.cancel_all()
        if args.latency_rounds > 0:
            out["latency"] = [
                burst_latency(cluster, t, args.latency_rounds, work) for t in args.transports.split(",") if t
            ]
    finally:
        cluster.stop()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            if k != "latency":
                print(f"{k:24} {v}")
        for row in out.get("latency", []):  # type: ignore[attr-defined]
            print("burst latency " + " ".join(f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
