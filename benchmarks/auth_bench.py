"""What a flood of guessed API keys does to legitimate requests: latency of a verified key's requests, alone and
while attackers send random keys at full speed from many client addresses.

One real API process (`uvicorn --factory broker.app:app_from_env`, settings from the environment as in production)
on a fresh SQLite file (or `--db postgresql`: a throw-away server), built from the source tree `--root` (default:
this checkout; give another tree, e.g. an export of main, to compare before and after). The legitimate client
sends `GET /v1/jobs?limit=1` (a route that runs on the worker threads) with the bootstrap admin key, verified
before the run, at `--legit-rate` requests/s; the attackers send `GET /v1/jobs` with a fresh random key each time,
`--per-address` at once from each of `--addresses` loopback addresses (127.0.3.x), as fast as they are answered.
Printed: legitimate p50/p99/max latency and errors, alone and under attack, and what the attackers got (401: the
key was hashed; 429: refused before hashing).

Run from the repository root with the project's Python:
    python benchmarks/auth_bench.py --duration 20
    python benchmarks/auth_bench.py --root /tmp/main-export --duration 20      # the code before the fix
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from tests.api_process import wait_healthy  # noqa: E402
from tests.moto_server import free_port  # noqa: E402

DEV_API_KEY = "ovs_devadmin_local-development-only"


def start_server(root: Path, database_url: str, data_dir: Path, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        PYTHONPATH=str(root),
        OVERSPILL_DATABASE_URL=database_url,
        OVERSPILL_DATA_DIR=str(data_dir),
        OVERSPILL_BOOTSTRAP_API_KEY=DEV_API_KEY,
        OVERSPILL_SIMULATED="false",
        OVERSPILL_LOG_LEVEL="warning",
    )
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "broker.app:app_from_env", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    return f"http://127.0.0.1:{port}", proc


async def legitimate(base: str, rate: float, seconds: float) -> list[tuple[int, float]]:
    """Requests at `rate`/s for `seconds` (each waits for the previous one): (status, latency s)."""
    out: list[tuple[int, float]] = []
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=60) as client:
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                r = await client.get(f"{base}/v1/jobs?limit=1", headers={"Authorization": f"Bearer {DEV_API_KEY}"})
                status = r.status_code
            except httpx.HTTPError:
                status = 0
            elapsed = time.perf_counter() - started
            out.append((status, elapsed))
            await asyncio.sleep(max(0.0, 1 / rate - elapsed))
    return out


async def attack(base: str, addresses: int, per_address: int, seconds: float) -> Counter[int]:
    statuses: Counter[int] = Counter()
    end = time.monotonic() + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            guess = f"ovs_{secrets.token_hex(4)}_{secrets.token_urlsafe(24)}"
            try:
                r = await client.get(f"{base}/v1/jobs", headers={"Authorization": f"Bearer {guess}"})
                statuses[r.status_code] += 1
            except httpx.HTTPError:
                statuses[0] += 1

    clients = [
        httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=f"127.0.3.{i + 1}"), timeout=60)
        for i in range(addresses)
    ]
    try:
        await asyncio.gather(*(worker(c) for c in clients for _ in range(per_address)))
    finally:
        for c in clients:
            await c.aclose()
    return statuses


def summary(samples: list[tuple[int, float]]) -> dict[str, Any]:
    times = sorted(t for _, t in samples)
    errors = sum(1 for s, _ in samples if s != 200)
    q = statistics.quantiles(times, n=100, method="inclusive") if len(times) >= 2 else times * 99
    return {
        "requests": len(samples),
        "errors": errors,
        "p50_ms": round(q[49] * 1000, 1),
        "p99_ms": round(q[98] * 1000, 1),
        "max_ms": round(times[-1] * 1000, 1),
    }


async def run(args: argparse.Namespace, base: str) -> dict[str, Any]:
    alone = await legitimate(base, args.legit_rate, args.duration / 3)
    under, statuses = await asyncio.gather(
        legitimate(base, args.legit_rate, args.duration),
        attack(base, args.addresses, args.per_address, args.duration),
    )
    return {
        "alone": summary(alone),
        "under_attack": summary(under),
        "attacker_statuses": dict(sorted(statuses.items())),
        "attacker_requests_per_s": round(sum(statuses.values()) / args.duration, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=HERE.parent, help="source tree to serve (default: this one)")
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds under attack")
    parser.add_argument("--addresses", type=int, default=32)
    parser.add_argument("--per-address", type=int, default=2)
    parser.add_argument("--legit-rate", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="auth-bench-"))
    pg = None
    if args.db == "postgresql":
        from tests.pg import start_postgres

        pg = start_postgres()
        database_url = pg.create_database()
    else:
        database_url = f"sqlite:///{work / 'bench.db'}"
    base, proc = start_server(args.root.resolve(), database_url, work, work / "server.log")
    try:
        wait_healthy(base, proc)
        warm = httpx.get(f"{base}/v1/jobs?limit=1", headers={"Authorization": f"Bearer {DEV_API_KEY}"}, timeout=60)
        assert warm.status_code == 200, warm.text
        result = {"root": str(args.root.resolve()), "db": args.db, **vars(args), **asyncio.run(run(args, base))}
        result["root"] = str(args.root.resolve())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if pg is not None:
            pg.stop()
    if args.json:
        print(json.dumps(result, default=str))
        return
    print(f"source: {result['root']}  db: {args.db}  attackers: {args.addresses} addresses x {args.per_address}")
    for phase in ("alone", "under_attack"):
        s = result[phase]
        print(
            f"  legitimate {phase:13s} {s['requests']:5d} requests, {s['errors']} errors, p50 {s['p50_ms']} ms, "
            f"p99 {s['p99_ms']} ms, max {s['max_ms']} ms"
        )
    print(f"  attackers: {result['attacker_requests_per_s']} requests/s, statuses {result['attacker_statuses']}")


if __name__ == "__main__":
    main()
