"""The broker end to end on GCP (the real google-cloud-compute clients against a local endpoint): a job is placed
on a Spot VM, Google preempts it (a compute.instances.preempted operation), the tick marks the placement preempted
and re-places the job in another zone, and the stopped VM is deleted so its disk stops billing; a finished job's
VM (stopped by its start-up script) is deleted too; an insert Google refuses in its operation, after the launch
returned, fails over on the next tick with the zone blocklisted; a stopped VM of this broker that no placement
owns is deleted by the orphan sweep, once."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime
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
from providers.model import Offering
from tests.builders import agent_store, job_body
from tests.gcp_compute_fake import GcpComputeFake
from tests.provider_contract import BROKER_ID, ContractEnv
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
        checkpoint_stores=agent_store(tmp_path),
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
    kinds = [e["kind"] for e in api.get(f"/v1/jobs/{job['id']}/events").json()["items"]]
    assert "interruption_notice" in kinds or "preempted" in kinds
    tick(rt, datetime.now(UTC))
    try:
        gone = gcp.get(p.instance_id)
    except NotFound:
        return  # the stopped spot VM was deleted
    raise AssertionError(f"the preempted VM still exists: {gone.state}")


def _runtime(fake: GcpComputeFake, tmp_path: Path, **overrides: object) -> tuple[Runtime, TestClient]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'gcp.db'}",
        data_dir=tmp_path,
        simulated=False,
        checkpoint_stores=agent_store(tmp_path),
        broker_id=BROKER_ID,
        public_url="https://broker.example",
        wait_value_usd_per_gpu_hour=0,
        **overrides,  # type: ignore[arg-type]
    )
    rt = build_runtime(settings)
    gcp = make_provider(fake)
    rt.providers[gcp.name] = gcp
    rt.offering_sources.append(GcpMarket())
    tick(rt, datetime.now(UTC))
    return rt, TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})


def _placements(rt: Runtime, job_id: str) -> list[Placement]:
    with Session(rt.engine) as s:
        return list(s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.id)).all())


def test_a_finished_jobs_vm_is_deleted_not_left_stopped(fake: GcpComputeFake, tmp_path: Path) -> None:
    rt, api = _runtime(fake, tmp_path)
    job = api.post("/v1/jobs", json=job_body(accelerators=["T4"], gpu_count=2, work_gpu_hours="4")).json()
    tick(rt, datetime.now(UTC))
    tick(rt, datetime.now(UTC))
    [p] = _placements(rt, job["id"])
    assert p.state == "running" and p.instance_id
    headers = {"X-Overspill-Callback-Token": callback_token(rt.settings, p.id)}
    final = proto.Report(
        p.id, 1, proto.ReportKind.FINAL, datetime.now(UTC).isoformat(), outcome=proto.Outcome.SUCCEEDED, exit_code=0
    ).signed(callback_token(rt.settings, p.id))  # the agent's final report, by the callback
    taken = api.post(f"/v1/placements/{p.id}/reports", json=json.loads(final.to_json()), headers=headers)
    assert taken.status_code == 200 and taken.json() == {"taken": True}
    fake.guest_shutdown(p.instance_id)  # the start-up script's `shutdown -h now`: the VM is stopped, disk and all
    tick(rt, datetime.now(UTC))
    [done] = _placements(rt, job["id"])
    assert done.state == "succeeded"
    assert fake.instance(p.instance_id) is None, "the finished VM is deleted: its boot disk bills no more"
    assert len(fake.recorded("DELETE", "/instances/" + p.instance_id.split("/")[1])) == 1


def test_an_insert_refused_in_its_operation_fails_over_on_the_next_tick(fake: GcpComputeFake, tmp_path: Path) -> None:
    """The insert is accepted (the tick does not wait for its operation); Google's stockout arrives in the
    operation; the next tick's sync reads it, fails the placement, blocklists the zone and places the job in the
    other zone, with Google's message in the launch_failed event."""
    rt, api = _runtime(fake, tmp_path)
    fake.op_seconds = 600.0  # the insert's operation ends when the test says so
    message = "The zone 'projects/proj/zones/us-central1-a' does not have enough resources available."
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", message, 503)
    job = api.post("/v1/jobs", json=job_body(accelerators=["T4"], gpu_count=2, work_gpu_hours="4")).json()
    tick(rt, datetime.now(UTC))
    [first] = _placements(rt, job["id"])
    assert first.zone == "us-central1-a" and first.instance_id and first.state == "launching"
    assert not fake.recorded("POST", "/wait"), "the tick never waited on the insert operation"
    fake.finish_operations()
    tick(rt, datetime.now(UTC))
    first, second = _placements(rt, job["id"])
    assert first.state == "failed" and first.detail.startswith("InsufficientCapacity:")
    assert second.zone == "us-central1-b", "re-placed in the same tick, away from the zone that said no"
    with Session(rt.engine) as s:
        blocked = s.exec(select(BlockEntry.scope_key)).all()
        [event] = s.exec(select(JobEvent).where(JobEvent.job_id == job["id"], JobEvent.kind == "launch_failed")).all()
    assert blocked == ["gcp/us-central1/us-central1-a"]
    assert event.data["blocked"] == "gcp/us-central1/us-central1-a" and event.data["error"] == "InsufficientCapacity"
    assert message in event.data["cloud_message"] and event.data["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"


def test_a_stopped_vm_no_placement_owns_is_swept_once(fake: GcpComputeFake, tmp_path: Path) -> None:
    rt, _ = _runtime(fake, tmp_path, orphan_grace_seconds=0)
    gcp = rt.providers["gcp"]
    orphan = gcp.launch(ContractEnv(provider=gcp, offering=offering()).request())  # a launch never recorded
    fake.guest_shutdown(orphan.id)  # it ran and stopped: it still holds (and bills) its boot disk
    assert gcp.get(orphan.id).lingering
    rt.marks.clear()
    assert sweep_orphans(rt, datetime.now(UTC)) == 1
    assert fake.instance(orphan.id) is None, "deleted, not merely stopped"
    rt.marks.clear()
    assert sweep_orphans(rt, datetime.now(UTC)) == 0, "the sweep converges: nothing is terminated twice"
    assert len(fake.recorded("DELETE", "/instances/" + orphan.id.split("/")[1])) == 1
