"""Slow webhooks: report runs aimed at a tarpit (accepts, never answers) must not hold the API's worker threads
(a real uvicorn with two worker processes, 100 runs at once, /healthz and an authenticated GET asked meanwhile),
and a receiver that trickles its answer a byte at a time must not hold the control loop past the delivery's total
deadline. The tarpit is tests/tarpit.py, on 127.0.0.1 (the operator's allow-list opens loopback for it, so what is
tested is the time, not the address check)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.store.tables import BudgetAlertRow, ReportRunRow
from tests.api_process import ROOT, start_api, wait_healthy
from tests.attacks.finance_parts import finance_client
from tests.conftest import MovableClock
from tests.finance_data import seed_ledger
from tests.tarpit import Tarpit

LOOPBACK = '["127.0.0.0/8"]'
RUNS = 100
AUTH = {"Authorization": f"Bearer {DEV_API_KEY}"}


@pytest.fixture
def pit() -> Iterator[Tarpit]:
    with Tarpit("silent") as tarpit:
        yield tarpit


@pytest.fixture
def api_processes(tmp_path: Path) -> Iterator[tuple[str, Runtime]]:
    """`uvicorn --workers 2` on a SQLite file, and an in-process runtime (the control loop) on the same file."""
    db = f"sqlite:///{tmp_path / 'broker.store.db'}"
    settings = Settings(
        database_url=db,
        data_dir=tmp_path,
        bootstrap_api_key=DEV_API_KEY,
        simulated=False,
        webhook_allowed_networks=["127.0.0.0/8"],
        delivery_deadline_seconds=1,
        delivery_step_seconds=2,
        rate_limit_per_second=0,
    )
    rt = build_runtime(settings)  # migrated and the admin key installed before the processes start
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        OVERSPILL_DATABASE_URL=db,
        OVERSPILL_DATA_DIR=str(tmp_path),
        OVERSPILL_BOOTSTRAP_API_KEY=DEV_API_KEY,
        OVERSPILL_SIMULATED="false",
        OVERSPILL_RATE_LIMIT_PER_SECOND="0",
        OVERSPILL_WEBHOOK_ALLOWED_NETWORKS=LOOPBACK,
        OVERSPILL_LOG_LEVEL="warning",
        PYTHONPATH=str(ROOT),
    )
    url, proc = start_api(env, log=tmp_path / "api.log", workers=2)
    try:
        wait_healthy(url, proc)
        yield url, rt
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        rt.engine.dispose()


def _post_run(url: str, hook: str) -> int:
    body = {"period": "2026-10", "format": "csv", "destination": {"type": "webhook", "url": hook}}
    try:
        return httpx.post(f"{url}/v1/report-runs", json=body, headers=AUTH, timeout=30).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.integration
def test_100_report_runs_to_a_tarpit_leave_the_api_answering(api_processes: tuple[str, Runtime], pit: Tarpit) -> None:
    url, rt = api_processes
    pool = ThreadPoolExecutor(max_workers=RUNS)
    try:
        posts: list[Future[int]] = [pool.submit(_post_run, url, pit.url + f"/hook/{i}") for i in range(RUNS)]
        time.sleep(1.0)  # the runs are in the API now
        for _ in range(5):  # the API keeps answering while they are
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
            assert httpx.get(f"{url}/v1/whoami", headers=AUTH, timeout=5).status_code == 200
            time.sleep(0.3)
        statuses = [p.result(timeout=60) for p in posts]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    assert pit.connections == 0  # no request waited on the third party: nothing was sent from the API
    assert statuses == [202] * RUNS

    done = threading.Event()
    loop = threading.Thread(target=lambda: (tick(rt, rt.clock()), done.set()), daemon=True)
    loop.start()  # the control loop delivers: each try is cut at the 1 s deadline, the step at 2 s
    loop.join(timeout=60)
    assert done.is_set(), "the control loop is held by the tarpit"
    assert 0 < pit.connections < RUNS  # a bounded number tried this tick; the rest wait for the next
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    with Session(rt.engine) as s:
        runs = s.exec(select(ReportRunRow)).all()
    tried = [r for r in runs if r.delivery_attempts]
    assert len(tried) == pit.connections and all(r.delivery_state == "pending" for r in runs)
    assert all("no answer within the 1 s deadline" in r.error for r in tried), tried[0].error


def test_a_trickling_webhook_cannot_hold_the_control_loop(
    tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(
        f"sqlite:///{tmp_path / 'trickle.db'}",
        simulated=False,
        webhook_allowed_networks=["127.0.0.0/8"],
        delivery_deadline_seconds=1,
    )
    with Tarpit("trickle", interval=0.1) as trickle:
        api = finance_client(rt, clock())
        made = api.post(
            "/v1/report-schedules",
            json={"name": "every minute", "cron": "* * * * *", "format": "csv", "period": "previous_day",
                  "destination": {"type": "webhook", "url": trickle.url + "/reports"}},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        seed_ledger(rt.engine, "demo", clock().replace(day=1, hour=0), days=1, entries=20)
        budget = api.post(
            "/v1/budgets",
            json={"scope": "team", "name": "nlp", "amount_usd": "0.01", "thresholds": [100],
                  "webhook_url": trickle.url + "/alerts"},
        )  # fmt: skip
        assert budget.status_code == 201, budget.text
        report: dict[str, Any] = {}
        loop = threading.Thread(target=lambda: report.update(r=tick(rt, clock() + timedelta(minutes=2))), daemon=True)
        loop.start()
        loop.join(timeout=60)
        assert not loop.is_alive(), "a receiver trickling its answer holds the control loop"
        assert trickle.connections == 2  # the alert and the report were both tried
    with Session(rt.engine) as s:
        [alert] = s.exec(select(BudgetAlertRow)).all()
        [run] = s.exec(select(ReportRunRow)).all()
    assert "deadline" in alert.last_error and alert.delivered_at is None
    assert "deadline" in run.error and run.delivery_state == "pending"  # tried again by the next tick
    assert report["r"].ok, report["r"]
