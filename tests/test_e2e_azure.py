"""The broker end to end on Azure (the real ComputeManagementClient against a local ARM endpoint): a job is placed
on a Spot VM, the VM relays a Scheduled Events Preempt document home, the tick marks the placement preempted and
re-places the job, and the evicted VM is gone."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.app import create_app
from broker.auth import callback_token
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.settings import DEV_API_KEY, Settings
from broker.tables import Placement
from providers.base import NotFound
from providers.model import CapacityType
from tests.azure_compute_fake import AzureComputeFake
from tests.builders import job_body
from tests.test_provider_azure import SUB, make_provider, offering


class AzureMarket:
    """Two Azure spot pools for the broker's catalog (prices as the Retail Prices feed would give them)."""

    name = "azure-prices"

    def offerings(self, now: datetime) -> list:  # type: ignore[type-arg]
        spot = dataclasses.replace(
            offering(CapacityType.SPOT), price=dataclasses.replace(offering().price, observed_at=now)
        )
        west = dataclasses.replace(
            spot, region="westus2", zone="westus2", price=dataclasses.replace(spot.price, hourly_usd=Decimal("0.9"))
        )
        return [spot, west]


@pytest.fixture
def fake() -> Iterator[AzureComputeFake]:
    with AzureComputeFake(SUB) as server:
        yield server


def test_relayed_preempt_replaces_the_job_and_the_vm_is_gone(fake: AzureComputeFake, tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'az.db'}",
        data_dir=tmp_path,
        simulated=False,
        public_url="https://broker.example",
        wait_value_usd_per_gpu_hour=0,
    )
    rt = build_runtime(settings)
    azure = make_provider(fake)
    rt.providers[azure.name] = azure
    rt.offering_sources.append(AzureMarket())
    tick(rt, datetime.now(UTC))
    api = TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    job = api.post("/v1/jobs", json=job_body(accelerators=["A100-80GB"], work_gpu_hours="3", max_total_usd="20")).json()
    tick(rt, datetime.now(UTC))
    with Session(rt.engine) as s:
        [p] = s.exec(select(Placement).where(Placement.job_id == job["id"])).all()
    assert p.provider == "azure" and p.zone == "eastus" and p.instance_id
    document = {
        "DocumentIncarnation": 2,
        "Events": [
            {
                "EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
                "EventStatus": "Scheduled",
                "EventType": "Preempt",
                "ResourceType": "VirtualMachine",
                "Resources": [p.instance_id],
                "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
                "Description": "",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
        ],
    }
    url = f"/v1/placements/{p.id}/scheduled-events"
    token = {"X-Overspill-Callback-Token": callback_token(settings, p.id)}
    assert api.post(url, json=document, headers={"X-Overspill-Callback-Token": "forged"}).status_code == 403
    assert api.post(url, json=document, headers=token).json() == {"preempt": True}
    fake.evict(azure.resource_group, p.instance_id)  # Azure evicts (eviction policy Delete)
    tick(rt, datetime.now(UTC))
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement).where(Placement.job_id == job["id"]).order_by(Placement.id)).all()
    assert placements[0].state == "preempted"
    assert len(placements) == 2 and placements[1].zone == "westus2"
    try:
        gone = azure.get(placements[0].instance_id or "")
    except NotFound:
        return  # deleted, as eviction policy Delete does
    assert gone.state.terminal
