"""`broker.store.bulk`: many rows in one statement (arrays unnested on PostgreSQL, executemany on SQLite) read back
exactly as written: Decimal to the ledger's precision, tz-aware timestamps, JSON, NULLs (a column all NULL too)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlmodel import Session, col, select

from broker.runtime import Runtime
from broker.store.bulk import bulk_insert, bulk_update
from broker.store.tables import CostEntryRow, Job, JobEvent
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import admin_api

_AT = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def _entry(job_id: str, n: int) -> dict[str, object]:
    return {
        "job_id": job_id,
        "placement_id": None,
        "tenant": "default",
        "team": "t",
        "project": "p",
        "provider": "aws",
        "capacity_type": "spot",
        "kind": "compute",
        "period_start_at": _AT + timedelta(hours=n),
        "period_end_at": _AT + timedelta(hours=n + 1),
        "hourly_usd": Decimal("3.0000000001"),
        "usd": Decimal(n) + Decimal("0.0000000003"),
        "on_demand_usd": Decimal("12345678901234.0123456789"),
        "created_at": _AT,
        "region": "us-east-1",
        "zone": "",
        "instance_type": "p4d",
        "resource_id": f"i-{n}",
        "quantity": Decimal("1"),
        "unit": "Hours",
        "corrects_id": None,
        "note": "",
    }


def test_bulk_insert_and_update_write_every_row_exactly(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url)
    api = admin_api(rt)
    jobs = [api.post("/v1/jobs", json=job_body()).json()["id"] for _ in range(3)]
    with Session(rt.engine) as session:
        conn = session.connection()
        bulk_insert(conn, CostEntryRow.__table__, [_entry(job_id, n) for n, job_id in enumerate(jobs)])  # type: ignore[attr-defined]
        events = [
            {"job_id": j, "tenant": "default", "at": _AT, "kind": "bulk", "message": "m", "data": {"n": n, "x": None}}
            for n, j in enumerate(jobs)
        ]
        bulk_insert(conn, JobEvent.__table__, events)  # type: ignore[attr-defined]
        spent = [
            {"id": j, "spent_usd": Decimal("0.1234567891") * (n + 1), "updated_at": _AT, "origin_settled": n == 0}
            for n, j in enumerate(jobs)
        ]
        bulk_update(conn, Job.__table__, "id", spent[:2])  # type: ignore[attr-defined]
        session.commit()
    with Session(rt.engine) as session:
        entries = session.exec(select(CostEntryRow).order_by(col(CostEntryRow.period_start_at))).all()
        assert [(e.job_id, e.usd, e.resource_id, e.placement_id) for e in entries] == [
            (j, Decimal(n) + Decimal("0.0000000003"), f"i-{n}", None) for n, j in enumerate(jobs)
        ]
        assert {e.on_demand_usd for e in entries} == {Decimal("12345678901234.0123456789")}
        assert entries[1].period_end_at == _AT + timedelta(hours=2)
        got = session.exec(select(JobEvent).where(JobEvent.kind == "bulk").order_by(col(JobEvent.id))).all()
        assert [(e.job_id, e.data) for e in got] == [(j, {"n": n, "x": None}) for n, j in enumerate(jobs)]
        loaded = {j: session.get(Job, j) for j in jobs}
        assert [loaded[j].spent_usd for j in jobs] == [Decimal("0.1234567891"), Decimal("0.2469135782"), 0]  # type: ignore[union-attr]
        assert loaded[jobs[0]].updated_at == _AT  # type: ignore[union-attr]
        assert [loaded[j].origin_settled for j in jobs] == [True, False, False]  # type: ignore[union-attr]  # a bool
