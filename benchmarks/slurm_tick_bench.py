"""Slurm reads per tick: slurmctld calls and bytes one broker tick costs with a big queue and many placements.

The real test cluster cannot hold 10,000 queued jobs quickly, so the Slurm side is synthesised: a runner (the
CLI transport's injection point, `SlurmProvider.run`) answers `squeue --json` / `sinfo --json` / `sacct --json`
with documents in the 22.05 (v0.0.38) shapes the real cluster prints, and `sbatch` by adding the job to its
queue, counting every command and the bytes of its output. Everything above the runner is the real broker:
settings, runtime, API submissions, placement, and `tick()` with every step.

1. `--placements` jobs (default 200) are submitted through the API and placed on Slurm (`sbatch`), and run.
2. `--queued` other users' pending GPU jobs (default 10,000; Resources/Priority, 1-8 GPUs) and running jobs
   filling the `--nodes` nodes (8 A100 each) are added.
3. `--ticks` steady ticks (nothing to place) are measured twice: with the tick's snapshot (`begin_tick`, what runs)
   and with it disabled (every step reading for itself; per-placement `get` as before `get_many` is not
   reproduced: that was one squeue per placement on top).
Target: one squeue and one sinfo per steady tick.

Run (from the repository root):
    python benchmarks/slurm_tick_bench.py
    python benchmarks/slurm_tick_bench.py --queued 2000 --placements 50 --ticks 2 --json
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi.testclient import TestClient

from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime
from tests.builders import job_body

PARTITION = "gpu"
GPUS_PER_NODE = 8


class FakeSlurm:
    """A Slurm 22.05 controller as its CLI prints it: jobs and nodes in memory, every command counted."""

    def __init__(self, nodes: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.t0 = int(time.time()) - 3600
        self.jobs: list[dict[str, Any]] = []
        self.next_id = 1
        self.nodes = [f"n{i:04d}" for i in range(nodes)]
        self.used = dict.fromkeys(self.nodes, 0)
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def job(self, *, state: str, gpus: int, user: str, comment: str = "", reason: str = "None") -> dict[str, Any]:
        jid = self.next_id
        self.next_id += 1
        node = ""
        if state == "RUNNING":
            node = next((n for n in self.nodes if self.used[n] + gpus <= GPUS_PER_NODE), self.nodes[0])
            self.used[node] += gpus
        record = {
            "job_id": jid,
            "name": "ovs-x" if comment else f"train-{jid}",
            "job_state": state,
            "state_reason": reason,
            "partition": PARTITION,
            "user_name": user,
            "account": "acme",
            "qos": "normal",
            "tres_per_node": f"gres:gpu:a100:{gpus}",
            "node_count": 1,
            "submit_time": self.t0 + jid,
            "start_time": self.t0 + 60 if state == "RUNNING" else 0,
            "end_time": self.t0 + 60 + 86400 if state == "RUNNING" else 0,
            "time_limit": 1440,
            "priority": 1000 + self.rng.randint(0, 1000),
            "nodes": node,
            "comment": comment,
            "array_job_id": 0,
            "array_task_id": None,
            "dependency": "",
            "restart_cnt": 0,
            "exit_code": 0,
        }
        self.jobs.append(record)
        return record

    def fill(self, queued: int) -> None:
        for n in self.nodes:  # the rest of every node runs someone's job
            free = GPUS_PER_NODE - self.used[n]
            if free > 0:
                self.job(state="RUNNING", gpus=free, user="alice")
        for _ in range(queued):
            gpus = self.rng.choice((1, 1, 2, 4, 8))
            reason = self.rng.choice(("Resources", "Priority", "Priority", "Dependency"))
            self.job(state="PENDING", gpus=gpus, user=self.rng.choice(("alice", "bob", "carol")), reason=reason)

    def _sinfo(self) -> str:
        nodes = [
            {
                "name": n,
                "state": "mixed" if self.used[n] < GPUS_PER_NODE else "allocated",
                "state_flags": [],
                "partitions": [PARTITION],
                "gres": f"gpu:a100:{GPUS_PER_NODE}",
                "gres_used": f"gpu:a100:{self.used[n]}(IDX:0-{max(self.used[n] - 1, 0)})",
                "cpus": 64,
                "real_memory": 512000,
            }
            for n in self.nodes
        ]
        return json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "nodes": nodes})

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        command = next((a for a in argv if a in ("squeue", "sinfo", "sacct", "sbatch", "scancel", "scontrol")), argv[0])
        self.calls[command] += 1
        out = ""
        if command == "squeue":
            out = json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "jobs": self.jobs})
        elif command == "sinfo":
            out = self._sinfo()
        elif command == "sacct":
            out = json.dumps({"errors": [], "jobs": []})
        elif command == "sbatch":
            comment = next(a.split("=", 1)[1] for a in argv if a.startswith("--comment="))
            gres = next(a.split("=", 1)[1] for a in argv if a.startswith("--gres="))
            placed = self.job(state="RUNNING", gpus=int(gres.rsplit(":", 1)[1]), user="tenant-demo", comment=comment)
            out = f"{placed['job_id']}\n"
        self.bytes[command] += len(out)
        return subprocess.CompletedProcess(argv, 0, out, "")

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()


def measure(rt: Any, slurm: FakeSlurm, now: datetime, ticks: int) -> dict[str, Any]:
    per_tick: list[dict[str, Any]] = []
    for i in range(ticks):
        slurm.reset()
        started = time.perf_counter()
        report = tick(rt, now + timedelta(seconds=10 * (i + 1)))
        seconds = time.perf_counter() - started
        per_tick.append(
            {
                "calls": dict(slurm.calls),
                "total_calls": sum(slurm.calls.values()),
                "mbytes": round(sum(slurm.bytes.values()) / 1e6, 2),
                "seconds": round(seconds, 2),
                "errors": [s.name for s in report.steps if s.error],
            }
        )
    return {"ticks": per_tick}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--placements", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'bench.db'}",
            data_dir=Path(tmp),
            simulated=False,
            slurm_partitions={
                PARTITION: {"accelerator": "A100", "rate_usd_per_gpu_hour": "1.10", "gpus_per_node": "8"}
            },
            slurm_submit_as={"demo": "tenant-demo"},
            rate_limit_per_second=0,  # the submissions are set-up, not what is measured
        )
        rt = build_runtime(settings)
        slurm = FakeSlurm(args.nodes)
        provider = rt.providers["onprem-slurm"]
        provider.run = slurm  # type: ignore[attr-defined]
        api = TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
        now = datetime.now(UTC)
        for _ in range(args.placements):
            body = job_body(command=["sleep", "1"], runtime_hours="20", max_total_usd="1000")
            del body["work_gpu_hours"]
            api.post("/v1/jobs", json=body).raise_for_status()
        tick(rt, now)  # places every job (sbatch each)
        placed = sum(1 for j in slurm.jobs if j["comment"].startswith("overspill:"))
        tick(rt, now + timedelta(seconds=5))  # sees them start
        slurm.fill(args.queued)
        squeue_mb = len(slurm(["squeue", "--json"]).stdout) / 1e6

        cached = measure(rt, slurm, now + timedelta(minutes=1), args.ticks)
        provider.begin_tick = lambda _now: None  # type: ignore[attr-defined]  # no tick snapshot: each step reads
        uncached = measure(rt, slurm, now + timedelta(minutes=2), args.ticks)

    result = {
        "queued_jobs": args.queued,
        "placements": placed,
        "nodes": args.nodes,
        "squeue_json_mbytes": round(squeue_mb, 2),
        "with_tick_snapshot": cached,
        "without_tick_snapshot": uncached,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"Slurm side synthesised (22.05 JSON shapes): {args.queued} other jobs queued, {placed} broker placements")
    print(f"running, {args.nodes} nodes x {GPUS_PER_NODE} A100; one squeue --json is {squeue_mb:.1f} MB")
    for label, data in (("with the tick snapshot", cached), ("without it", uncached)):
        print(f"\nsteady ticks {label}:")
        for i, t in enumerate(data["ticks"], 1):
            calls = ", ".join(f"{k} {v}" for k, v in sorted(t["calls"].items()))
            print(f"  tick {i}: {t['total_calls']} slurm calls ({calls}), {t['mbytes']} MB read, {t['seconds']} s")


if __name__ == "__main__":
    main()
