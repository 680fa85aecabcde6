"""Burst decisions in /metrics, counted by decision and reason code, against a real Slurm queue.

One opted-in job fits a cloud pool and bursts; another's ceiling fits no cloud pool and stays (and, once the
on-prem wait is short, stays for that reason); when the cloud run succeeds the held Slurm job is cancelled. Each
outcome shows up under its bounded reason code."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from broker.app import create_app
from broker.loop.tick import tick
from broker.observe.metrics import BurstReason
from broker.runtime import Runtime
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud
from tests.test_e2e_slurm_burst import _opted_in, _runtime
from tests.test_provider_slurm import fill_gpus, job, wait_until


@pytest.fixture
def slurm(cluster: Any) -> Iterator[Any]:
    (cluster.root / "out").mkdir(exist_ok=True)
    cluster.cancel_all()
    yield cluster
    cluster.cancel_all()


def decisions(rt: Runtime) -> dict[tuple[str, str], float]:
    with TestClient(create_app(runtime=rt)) as c:
        text = c.get("/metrics").text
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "overspill_burst_decisions_total":
                out[(s.labels["decision"], s.labels["reason"])] = s.value
    return out


@pytest.mark.integration
def test_burst_decisions_are_counted_by_reason(slurm: Any, tmp_path: Path) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    rt = _runtime(slurm, tmp_path, cloud)
    fill_gpus(slurm, minutes=60)
    bursts = _opted_in(slurm)  # 2 GPU-hours at $3/h fit its $40 ceiling
    stays = _opted_in(slurm, max_total="1")  # no cloud pool runs it for $1
    provider = rt.providers["onprem-slurm"]
    for slurm_id in (bursts, stays):
        wait_until(lambda i=slurm_id: job(provider, i).state_reason in ("Resources", "Priority"), "the job to pend")
    assert decisions(rt) == {}

    tick(rt, clock())
    first = decisions(rt)
    assert first[("burst", BurstReason.LONG_WAIT)] == 1
    assert first[("stay", BurstReason.NO_CLOUD_POOL)] == 1
    assert job(provider, bursts).state_reason.startswith("JobHeld")
    assert not job(provider, stays).state_reason.startswith("JobHeld")

    tick(rt, clock())  # the held job is not decided again; the one that stays is re-evaluated each tick
    second = decisions(rt)
    assert second[("burst", BurstReason.LONG_WAIT)] == 1
    assert second[("stay", BurstReason.NO_CLOUD_POOL)] == 2

    clock.advance(hours=3)  # by the broker's clock the fillers' time limits have passed: the on-prem wait is short
    tick(rt, clock())
    tick(rt, clock())
    last = decisions(rt)
    assert last[("cancel_onprem", BurstReason.CLOUD_SUCCEEDED)] == 1
    assert last[("stay", BurstReason.SHORT_WAIT)] == 2
    assert set(last) == {
        ("burst", BurstReason.LONG_WAIT),
        ("stay", BurstReason.NO_CLOUD_POOL),
        ("stay", BurstReason.SHORT_WAIT),
        ("cancel_onprem", BurstReason.CLOUD_SUCCEEDED),
    }
