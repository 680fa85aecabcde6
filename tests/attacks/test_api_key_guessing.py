"""Attack: guessing API keys at full speed. Each unverified key costs a scrypt hash (tens of ms of CPU), and the
guesses ran on the worker threads legitimate requests need: a flood pushed legitimate requests to 4.9 s.

Now, in each API process, at most `OVERSPILL_KEY_HASH_CONCURRENCY` hashes run at once, on their own threads; 32
more per slot may wait and the rest are refused at once (429); keys already verified never wait for a slot. And
each client address may have only a few unverified keys checked per second (`OVERSPILL_RATE_LIMIT_UNVERIFIED_*`),
one bucket across every process on the database. Shown on two real uvicorn processes on one PostgreSQL; the
latency figures are measured by `benchmarks/auth_bench.py`.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.api.auth import Role, create_key
from broker.config.settings import DEV_API_KEY, Settings
from broker.runtime import Runtime, build_runtime
from broker.store.db import utcnow
from tests.api_process import running_apis

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
UNVERIFIED_RATE, UNVERIFIED_BURST = 2.0, 10
GATE_FULL = "too many unverified API keys are being checked at once"


@dataclass
class Cluster:
    urls: list[str]
    rt: Runtime


@pytest.fixture(scope="module")
def cluster(postgres: Any) -> Iterator[Cluster]:
    url = postgres.create_database()
    workdir = Path(tempfile.mkdtemp(prefix="guessing-"))
    rt = build_runtime(Settings(database_url=url, data_dir=workdir, bootstrap_api_key=DEV_API_KEY, simulated=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        OVERSPILL_DATABASE_URL=url,
        OVERSPILL_DATA_DIR=str(workdir),
        OVERSPILL_BOOTSTRAP_API_KEY=DEV_API_KEY,
        OVERSPILL_SIMULATED="false",
        OVERSPILL_LOG_LEVEL="warning",
        OVERSPILL_KEY_HASH_CONCURRENCY="1",
        OVERSPILL_RATE_LIMIT_UNVERIFIED_PER_SECOND=str(UNVERIFIED_RATE),
        OVERSPILL_RATE_LIMIT_UNVERIFIED_BURST=str(UNVERIFIED_BURST),
        PYTHONPATH=str(ROOT),
    )
    with running_apis(env, 2) as urls:
        yield Cluster(urls=urls, rt=rt)
    rt.engine.dispose()
    shutil.rmtree(workdir, ignore_errors=True)


def _guess() -> dict[str, str]:
    return {"Authorization": f"Bearer ovs_{secrets.token_hex(4)}_{secrets.token_urlsafe(24)}"}


async def _flood(base: str, addresses: list[str], per_address: int) -> list[httpx.Response]:
    """`per_address` guesses at once from each address, all in flight together."""
    clients = [httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=a), timeout=120) for a in addresses]
    try:
        return list(
            await asyncio.gather(
                *(
                    c.post(f"{base}/v1/keys", json={"role": "admin"}, headers=_guess())
                    for c in clients
                    for _ in range(per_address)
                )
            )
        )
    finally:
        for c in clients:
            await c.aclose()


async def _legitimate(base: str, key: str, stop: asyncio.Event) -> list[tuple[int, float]]:
    out = []
    # a new connection per request: no keep-alive race (the server closing an idle connection as the next
    # request goes out) on a loaded machine
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        while not stop.is_set():
            started = time.perf_counter()
            r = await c.get(f"{base}/v1/whoami", headers={"Authorization": f"Bearer {key}"})
            out.append((r.status_code, time.perf_counter() - started))
            await asyncio.sleep(0.05)
    return out


def test_guess_flood_from_many_addresses_is_capped_and_verified_keys_go_on(cluster: Cluster) -> None:
    key = create_key(cluster.rt.engine, tenant="acme", role=Role.ADMIN, name="legit", now=utcnow())
    base = cluster.urls[0]
    assert httpx.get(f"{base}/v1/whoami", headers={"Authorization": f"Bearer {key}"}, timeout=60).status_code == 200

    async def attack() -> tuple[list[httpx.Response], list[tuple[int, float]]]:
        stop = asyncio.Event()
        legit = asyncio.create_task(_legitimate(base, key, stop))
        await asyncio.sleep(0.2)
        flood = await _flood(base, [f"127.0.1.{i}" for i in range(1, 41)], 5)
        stop.set()
        return flood, await legit

    flood, legit = asyncio.run(attack())
    statuses = [r.status_code for r in flood]
    gate_full = [r for r in flood if r.status_code == 429 and GATE_FULL in r.json()["message"]]
    print(
        f"\n{len(flood)} guesses in flight from 40 addresses: {statuses.count(401)} hashed (401), "
        f"{len(gate_full)} refused at the hashing gate; legitimate: {len(legit)} requests, "
        f"median {statistics.median(t for _, t in legit) * 1000:.0f} ms, max {max(t for _, t in legit) * 1000:.0f} ms"
    )
    assert set(statuses) <= {401, 429}, set(statuses)
    # one slot and 32 waiting: of 200 guesses in flight at once, most are refused without being hashed
    assert statuses.count(401) < len(flood) / 2, statuses.count(401)
    assert gate_full and all(r.headers["Retry-After"] == "1" for r in gate_full)
    assert legit and all(code == 200 for code, _ in legit), [c for c, _ in legit]


def test_guesses_from_one_address_are_held_to_its_unverified_key_rate_across_processes(cluster: Cluster) -> None:
    async def run() -> list[tuple[int, str]]:
        transports = [httpx.AsyncHTTPTransport(local_address="127.0.2.1") for _ in cluster.urls]
        clients = [httpx.AsyncClient(transport=t, timeout=120) for t in transports]
        gate = asyncio.Semaphore(4)

        async def one(i: int) -> tuple[int, str]:
            async with gate:
                r = await clients[i % 2].get(f"{cluster.urls[i % 2]}/v1/whoami", headers=_guess())
            return r.status_code, r.json()["message"]

        try:
            return list(await asyncio.gather(*(one(i) for i in range(6 * UNVERIFIED_BURST))))
        finally:
            for c in clients:
                await c.aclose()

    started = time.monotonic()
    answers = asyncio.run(run())
    elapsed = time.monotonic() - started
    hashed = sum(code == 401 for code, _ in answers)
    bound = UNVERIFIED_BURST + math.floor(UNVERIFIED_RATE * elapsed)
    assert UNVERIFIED_BURST <= hashed <= bound, f"{hashed} guesses hashed in {elapsed:.1f} s; the bucket allows {bound}"
    refused = [m for code, m in answers if code == 429]
    assert len(refused) == len(answers) - hashed
    assert all("unverified API keys from client address 127.0.2.1" in m for m in refused), refused[:3]
