"""The broker end to end on Azure (the real ComputeManagementClient against a local ARM endpoint): a job is placed
on a Spot VM, the VM relays a Scheduled Events Preempt document home, the tick marks the placement preempted and
re-places the job, and the evicted VM is gone; a finished job's VM (stopped, not deallocated, by its start-up
script: it would keep billing full compute) is deleted; a create Azure refuses in its operation fails over on the
next tick; a create an Azure Policy denies is refused for that job only, the provider not blocked; a stopped VM of
this broker that no placement owns is deleted by the orphan sweep, once."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from agent import protocol as proto
from broker.api.auth import callback_token
from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.interrupts import sweep_orphans
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.store.tables import BlockEntry, JobEvent, Placement
from providers.base import NotFound
from providers.model import CapacityType
from tests.azure_compute_fake import AzureComputeFake
from tests.builders import agent_store, job_body
from tests.provider_contract import BROKER_ID, ContractEnv
from tests.test_provider_azure import RG, SUB, make_provider, offering


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
        checkpoint_stores=agent_store(tmp_path),
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


def _runtime(fake: AzureComputeFake, tmp_path: Path, **overrides: object) -> tuple[Runtime, TestClient]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'az.db'}",
        data_dir=tmp_path,
        simulated=False,
        checkpoint_stores=agent_store(tmp_path),
        broker_id=BROKER_ID,
        public_url="https://broker.example",
        wait_value_usd_per_gpu_hour=0,
        **overrides,  # type: ignore[arg-type]
    )
    rt = build_runtime(settings)
    azure = make_provider(fake)
    rt.providers[azure.name] = azure
    rt.offering_sources.append(AzureMarket())
    tick(rt, datetime.now(UTC))
    return rt, TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})


def _placements(rt: Runtime, job_id: str) -> list[Placement]:
    with Session(rt.engine) as s:
        return list(s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.id)).all())


def _submit(api: TestClient) -> str:
    body = job_body(accelerators=["A100-80GB"], work_gpu_hours="3", max_total_usd="20")
    return str(api.post("/v1/jobs", json=body).json()["id"])


def test_a_finished_jobs_vm_is_deleted_not_left_stopped(fake: AzureComputeFake, tmp_path: Path) -> None:
    rt, api = _runtime(fake, tmp_path)
    job_id = _submit(api)
    tick(rt, datetime.now(UTC))
    tick(rt, datetime.now(UTC))
    [p] = _placements(rt, job_id)
    assert p.state == "running" and p.instance_id
    headers = {"X-Overspill-Callback-Token": callback_token(rt.settings, p.id)}
    final = proto.Report(
        p.id, 1, proto.ReportKind.FINAL, datetime.now(UTC).isoformat(), outcome=proto.Outcome.SUCCEEDED, exit_code=0
    ).signed(callback_token(rt.settings, p.id))  # the agent's final report, by the callback
    taken = api.post(f"/v1/placements/{p.id}/reports", json=json.loads(final.to_json()), headers=headers)
    assert taken.status_code == 200 and taken.json() == {"taken": True}
    fake.guest_shutdown(RG, p.instance_id)  # `shutdown -h now`: stopped, not deallocated, still billed
    tick(rt, datetime.now(UTC))
    [done] = _placements(rt, job_id)
    assert done.state == "succeeded"
    assert fake.vm(RG, p.instance_id) is None, "the finished VM is deleted"
    assert len(fake.recorded("DELETE", f"/virtualMachines/{p.instance_id}")) == 1


def test_a_create_refused_in_its_operation_fails_over_on_the_next_tick(fake: AzureComputeFake, tmp_path: Path) -> None:
    rt, api = _runtime(fake, tmp_path)
    fake.fail_async("AllocationFailed", "Allocation failed. We do not have sufficient capacity in this region.")
    job_id = _submit(api)
    tick(rt, datetime.now(UTC))
    [first] = _placements(rt, job_id)
    assert first.zone == "eastus" and first.instance_id and first.state == "launching"
    assert not fake.recorded("GET", "/operations/"), "the tick never polled the create"
    tick(rt, datetime.now(UTC))
    first, second = _placements(rt, job_id)
    assert first.state == "failed" and first.detail.startswith("InsufficientCapacity:")
    assert second.zone == "westus2", "re-placed in the same tick, away from the pool that said no"
    assert fake.vm(RG, first.instance_id or "") is None, "the VM the failed create left behind is deleted"
    with Session(rt.engine) as s:
        assert s.exec(select(BlockEntry.scope_key)).all() == ["azure/eastus/eastus"]
        [event] = s.exec(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "launch_failed")).all()
    assert "sufficient capacity" in event.data["cloud_message"] and event.data["code"] == "AllocationFailed"


def test_a_create_denied_by_policy_refuses_that_pool_for_that_job_only(fake: AzureComputeFake, tmp_path: Path) -> None:
    """Before: RequestDisallowedByPolicy came back as a 403, read as a credentials failure that blocked all of
    Azure for an hour. Now the pool is refused for that job, with the policy's message; other jobs still use it."""
    rt, api = _runtime(fake, tmp_path)
    message = "Resource 'ovs-x' was disallowed by policy. Policy identifiers: 'require-cost-center-tag'."
    fake.fail("put", 403, "RequestDisallowedByPolicy", message)
    denied = _submit(api)
    tick(rt, datetime.now(UTC))
    [refused] = _placements(rt, denied)
    assert refused.state == "failed" and refused.detail.startswith("PolicyDenied:")
    with Session(rt.engine) as s:
        assert s.exec(select(BlockEntry.scope_key)).all() == [], "nothing blocklisted: not the provider, not the zone"
        [event] = s.exec(select(JobEvent).where(JobEvent.job_id == denied, JobEvent.kind == "launch_failed")).all()
    assert (
        message in event.data["cloud_message"] and event.data["error"] == "PolicyDenied" and not event.data["blocked"]
    )
    other = _submit(api)
    tick(rt, datetime.now(UTC))
    assert [p.zone for p in _placements(rt, denied)] == ["eastus", "westus2"], "the refused pool is out for this job"
    assert [p.zone for p in _placements(rt, other)] == ["eastus"], "...and still the best pool for another job"


def test_a_stopped_vm_no_placement_owns_is_swept_once(fake: AzureComputeFake, tmp_path: Path) -> None:
    rt, _ = _runtime(fake, tmp_path, orphan_grace_seconds=0)
    azure = rt.providers["azure"]
    orphan = azure.launch(ContractEnv(provider=azure, offering=offering()).request())  # a launch never recorded
    fake.guest_shutdown(RG, orphan.id)  # stopped, not deallocated: billing full compute, unseen by the ledger
    assert azure.get(orphan.id).lingering
    rt.marks.clear()
    assert sweep_orphans(rt, datetime.now(UTC)) == 1
    assert fake.vm(RG, orphan.id) is None
    rt.marks.clear()
    assert sweep_orphans(rt, datetime.now(UTC)) == 0, "the sweep converges: nothing is terminated twice"
    assert len(fake.recorded("DELETE", f"/virtualMachines/{orphan.id}")) == 1
