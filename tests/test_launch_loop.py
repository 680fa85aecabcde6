"""The control loop and what launching costs: placement considers only pools something here can launch (the rest are
quoted `no_launch_adapter`), an instance's boot disk and public IPv4 are accrued beside its compute (own ledger
kinds, in the job's spend, in the FOCUS export as storage and networking rows), counted by the ceiling guard and in a
pool's expected cost, and the orphan sweep over the simulated clouds terminates each orphan once.

Driven through `tick()` with a scripted cloud (tests/scripted.py) and the built-in simulated market."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.loop.interrupts import sweep_orphans
from broker.loop.sync import _projected_spend
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import CostEntryRow, Job, JobEvent, Placement
from pricing.extras import InstanceExtras
from providers.base import LaunchRequest
from providers.model import CapacityType, Offering, Price, Tags, hours_between
from tests.builders import job_body, spec
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, admin_api, attach


class PricesOnly:
    """A price feed for pools of a provider the broker has no adapter for (prices without OVERSPILL_GCP_LAUNCH,
    or an imported catalog): cheaper than anything launchable."""

    name = "gcp"

    def offerings(self, now: datetime) -> list[Offering]:
        return [
            Offering(
                provider="gcp",
                region="us-central1",
                zone="us-central1-a",
                instance_type="a2-highgpu-1g",
                accelerator="A100",
                accelerator_count=1,
                gpu_memory_gib=40,
                vcpus=12,
                memory_gib=Decimal("85"),
                capacity_type=CapacityType.SPOT,
                price=Price(Decimal("1.10"), "gcp-catalog", now),
            )
        ]


@pytest.fixture
def cloud(clock: MovableClock) -> ScriptedCloud:
    return ScriptedCloud("scripted", clock)


@pytest.fixture
def srt(db_url: str, make_runtime: Callable[..., Runtime], cloud: ScriptedCloud, clock: MovableClock) -> Runtime:
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0)
    attach(rt, cloud)
    rt.offering_sources.append(PricesOnly())
    tick(rt, clock())
    return rt


@pytest.fixture
def api(srt: Runtime) -> TestClient:
    return admin_api(srt)


def _placements(rt: Runtime, job_id: str) -> list[Placement]:
    with Session(rt.engine) as s:
        return list(s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.id)).all())


def test_pools_no_adapter_can_launch_are_never_chosen_and_quoted_as_such(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    """Before: the GCP pool (cheapest, priced, no adapter) was chosen, and its launch failed, one pool per tick."""
    quote = api.post("/v1/quotes", json=job_body(work_gpu_hours="2", max_total_usd="100")).json()
    rejected = {r["offering_key"]: r for r in quote["rejections"]}
    gcp = "gcp/us-central1/us-central1-a/a2-highgpu-1g/spot"
    assert rejected[gcp]["reason"] == "no_launch_adapter" and "no configured adapter" in rejected[gcp]["message"]
    assert {c["offering"]["provider"] for c in quote["candidates"]} == {"scripted"}

    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="2", max_total_usd="100")).json()["id"]
    tick(srt, clock.advance(minutes=1))
    [p] = _placements(srt, job_id)
    assert p.provider == "scripted" and p.instance_id is not None
    with Session(srt.engine) as s:
        failed = s.exec(select(JobEvent).where(JobEvent.kind == "launch_failed")).all()
    assert failed == [], "no launch was ever tried where nothing can launch"

    cloud.prices = {z: Decimal("99") for z in cloud.zones}  # the launchable pools are over the job's hourly cap
    job_id = api.post("/v1/jobs", json=job_body(max_hourly_usd="5", max_total_usd="100")).json()["id"]
    tick(srt, clock.advance(minutes=1))
    assert _placements(srt, job_id) == []
    with Session(srt.engine) as s:
        job = s.get(Job, job_id)
    assert job is not None and job.state == "pending"
    assert job.wait_reason.startswith("over_hourly_ceiling"), "the limit the job can act on, not the unlaunchable pool"


def test_boot_disk_and_public_ipv4_are_accrued_beside_compute_and_reported_as_their_own_kinds(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    srt.extras[cloud.name] = InstanceExtras("aws", 200, "gp3", True)  # as OVERSPILL_AWS_LAUNCH sets it for "aws"
    disk_hourly = Decimal("0.08") * 200 / 730
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="2", max_total_usd="100")).json()["id"]
    for _ in range(14):
        tick(srt, clock.advance(minutes=10))
    [p] = _placements(srt, job_id)
    assert p.state == "succeeded" and p.started_at is not None and p.ended_at is not None
    hours = hours_between(p.started_at, p.ended_at)
    with Session(srt.engine) as s:
        rows = s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id)).all()
        job = s.get(Job, job_id)
    assert job is not None
    by_kind: dict[str, Decimal] = {}
    for r in rows:
        by_kind[r.kind] = by_kind.get(r.kind, Decimal(0)) + r.usd
    assert by_kind["compute"] == Decimal("10") * hours
    assert by_kind["disk"] == (disk_hourly * hours).quantize(Decimal("1e-10")), "exact despite many accruals"
    assert by_kind["public_ip"] == Decimal("0.005") * hours
    assert job.spent_usd == sum(by_kind.values()) == p.cost_usd, "the job's spend and the placement's cost count them"
    disk = [r for r in rows if r.kind == "disk"]
    assert {(r.unit, r.note) for r in disk} == {("GB-Hours", "boot disk 200 GB gp3")}
    assert sum((r.quantity for r in disk), Decimal(0)) == pytest.approx(200 * hours, abs=Decimal("1e-6"))
    assert all(r.on_demand_usd == r.usd for r in rows if r.kind in ("disk", "public_ip")), "no spot saving on them"

    run = api.post(
        "/v1/report-runs", json={"from": "2026-11-02T00:00:00Z", "to": "2026-11-03T00:00:00Z", "format": "focus"}
    )
    assert run.status_code == 201, run.text
    focus = list(csv.DictReader(io.StringIO(api.get(run.json()["download_url"]).text)))
    services = {r["x_CostKind"]: (r["ServiceCategory"], r["ServiceSubcategory"], r["PricingCategory"]) for r in focus}
    assert services["disk"] == ("Storage", "Block Storage", "Standard")
    assert services["public_ip"] == ("Networking", "Network Infrastructure", "Standard")
    assert services["compute"] == ("Compute", "Virtual Machines", "Dynamic")
    assert sum(Decimal(r["BilledCost"]) for r in focus) == job.spent_usd


def test_the_ceiling_guard_and_the_expected_cost_count_what_an_instance_bills_beside_compute(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    body = job_body(work_gpu_hours="2", max_total_usd="100")
    before = api.post("/v1/quotes", json=body).json()["candidates"][0]
    srt.extras[cloud.name] = InstanceExtras("aws", 200, "gp3", True)
    extra = Decimal("0.08") * 200 / 730 + Decimal("0.005")
    after = api.post("/v1/quotes", json=body).json()["candidates"][0]
    run_hours = Decimal(str(after["expected_run_hours"]))
    assert Decimal(after["expected_cost_usd"]) - Decimal(before["expected_cost_usd"]) == pytest.approx(
        extra * run_hours, abs=Decimal("0.01")
    )
    assert Decimal(after["expected_cost_usd"]) > Decimal(before["expected_cost_usd"])

    job_id = api.post("/v1/jobs", json=body).json()["id"]
    tick(srt, clock.advance(minutes=1))
    tick(srt, clock.advance(minutes=1))
    [p] = _placements(srt, job_id)
    with Session(srt.engine) as s:
        job = s.get(Job, job_id)
        placement = s.get(Placement, p.id)
    assert job is not None and placement is not None
    _, hourly = _projected_spend(srt, placement, job, clock())
    assert hourly == Decimal("10") + extra, "the guard projects compute and the disk and address together"

    cloud.prices = {z: Decimal("1") for z in cloud.zones}
    capped = api.post("/v1/quotes", json=job_body(max_hourly_usd="1.01", max_total_usd="100")).json()
    assert capped["candidates"] == [], "$1/h compute + the disk and address is over a $1.01/h cap"
    [over] = [r for r in capped["rejections"] if r["provider"] == "scripted"][:1]
    assert over["reason"] == "over_hourly_ceiling" and "disk and address" in over["message"]


def test_the_sweep_terminates_each_orphan_of_the_simulated_clouds_once(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """Before: an orphan that had ended (finished, reclaimed) was "terminated" again on every pass, since the sweep
    skipped only TERMINATED instances and a simulated terminate does nothing for an ended one."""
    rt = make_runtime(db_url, orphan_grace_seconds=0, orphan_sweep_seconds=0)
    tick(rt, clock())
    cloud = next(p for p in rt.providers.values() if p.name.startswith("sim-"))
    offering = next(o for o in cloud.offerings(clock()) if o.capacity_type is CapacityType.ON_DEMAND)  # type: ignore[attr-defined]

    def orphan(token: str, hours: str) -> str:
        request = LaunchRequest(
            offering=offering,
            launch_token=token,
            tags=Tags(rt.settings.broker_id, f"job-{token}", f"plc-{token}"),
            spec=spec(),
            remaining_work_hours=Decimal(hours),
        )
        return cloud.launch(request).id

    running = orphan("lost-launch-running", "50")
    finished = orphan("lost-launch-finished", "0.5")
    clock.advance(hours=1)  # the short one has finished by itself
    assert cloud.get(finished).state.value == "succeeded" and cloud.get(finished).released
    assert sweep_orphans(rt, clock()) == 1, "only the running orphan needed terminating"
    assert cloud.get(running).state.value == "terminated"
    for _ in range(3):
        assert sweep_orphans(rt, clock.advance(minutes=5)) == 0, "later passes find nothing to do"
    assert timedelta(0) < clock() - cloud.get(running).launched_at
