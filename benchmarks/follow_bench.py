"""What 1,000 idle log followers do to everyone else: `/healthz` and submission latency with no follower, then
while `--followers` clients each hold `GET /v1/jobs/{id}/logs?follow=true` open on a log that does not grow.

One real API process (`uvicorn --factory broker.app:app_from_env`, as `overspill serve` runs the app, settings from
the environment) on loopback, on a fresh SQLite file (or `--db postgresql`: a throw-away server), built from the
source tree `--root` (default: this checkout; give an export of the old code to compare). `--jobs` jobs each get a
running attempt whose agent log (one small chunk) lies in a file checkpoint store; the followers are spread over
them, one raw connection each, all from one tenant (the per-tenant follow cap is raised to `--followers` for the run
and the per-key rate limit turned off: this measures what held streams cost, not the limits). The probe sends
`GET /healthz` and `POST /v1/jobs` in turn at `--rate` pairs/s for `--duration` seconds, first idle, then with every
follower admitted (200 and headers received) and idle.

Printed (and with --json, keys `idle` and `held`, each {healthz, submit} with requests, errors, p50_ms, p99_ms,
max_ms; `server_cpu_per_s` {idle, held}: the API process's CPU seconds per second in each phase (the probe's own
included), steadier than latency on a shared machine; `followers_admitted`, `followers_refused`, `admit_seconds`,
`released`): the probes' latency in each phase, how many followers were admitted, and whether the server freed every
slot once they disconnected (a further `--followers` followers admitted again).

Run from the repository root with the project's Python:
    python benchmarks/follow_bench.py                       # 1,000 followers, 20 s per phase
    python benchmarks/follow_bench.py --db postgresql --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from tests.api_process import wait_healthy  # noqa: E402
from tests.moto_server import free_port  # noqa: E402

DEV_API_KEY = "ovs_devadmin_local-development-only"
AUTH = {"Authorization": f"Bearer {DEV_API_KEY}"}
PLACE = "aws/us-east-1"
JOB = {
    "name": "follow-bench",
    "team": "vision",
    "project": "atlas",
    "image": "ghcr.io/acme/train:1.0",
    "command": ["python", "train.py"],
    "accelerators": ["A100"],
    "gpu_count": 1,
    "work_gpu_hours": "2",
    "max_total_usd": "50",
}


def start_server(
    root: Path, database_url: str, data_dir: Path, store: str, followers: int, log: Path
) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        PYTHONPATH=str(root),
        OVERSPILL_DATABASE_URL=database_url,
        OVERSPILL_DATA_DIR=str(data_dir),
        OVERSPILL_BOOTSTRAP_API_KEY=DEV_API_KEY,
        OVERSPILL_SIMULATED="false",
        OVERSPILL_LOG_LEVEL="warning",
        OVERSPILL_RATE_LIMIT_PER_SECOND="0",
        OVERSPILL_CHECKPOINT_STORES=json.dumps({PLACE: store}),
        OVERSPILL_LOG_FOLLOW_MAX_PER_TENANT=str(followers),
        OVERSPILL_LOG_FOLLOW_MAX_PER_PROCESS=str(max(followers, 1000)),
    )
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "broker.app:app_from_env", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    return f"http://127.0.0.1:{port}", proc


def running_attempts(database_url: str, store: str, job_ids: list[str]) -> None:
    """A running placement per job, its agent log one chunk in the file store (written as the agent would)."""
    from sqlmodel import Session, create_engine

    from agent import protocol as proto
    from broker.store.tables import Placement

    engine = create_engine(database_url)
    with Session(engine) as s:
        for job_id in job_ids:
            pid = "plc_" + uuid.uuid4().hex[:12]
            uri = f"{store}tenants/demo/jobs/{job_id}/attempts/{pid}/"
            logs = Path(uri.removeprefix("file://")) / "logs"
            logs.mkdir(parents=True)
            (logs / proto.log_chunk_name(0)).write_bytes(b"epoch 1 loss 0.9\n")
            s.add(
                Placement(
                    id=pid,
                    job_id=job_id,
                    tenant="demo",
                    offering_key=f"{PLACE}/us-east-1a/p4d.24xlarge/spot",
                    provider="aws",
                    region="us-east-1",
                    zone="us-east-1a",
                    instance_type="p4d.24xlarge",
                    capacity_type="spot",
                    accelerator="A100",
                    accelerator_count=1,
                    hourly_usd=Decimal("1"),
                    on_demand_hourly_usd=Decimal("3"),
                    expected_cost_usd=Decimal("2"),
                    launch_token=pid,
                    state="running",
                    created_at=datetime.now(UTC),
                    attempt_uri=uri,
                )
            )
        s.commit()
    engine.dispose()


async def probe(base: str, rate: float, seconds: float) -> dict[str, list[tuple[int, float]]]:
    """`GET /healthz` then `POST /v1/jobs`, `rate` pairs per second for `seconds`: (status, latency s) of each."""
    out: dict[str, list[tuple[int, float]]] = {"healthz": [], "submit": []}
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < end:
            began = time.perf_counter()
            for name, call in (
                ("healthz", lambda: client.get(f"{base}/healthz")),
                ("submit", lambda: client.post(f"{base}/v1/jobs", json=JOB, headers=AUTH)),
            ):
                started = time.perf_counter()
                try:
                    status = (await call()).status_code
                except httpx.HTTPError:
                    status = 0
                out[name].append((status, time.perf_counter() - started))
            await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - began)))
    return out


class Follower:
    """One raw connection following a log: it reads the answer's head, then sits idle."""

    def __init__(self) -> None:
        self.writer: asyncio.StreamWriter | None = None
        self.status = 0

    async def open(self, base: str, job_id: str, timeout: float) -> int:
        host, port = base.removeprefix("http://").split(":")
        try:
            reader, self.writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
            self.writer.write(
                f"GET /v1/jobs/{job_id}/logs?follow=true HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {DEV_API_KEY}\r\n\r\n".encode()
            )
            line = await asyncio.wait_for(reader.readline(), timeout)
            self.status = int(line.split()[1]) if len(line.split()) > 1 else 0
        except (TimeoutError, OSError, ValueError):
            self.status = 0
        return self.status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def hold(base: str, job_ids: list[str], n: int, timeout: float) -> tuple[list[Follower], float]:
    followers = [Follower() for _ in range(n)]
    started = time.perf_counter()
    opening = asyncio.Semaphore(100)  # connect at most 100 at a time (the listen backlog)

    async def one(i: int, f: Follower) -> None:
        async with opening:
            await f.open(base, job_ids[i % len(job_ids)], timeout)

    await asyncio.gather(*(one(i, f) for i, f in enumerate(followers)))
    return followers, time.perf_counter() - started


def summary(samples: list[tuple[int, float]], ok: tuple[int, ...]) -> dict[str, Any]:
    times = sorted(t for _, t in samples) or [0.0]
    q = statistics.quantiles(times, n=100, method="inclusive") if len(times) >= 2 else times * 99
    return {
        "requests": len(samples),
        "errors": sum(1 for s, _ in samples if s not in ok),
        "p50_ms": round(q[49] * 1000, 1),
        "p99_ms": round(q[98] * 1000, 1),
        "max_ms": round(times[-1] * 1000, 1),
    }


def phase(samples: dict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    return {"healthz": summary(samples["healthz"], (200,)), "submit": summary(samples["submit"], (201, 202))}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measured(base: str, pid: int, args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    """The probe's samples, and the server's CPU use meanwhile (CPU seconds per second)."""
    cpu, began = cpu_seconds(pid), time.monotonic()
    samples = await probe(base, args.rate, args.duration)
    return phase(samples), round((cpu_seconds(pid) - cpu) / (time.monotonic() - began), 3)


async def run(args: argparse.Namespace, base: str, pid: int, job_ids: list[str]) -> dict[str, Any]:
    idle, idle_cpu = await measured(base, pid, args)
    followers, admit_seconds = await hold(base, job_ids, args.followers, args.open_timeout)
    statuses = Counter(f.status for f in followers)
    held, held_cpu = await measured(base, pid, args)
    for f in followers:
        f.close()
    await asyncio.sleep(2)  # the server notices the disconnects
    again, _ = await hold(base, job_ids, args.followers, args.open_timeout)
    released = all(f.status == 200 for f in again)
    for f in again:
        f.close()
    return {
        "idle": idle,
        "held": held,
        "server_cpu_per_s": {"idle": idle_cpu, "held": held_cpu},
        "followers_admitted": statuses.get(200, 0),
        "followers_refused": sum(v for k, v in statuses.items() if k != 200),
        "follower_statuses": dict(sorted(statuses.items())),
        "admit_seconds": round(admit_seconds, 2),
        "released": released,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=HERE.parent, help="source tree to serve (default: this one)")
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--followers", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10, help="jobs the followers are spread over")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of probing per phase")
    parser.add_argument("--rate", type=float, default=5.0, help="healthz + submission pairs per second")
    parser.add_argument("--open-timeout", type=float, default=30.0, help="seconds a follower waits for its answer")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="follow-bench-"))
    (work / "data").mkdir()
    (work / "store").mkdir()
    store = f"file://{work / 'store'}/"
    pg = None
    if args.db == "postgresql":
        from tests.pg import start_postgres

        pg = start_postgres()
        database_url = pg.create_database()
    else:
        database_url = f"sqlite:///{work / 'data' / 'bench.db'}"
    base, proc = start_server(
        args.root.resolve(), database_url, work / "data", store, args.followers, work / "server.log"
    )
    try:
        wait_healthy(base, proc)
        job_ids = []
        for _ in range(args.jobs):
            r = httpx.post(f"{base}/v1/jobs", json=JOB, headers=AUTH, timeout=60)
            assert r.status_code in (201, 202), r.text
            job_ids.append(r.json()["id"])
        running_attempts(database_url, store, job_ids)
        result: dict[str, Any] = {**vars(args), **asyncio.run(run(args, base, proc.pid, job_ids))}
        result["root"] = str(args.root.resolve())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if pg is not None:
            pg.stop()
    if args.json:
        print(json.dumps(result, default=str))
        return
    print(
        f"source: {result['root']}  db: {args.db}  followers: {args.followers} over {args.jobs} jobs  "
        f"probe: {args.rate:g} healthz+submit pairs/s for {args.duration:g} s per phase"
    )
    print(
        f"  followers admitted {result['followers_admitted']} (statuses {result['follower_statuses']}) in "
        f"{result['admit_seconds']} s; every slot free again after they left: {result['released']}"
    )
    cpu = result["server_cpu_per_s"]
    print(f"  server CPU seconds per second: idle {cpu['idle']}, with the followers held {cpu['held']}")
    for name in ("idle", "held"):
        for what in ("healthz", "submit"):
            s = result[name][what]
            print(
                f"  {name:5s} {what:8s} {s['requests']:5d} requests, {s['errors']} errors, p50 {s['p50_ms']} ms, "
                f"p99 {s['p99_ms']} ms, max {s['max_ms']} ms"
            )


if __name__ == "__main__":
    main()
