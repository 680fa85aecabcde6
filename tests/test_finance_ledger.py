"""The ledger through the real control loop: a job that crosses a month boundary, sees a spot price change and
is preempted between checkpoints, then finishes elsewhere. Its ledger must equal price x duration exactly
(Decimal), per placement, per day and per month, with the lost work split out as `wasted`; corrections and
egress entries are new rows; /v1/costs groups it all."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.api.auth import Role, create_key
from broker.finance.ledger import record_entry
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.db import plain
from broker.store.tables import CostEntryRow, Job, Placement
from providers.model import CostKind, hours_between
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, admin_api, attach

START = datetime(2026, 10, 31, 20, 0, tzinfo=UTC)


@pytest.fixture
def cloud(clock: MovableClock) -> ScriptedCloud:
    clock.now = START
    return ScriptedCloud("scripted", clock)


@pytest.fixture
def srt(db_url: str, make_runtime: Callable[..., Runtime], cloud: ScriptedCloud, clock: MovableClock) -> Runtime:
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0)
    attach(rt, cloud)
    tick(rt, clock())
    return rt


@pytest.fixture
def api(srt: Runtime) -> TestClient:
    return admin_api(srt)


@pytest.fixture
def key(srt: Runtime, clock: MovableClock) -> Callable[[str, Role], dict[str, str]]:
    def make(tenant: str, role: Role) -> dict[str, str]:
        return {"Authorization": f"Bearer {create_key(srt.engine, tenant=tenant, role=role, name='t', now=clock())}"}

    return make


def _run(rt: Runtime, clock: MovableClock, ticks: int, minutes: float = 10) -> None:
    for _ in range(ticks):
        clock.advance(minutes=minutes)
        tick(rt, clock())


def _entries(rt: Runtime, job_id: str) -> list[CostEntryRow]:
    with Session(rt.engine) as s:
        return list(s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id).order_by(CostEntryRow.id)).all())


def _placements(rt: Runtime, job_id: str) -> list[Placement]:
    with Session(rt.engine) as s:
        return list(s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.id)).all())


def _month_with_price_change_and_preemption(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> str:
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("11")}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="12", max_total_usd="200")).json()["id"]
    tick(srt, clock())  # placed on z1 at 20:00, $10/h
    _run(srt, clock, 12)  # to 22:00
    cloud.prices["z1"] = Decimal("14")  # the spot price moves mid-run
    _run(srt, clock, 18)  # to 01:00 on November 1st: across midnight and the month boundary
    clock.advance(minutes=7)  # 5 h 07 of work; the last checkpoint (every 30 min) saved 5 h
    [first] = _placements(srt, job_id)
    assert first.instance_id is not None
    cloud.preempt(first.instance_id)
    tick(srt, clock())  # 01:07: preempted, re-placed on z2 ($11/h) with 7 h of work left
    _run(srt, clock, 43)  # 7 h 10 min: finishes at 08:07
    return job_id


def test_month_with_price_change_and_preemption_is_exact(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    job_id = _month_with_price_change_and_preemption(srt, api, cloud, clock)
    with Session(srt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == "succeeded"
    first, second = _placements(srt, job_id)
    assert (first.state, first.zone, second.zone, second.state) == ("preempted", "z1", "z2", "succeeded")
    assert first.started_at == START and first.ended_at == datetime(2026, 11, 1, 1, 7, tzinfo=UTC)
    assert second.started_at is not None and second.ended_at is not None
    entries = _entries(srt, job_id)

    def total(rows: list[CostEntryRow]) -> Decimal:
        return sum((e.usd for e in rows), Decimal("0"))

    # placement 1: $10 until the tick that sees the new price (22:10), then 2 h 57 at $14 (each price one
    # telescoped stretch, rounded once to 1e-10)
    moved = START + timedelta(hours=2, minutes=10)
    p1 = (Decimal("10") * hours_between(START, moved)).quantize(Decimal("1e-10")) + (
        Decimal("14") * hours_between(moved, first.ended_at)
    ).quantize(Decimal("1e-10"))
    p2 = Decimal("11") * hours_between(second.started_at, second.ended_at)
    assert p1 == Decimal("62.9666666667") and p2 == Decimal("77")
    assert total([e for e in entries if e.placement_id == first.id]) == p1 == first.cost_usd
    assert total([e for e in entries if e.placement_id == second.id]) == p2 == second.cost_usd
    assert total(entries) == p1 + p2 == job.spent_usd
    # entries never straddle midnight, so October holds exactly its 4 hours (2 h 10 at $10, 1 h 50 at $14)
    assert all(e.period_start_at.date() == (e.period_end_at - timedelta(microseconds=1)).date() for e in entries)
    october = [e for e in entries if e.period_start_at < datetime(2026, 11, 1, tzinfo=UTC)]
    assert total(october) == Decimal("21.6666666667") + Decimal("25.6666666667")
    # the 7 minutes after the last checkpoint were redone: moved from compute to wasted, priced at $14/h
    # (pro rata of the compute entries covering them: entries end on each placement's own accrual grid, so the
    # split may differ from $14 x 7 min in its last 1e-10 digit; the total never does)
    wasted = [e for e in entries if e.kind == "wasted"]
    lost = total(wasted)
    assert abs(lost - Decimal("1.6333333333")) <= Decimal("1e-10")
    assert wasted[0].period_start_at == datetime(2026, 11, 1, 1, 0, tzinfo=UTC)
    assert total([e for e in entries if e.kind == "compute"]) == p1 + p2 - lost
    # every entry is attributed and carries where it ran
    assert {(e.team, e.project, e.tenant) for e in entries} == {("vision", "atlas", "demo")}
    assert {e.resource_id for e in entries} == {first.instance_id, second.instance_id}
    assert all(e.on_demand_usd >= 0 or e.kind == "compute" for e in entries)

    by_month = api.get("/v1/costs", params={"group_by": "month", "from": "2026-10-01", "to": "2026-12-01"}).json()
    # November holds the 7 lost minutes: they count in the cost, as wasted, and not in the on-demand equivalent
    # of the useful work (no saving: this cloud prices no on-demand twin)
    assert by_month["rows"] == [
        {
            "month": "2026-10",
            "cost_usd": "47.3333333334",
            "wasted_usd": "0",
            "on_demand_usd": "47.3333333334",
            "savings_usd": "0",
            "entries": 24,
            "display": {"cost_usd": "47.34", "wasted_usd": "0.00", "on_demand_usd": "47.34", "savings_usd": "0.00"},
        },
        {
            "month": "2026-11",
            "cost_usd": "92.6333333333",
            "wasted_usd": str(lost),
            "on_demand_usd": str(plain(Decimal("92.6333333333") - lost)),
            "savings_usd": "0",
            "entries": by_month["rows"][1]["entries"],
            "display": {"cost_usd": "92.63", "wasted_usd": "1.63", "on_demand_usd": "91.00", "savings_usd": "0.00"},
        },
    ]
    assert by_month["total"]["cost_usd"] == "139.9666666667" and by_month["total"]["display"]["cost_usd"] == "139.97"
    assert by_month["as_of"] == max(e.period_end_at for e in entries).isoformat().replace("+00:00", "Z")  # UTC as `Z`
    by_kind = api.get(
        "/v1/costs", params={"group_by": "team,kind", "from": "2026-10-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
    ).json()
    assert {(r["team"], r["kind"]): r["cost_usd"] for r in by_kind["rows"]} == {
        ("vision", "compute"): str(Decimal("139.9666666667") - lost),
        ("vision", "wasted"): str(lost),
    }


def test_spot_savings_use_the_on_demand_counterfactual(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("4"), "z2": Decimal("5")}
    cloud.on_demand = {"z1": Decimal("12")}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="1", max_total_usd="50")).json()["id"]
    tick(srt, clock())
    _run(srt, clock, 7)
    rows = api.get(
        "/v1/costs", params={"group_by": "provider,capacity_type", "from": "2026-10-31", "to": "2026-11-02"}
    ).json()["rows"]
    assert rows == [
        {
            "provider": "scripted",
            "capacity_type": "spot",
            "cost_usd": "4",
            "wasted_usd": "0",
            "on_demand_usd": "12",
            "savings_usd": "8",
            "entries": rows[0]["entries"],
            "display": {"cost_usd": "4.00", "wasted_usd": "0.00", "on_demand_usd": "12.00", "savings_usd": "8.00"},
        }
    ]
    assert sum(e.usd for e in _entries(srt, job_id)) == Decimal("4")


def test_corrections_and_egress_are_new_entries(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock, key: Callable[..., dict[str, str]]
) -> None:
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="1", max_total_usd="50")).json()["id"]
    tick(srt, clock())
    _run(srt, clock, 7)
    [first, *_] = _entries(srt, job_id)
    with Session(srt.engine) as s:
        job = s.exec(select(Job).where(Job.id == job_id).with_for_update()).one()
        placement = s.get(Placement, first.placement_id)
        before = job.spent_usd
        record_entry(
            s,
            job,
            kind=CostKind.EGRESS,
            usd=Decimal("0.9"),
            start=clock(),
            end=clock(),
            now=clock(),
            placement=placement,
            quantity=Decimal("10"),
            unit="GB",
            note="checkpoint copy to z2",
        )
        s.commit()
        assert job.spent_usd == before + Decimal("0.9")
    finance = key("demo", Role.FINANCE)
    made = api.post(
        "/v1/costs/corrections", json={"entry_id": first.id, "usd": "-0.5", "note": "credit"}, headers=finance
    )
    assert made.status_code == 201, made.text
    assert made.json()["corrects_id"] == first.id
    rows = _entries(srt, job_id)
    assert [r.usd for r in rows if r.id == first.id] == [first.usd]  # the original is untouched
    correction = next(r for r in rows if r.kind == "correction")
    assert (correction.corrects_id, correction.usd, correction.resource_id) == (
        first.id,
        Decimal("-0.5"),
        first.resource_id,
    )
    with Session(srt.engine) as s:
        job = s.get(Job, job_id)
        # a credit changes the books, not the job's room under its ceiling (broker/finance/ledger.py)
        assert job is not None and job.spent_usd == sum((r.usd for r in rows), Decimal("0")) + Decimal("0.5")
    other = key("someone-else", Role.FINANCE)
    assert api.post("/v1/costs/corrections", json={"entry_id": first.id, "usd": "1"}, headers=other).status_code == 404
    bad = api.post("/v1/costs/corrections", json={"entry_id": first.id, "usd": "abc"}, headers=finance)
    assert bad.status_code == 422 and "usd" in bad.json()["message"]


def test_costs_roles_and_validation(api: TestClient, key: Callable[..., dict[str, str]]) -> None:
    assert api.get("/v1/costs").status_code == 200  # admin
    assert api.get("/v1/costs", headers=key("demo", Role.FINANCE)).status_code == 200
    assert api.get("/v1/costs", headers=key("demo", Role.SUBMITTER)).status_code == 403
    bad = api.get("/v1/costs", params={"group_by": "team,colour"})
    assert bad.status_code == 422 and bad.json()["message"].startswith("group_by")
    bad = api.get("/v1/costs", params={"from": "yesterday"})
    assert bad.status_code == 422 and bad.json()["message"].startswith("from")
    empty = api.get("/v1/costs", params={"group_by": "team", "from": "2020-01-01", "to": "2020-02-01"}).json()
    assert empty["rows"] == [] and empty["as_of"] is None
    assert empty["total"] == {
        "cost_usd": "0",
        "wasted_usd": "0",
        "on_demand_usd": "0",
        "savings_usd": "0",
        "entries": 0,
        "display": {"cost_usd": "0.00", "wasted_usd": "0.00", "on_demand_usd": "0.00", "savings_usd": "0.00"},
    }
    assert empty["currency"] == "USD" and empty["group_by"] == ["team"]
