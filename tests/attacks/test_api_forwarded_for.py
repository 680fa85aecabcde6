"""Attack: posing as other client addresses with `X-Forwarded-For`. `overspill serve` ran uvicorn with its default
proxy settings, which trust `X-Forwarded-For` from 127.0.0.1: any process on the broker's host (or a proxy there
passing the header through) chose the address the rate limiter buckets by and the audit log records, and could
guess keys from a fresh "address" every request. Now `serve` trusts the header only from the proxies in
`OVERSPILL_FORWARDED_ALLOW_IPS` (none by default). Against real `overspill serve` processes, one and two workers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from broker.config.settings import Settings
from broker.store.db import make_engine
from tests.api_process import wait_healthy
from tests.moto_server import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def serve(workers: int, **settings: str) -> Iterator[tuple[str, str]]:
    """`overspill serve --no-loop` on a fresh SQLite file: (base URL, database URL)."""
    work = Path(tempfile.mkdtemp(prefix="serve-xff-"))
    database_url = f"sqlite:///{work / 'broker.store.db'}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        PYTHONPATH=str(ROOT),
        OVERSPILL_DATABASE_URL=database_url,
        OVERSPILL_DATA_DIR=str(work),
        OVERSPILL_SIMULATED="false",
        OVERSPILL_LOG_LEVEL="warning",
        OVERSPILL_RATE_LIMIT_UNVERIFIED_PER_SECOND="0.01",
        OVERSPILL_RATE_LIMIT_UNVERIFIED_BURST="2",
        **{f"OVERSPILL_{k.upper()}": v for k, v in settings.items()},
    )
    cmd = [sys.executable, "-c", "from broker.cli.main import main; main()", "serve", "--no-loop"]
    cmd += ["--port", str(port), "--workers", str(workers)]
    with open(work / "serve.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        yield base, database_url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(f"{work}-checkpoints", ignore_errors=True)  # the default checkpoint store beside it


def _guesses(base: str, n: int) -> list[httpx.Response]:
    """`n` wrong keys from 127.0.0.1, each claiming another forwarded address."""
    return [
        httpx.post(
            f"{base}/v1/jobs",
            json={},
            headers={"Authorization": f"Bearer ovs_guess_{i:032d}", "X-Forwarded-For": f"203.0.113.{i + 1}"},
            timeout=60,
        )
        for i in range(n)
    ]


def _refused_clients(database_url: str) -> set[str]:
    from sqlmodel import Session, select

    from broker.store.tables import AuditRefused

    engine = make_engine(Settings(database_url=database_url))
    with Session(engine) as s:
        clients = {r.client for r in s.exec(select(AuditRefused)).all()}
    engine.dispose()
    return clients


@pytest.mark.parametrize("workers", [1, 2])
def test_forwarded_for_from_an_untrusted_peer_changes_no_address(workers: int) -> None:
    with serve(workers) as (base, database_url):
        answers = _guesses(base, 4)
        codes = [r.status_code for r in answers]
        assert codes == [401, 401, 429, 429], codes  # one address's unverified-key bucket (2), whatever it claims
        assert "client address 127.0.0.1" in answers[-1].json()["message"]
        assert _refused_clients(database_url) == {"127.0.0.1"}


def test_forwarded_for_from_a_configured_proxy_is_used() -> None:
    with serve(1, forwarded_allow_ips="127.0.0.1") as (base, database_url):
        codes = [r.status_code for r in _guesses(base, 4)]
        assert codes == [401, 401, 401, 401], codes  # four forwarded clients, each with its own bucket
        assert _refused_clients(database_url) == {f"203.0.113.{i}" for i in range(1, 5)}
