"""The broker end to end on GCP (the real google-cloud-compute clients against a local endpoint): a job is placed
on a Spot VM, Google preempts it (a compute.instances.preempted operation), the tick marks the placement preempted
and re-places the job in another zone, and the stopped VM is deleted so its disk stops billing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.app import create_app
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.settings import DEV_API_KEY, Settings
from broker.tables import Placement
from providers.base import NotFound
from providers.model import Offering
from tests.builders import job_body
from tests.gcp_compute_fake import GcpComputeFake
from tests.test_provider_gcp import make_provider, offering


class GcpMarket:
    """Two GCP T4 spot pools in different zones for the broker's catalog."""

    name = "gcp-prices"

    def offerings(self, now: datetime) -> list[Offering]:
        a = offering()
        a = dataclasses.replace(a, price=dataclasses.replace(a.price, observed_at=now))
        b = dataclasses.replace(a, zone="us-central1-b")
        b = dataclasses.replace(b, price=dataclasses.replace(b.price, hourly_usd=a.price.hourly_usd * 2))
        return [a, b]


@pytest.fixture
def fake() -> Iterator[GcpComputeFake]:
    with GcpComputeFake() as server:
        yield server


def test_preempted_spot_vm_is_replaced_elsewhere_and_deleted(fake: GcpComputeFake, tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'gcp.db'}",
        data_dir=tmp_path,
        simulated=False,
        wait_value_usd_per_gpu_hour=0,
    )
    rt = build_runtime(settings)
    gcp = make_provider(fake)
    rt.providers[gcp.name] = gcp
    rt.offering_sources.append(GcpMarket())
    tick(rt, datetime.now(UTC))
    api = TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    job = api.post("/v1/jobs", json=job_body(accelerators=["T4"], gpu_count=2, work_gpu_hours="4")).json()
    tick(rt, datetime.now(UTC))
    with Session(rt.engine) as s:
        [p] = s.exec(select(Placement).where(Placement.job_id == job["id"])).all()
    assert p.provider == "gcp" and p.zone == "us-central1-a" and p.instance_id
    fake.preempt(p.instance_id)
    tick(rt, datetime.now(UTC))
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement).where(Placement.job_id == job["id"]).order_by(Placement.id)).all()
    assert placements[0].state == "preempted"
    assert len(placements) == 2 and placements[1].zone == "us-central1-b"
    kinds = [e["kind"] for e in api.get(f"/v1/jobs/{job['id']}/events").json()]
    assert "interruption_notice" in kinds or "preempted" in kinds
    tick(rt, datetime.now(UTC))
    try:
        gone = gcp.get(p.instance_id)
    except NotFound:
        return  # the stopped spot VM was deleted
    raise AssertionError(f"the preempted VM still exists: {gone.state}")
