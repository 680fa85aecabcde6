"""One bucket per key across processes: two real `uvicorn --factory broker.app:app_from_env` processes on one
PostgreSQL, with the default rate-limit store (`auto`, which is the shared one on PostgreSQL).

Each test sends a burst spread evenly over both processes and counts the admitted requests. The bound is exact
for one bucket: at most `BURST + RATE x elapsed`, elapsed from before the first request is sent to after the last
answer is read (every take happens inside that window and the refill is timed by the one database clock). Two
per-process buckets would admit about `2 x BURST`, far above it, and both processes must have admitted and
refused some requests (the burst really was spread).
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import subprocess
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
from tests.api_process import start_api, wait_healthy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
RATE, BURST = 0.5, 20


@dataclass
class Answer:
    server: int
    status: int
    retry_after: str | None
    message: str


@dataclass
class Cluster:
    urls: list[str]
    rt: Runtime


@pytest.fixture(scope="module")
def cluster(postgres: Any) -> Iterator[Cluster]:
    url = postgres.create_database()
    workdir = Path(tempfile.mkdtemp(prefix="ratelimit-procs-"))
    settings = Settings(database_url=url, data_dir=workdir, bootstrap_api_key=DEV_API_KEY, simulated=False)
    rt = build_runtime(settings)  # migrated and the admin key installed before the processes start
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        OVERSPILL_DATABASE_URL=url,
        OVERSPILL_DATA_DIR=str(workdir),
        OVERSPILL_BOOTSTRAP_API_KEY=DEV_API_KEY,
        OVERSPILL_SIMULATED="false",
        OVERSPILL_RATE_LIMIT_PER_SECOND=str(RATE),
        OVERSPILL_RATE_LIMIT_BURST=str(BURST),
        OVERSPILL_RATE_LIMIT_UNVERIFIED_PER_SECOND=str(RATE),  # guessed keys: the same limit, on their own bucket
        OVERSPILL_RATE_LIMIT_UNVERIFIED_BURST=str(BURST),
        OVERSPILL_LOG_LEVEL="warning",
        PYTHONPATH=str(ROOT),
    )
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for _ in range(2):
            url, proc = start_api(env)
            urls.append(url)
            procs.append(proc)
        for base, proc in zip(urls, procs, strict=True):
            wait_healthy(base, proc)
        yield Cluster(urls=urls, rt=rt)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        rt.engine.dispose()
        shutil.rmtree(workdir, ignore_errors=True)


async def _burst(
    urls: list[str], n: int, headers_for: Any, *, source: str = "127.0.0.1", concurrency: int = 8
) -> list[Answer]:
    """`n` GET /v1/whoami, request i to server i % 2, `concurrency` in flight per server, from `source`."""
    clients = [httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=source), timeout=60) for _ in urls]
    gates = [asyncio.Semaphore(concurrency) for _ in urls]

    async def one(i: int) -> Answer:
        server = i % len(urls)
        async with gates[server]:
            r = await clients[server].get(f"{urls[server]}/v1/whoami", headers=headers_for(i))
        return Answer(server, r.status_code, r.headers.get("Retry-After"), r.json().get("message", ""))

    try:
        return list(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        for c in clients:
            await c.aclose()


def test_one_key_gets_one_bucket_across_two_processes(cluster: Cluster) -> None:
    key = create_key(cluster.rt.engine, tenant="acme", role=Role.ADMIN, name="burst", now=utcnow())
    auth = {"Authorization": f"Bearer {key}"}
    started = time.monotonic()
    # one request per process first, so each has verified the key (the slow hash) before the burst and the
    # burst draws on the key's bucket only, not also on the client address's
    warmup = [httpx.get(f"{u}/v1/whoami", headers=auth, timeout=60).status_code for u in cluster.urls]
    answers = asyncio.run(_burst(cluster.urls, 4 * BURST, lambda _: auth))
    elapsed = time.monotonic() - started
    assert warmup == [200, 200]
    admitted = 2 + sum(a.status == 200 for a in answers)
    bound = BURST + math.floor(RATE * elapsed)
    assert BURST <= admitted <= bound, f"{admitted} admitted in {elapsed:.1f} s; one bucket allows {bound}"
    refused = [a for a in answers if a.status == 429]
    assert len(refused) + admitted - 2 == len(answers), {a.status for a in answers}
    for server in (0, 1):
        mine = [a.status for a in answers if a.server == server]
        assert 200 in mine and 429 in mine, f"process {server} answered {mine}: the burst was not spread"
    # the bucket is empty, so the wait is at most one token's time (2 s at 0.5/s), rounded up to whole seconds
    assert {a.retry_after for a in refused} <= {"1", "2"}, {a.retry_after for a in refused}
    assert all("this API key" in a.message for a in refused)


def test_guessed_keys_share_one_address_bucket_across_two_processes(cluster: Cluster) -> None:
    """Unverified keys draw on the client address's bucket, which is shared too (its own source address here,
    so no other test has touched it)."""
    started = time.monotonic()
    answers = asyncio.run(
        _burst(
            cluster.urls,
            3 * BURST,
            lambda i: {"Authorization": f"Bearer ovs_guess_{i:032d}"},
            source="127.0.0.2",
            concurrency=4,
        )
    )
    elapsed = time.monotonic() - started
    unauthorised = sum(a.status == 401 for a in answers)
    bound = BURST + math.floor(RATE * elapsed)
    assert BURST <= unauthorised <= bound, f"{unauthorised} guesses checked in {elapsed:.1f} s; one bucket: {bound}"
    refused = [a for a in answers if a.status == 429]
    assert len(refused) == len(answers) - unauthorised
    assert {a.server for a in refused} == {0, 1}
    assert all("client address 127.0.0.2" in a.message for a in refused)
    # health checks stay open from that drained address, on both processes
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=transport, timeout=30) as client:
        for base in cluster.urls:
            assert [client.get(f"{base}/healthz").status_code for _ in range(5)] == [200] * 5
            assert 429 not in [client.get(f"{base}/readyz").status_code for _ in range(5)]
