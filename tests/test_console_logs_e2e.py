"""The console's job page shows the tail of the job's log, in headless Chromium against a real broker process.

The broker (tests/console_server.py, simulated market) has a local checkpoint store. Once the job is placed, its
attempt's log is stored the way the instance agent stores it (offset-named chunks under the attempt's prefix in
the job's store, `agent.protocol`): the page reads it through `GET /v1/jobs/{id}/logs?tail=4096` and shows the last
lines, in order, as text (a line of markup stays text). Screenshot: `job-log-tail.png` beside the other console
screenshots.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from agent.protocol import LOGS_DIR, log_chunk_name
from broker.agent_side.checkpoint_layout import attempt_prefix
from broker.config.settings import DEV_API_KEY, Settings
from broker.store.db import make_engine
from broker.store.tables import Placement
from tests.builders import job_body
from tests.console_server import running
from tests.test_console_e2e import SPEED, Broker, Page, browser, expect

pytestmark = pytest.mark.integration
__all__ = ["browser"]  # the Chromium fixture, shared with the other console tests


@pytest.fixture(scope="module")
def log_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, Path]]:
    tmp = tmp_path_factory.mktemp("console-logs")
    stores = tmp_path_factory.mktemp("console-stores")  # apart from the data dir, as the broker requires
    database = f"sqlite:///{tmp / 'broker.store.db'}"
    env = {
        "OVERSPILL_DATABASE_URL": database,
        "OVERSPILL_TICK_INTERVAL_SECONDS": "300",
        "OVERSPILL_BOOTSTRAP_API_KEY": DEV_API_KEY,
        "OVERSPILL_CHECKPOINT_STORES": json.dumps({"aws/us-east-1": f"file://{stores}/"}),
    }
    pause = tmp / "pause"
    pause.touch()
    log = tmp / "broker.log"
    with running(tmp, env, ["--speed", str(SPEED), "--pause-file", str(pause)], log) as url:
        yield Broker(url, Settings(database_url=database, data_dir=tmp), pause, log), stores


def _store_log(broker: Broker, stores: Path, job_id: str, placement_id: str, text: str) -> None:
    """What the instance agent does: the attempt's log as offset-named chunks under its prefix in the store, and
    the attempt's location on the placement (as the broker records it when it launches an agent instance)."""
    prefix = attempt_prefix(f"file://{stores}/", "demo", job_id, placement_id)
    engine = make_engine(broker.settings)
    try:
        with Session(engine) as session:
            p = session.get(Placement, placement_id)
            assert p is not None
            p.attempt_uri = prefix
            session.add(p)
            session.commit()
    finally:
        engine.dispose()
    logs = Path(prefix.removeprefix("file://")) / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    for start in range(0, len(data), 40):  # several chunks: the page must show them joined, in order
        (logs / log_chunk_name(start)).write_bytes(data[start : start + 40])


def test_the_job_page_shows_the_tail_of_the_jobs_log(browser: Any, log_broker: tuple[Broker, Path]) -> None:
    broker, stores = log_broker
    with broker.api() as api:
        job = api.post("/v1/jobs", json=job_body(name="with-a-log", work_gpu_hours="2", max_total_usd="40")).json()
        broker.pause.unlink()  # the loop places it
        deadline = time.monotonic() + 60
        while (placement := api.get(f"/v1/jobs/{job['id']}").json()["placement"]) is None:
            assert time.monotonic() < deadline, "the job was not placed"
            time.sleep(0.2)
        broker.pause.touch()
    lines = [f"epoch {i} loss {1 / (i + 1):.4f}" for i in range(40)] + ["<b>not markup</b>"]
    _store_log(broker, stores, job["id"], placement["id"], "\n".join(lines) + "\n")

    tab = Page(browser, broker)
    tab.sign_in(DEV_API_KEY)
    tab.go(f"#/jobs/{job['id']}", "job")
    tail = tab.page.locator("[data-testid=log-tail]")
    expect(tail).to_contain_text("epoch 39 loss 0.0250", timeout=15_000)
    shown = tab.text("[data-testid=log-tail]")
    assert shown.splitlines() == lines, shown[-500:]  # every chunk, joined in order; markup shown as text
    assert tab.page.locator("[data-testid=log-tail] b").count() == 0
    tab.shot("job-log-tail")
    tab.close()
