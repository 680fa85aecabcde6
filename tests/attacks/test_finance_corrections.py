"""Ledger corrections from a finance key: a correction of -$99,999,999 made a job's spend negative (its ceiling and
any hard budget gone), and nothing recorded who did it. Corrections are bounded by the entry they correct, a credit
never gives a job more room under its ceiling, and every attempt is in the audit log with who, what and how much."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.finance.ledger import record_entry
from broker.runtime import Runtime
from broker.store.tables import CostEntryRow, Job
from providers.model import CostKind
from tests.attacks.finance_parts import finance_client
from tests.builders import job_body
from tests.conftest import MovableClock


@pytest.fixture
def crt(db_url: str, make_runtime: Callable[..., Runtime]) -> Runtime:
    return make_runtime(db_url, simulated=False)


def _job_with_spend(rt: Runtime, clock: MovableClock, usd: str = "30") -> tuple[str, int]:
    """A job with a $40 ceiling that the broker accrued `usd` for (one compute entry); its id and the entry's."""
    admin = TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    job_id = admin.post("/v1/jobs", json=job_body(max_total_usd="40")).json()["id"]
    with Session(rt.engine) as s:
        job = s.exec(select(Job).where(Job.id == job_id).with_for_update()).one()
        entry = record_entry(
            s,
            job,
            kind=CostKind.COMPUTE,
            usd=Decimal(usd),
            start=clock() - timedelta(hours=3),
            end=clock(),
            now=clock(),
            provider="aws",
            resource_id="i-0abc",
        )
        s.commit()
        assert entry.id is not None
        return job_id, entry.id


def _spent(rt: Runtime, job_id: str) -> Decimal:
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.spent_usd


@pytest.mark.parametrize("usd", ["-99999999", "-30.01", "99999999", "30.01"])
def test_a_correction_beyond_its_entry_is_refused(crt: Runtime, clock: MovableClock, usd: str) -> None:
    job_id, entry_id = _job_with_spend(crt, clock)
    answer = finance_client(crt, clock()).post("/v1/costs/corrections", json={"entry_id": entry_id, "usd": usd})
    assert _spent(crt, job_id) == Decimal("30")  # the ceiling guard still sees what the job spent
    assert answer.status_code == 422, answer.text
    assert answer.json()["message"].startswith("entry_id:") and "between 0 and 60" in answer.json()["message"]
    with Session(crt.engine) as s:
        assert s.exec(select(CostEntryRow).where(CostEntryRow.kind == "correction")).all() == []


def test_a_credit_never_gives_a_job_more_room_under_its_ceiling(crt: Runtime, clock: MovableClock) -> None:
    job_id, entry_id = _job_with_spend(crt, clock)
    api = finance_client(crt, clock())

    def correct(usd: str) -> dict[str, str]:
        made = api.post("/v1/costs/corrections", json={"entry_id": entry_id, "usd": usd, "note": "bill"})
        assert made.status_code == 201, made.text
        return dict(made.json())

    correct("12")  # billed more than accrued: that is spend, less room under the ceiling
    assert _spent(crt, job_id) == Decimal("42")
    correct("-12")  # undone: gives back what it took
    assert _spent(crt, job_id) == Decimal("30")
    correct("-20")  # the provider credited the whole entry, in two parts: allowed
    last = correct("-10")
    assert _spent(crt, job_id) == Decimal("30")  # $10 of its $40 left, as before: not $40
    costs = api.get("/v1/costs", params={"group_by": "job", "from": "2026-01-01"}).json()
    assert costs["total"]["cost_usd"] == "0"  # the books show the credit
    correct("12")  # re-billed after all, within what was credited: still what the broker accrued
    assert _spent(crt, job_id) == Decimal("30")
    more = api.post("/v1/costs/corrections", json={"entry_id": entry_id, "usd": "-12.01"})
    assert more.status_code == 422 and "would make it -0.01" in more.json()["message"], more.text
    chained = api.post("/v1/costs/corrections", json={"entry_id": last["id"], "usd": "1"})
    assert chained.status_code == 422 and "is a correction" in chained.json()["message"], chained.text


def test_corrections_are_audited_with_who_what_and_how_much(crt: Runtime, clock: MovableClock) -> None:
    job_id, entry_id = _job_with_spend(crt, clock)
    api = finance_client(crt, clock())
    key_id = api.headers["Authorization"].removeprefix("Bearer ovs_").split("_")[0]
    assert api.post("/v1/costs/corrections", json={"entry_id": entry_id, "usd": "-99999999"}).status_code == 422
    made = api.post("/v1/costs/corrections", json={"entry_id": entry_id, "usd": "-5.5", "note": "RI credit"})
    assert made.status_code == 201, made.text
    admin = TestClient(create_app(runtime=crt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    items = [i for i in admin.get("/v1/audit").json()["items"] if i["route"] == "/v1/costs/corrections"]
    assert [(i["status"], i["key_id"], i["role"]) for i in items] == [
        (201, key_id, "finance"),
        (422, key_id, "finance"),
    ]
    done, refused = (i["detail"] for i in items)
    assert f"cost entry {entry_id}" in done and "-5.5" in done and job_id in done and "RI credit" in done
    assert f"cost entry {entry_id}" in refused and "-99999999" in refused
