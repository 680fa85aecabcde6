"""One tenant cannot starve the others: the placement round takes tenants in turn, `priority` orders jobs only within
a tenant, a job whose wait cannot have changed is skipped without being judged again, and a tenant's pending jobs
are capped (429 beyond the cap). On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlmodel import Session, col, select

from broker.api.schemas import JobCreate
from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.place import place_pending
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.services.jobs import submit_job
from broker.store.tables import Job
from tests.builders import job_body
from tests.conftest import MovableClock

# a ceiling no pool can run 5,000 GPU-hours under: the job waits forever ("never placeable")
HOPELESS = {"work_gpu_hours": "5000", "max_total_usd": "1", "priority": 1000}


def _submit(rt: Runtime, clock: MovableClock, tenant: str, n: int, **body: Any) -> list[str]:
    ids = []
    for i in range(n):
        job, _ = submit_job(
            rt.engine,
            rt.catalog,
            tenant=tenant,
            create=JobCreate(**job_body(name=f"{tenant}{i}", **body)),
            idempotency_key=None,
            now=clock(),
        )
        ids.append(job.id)
    return ids


def _state(rt: Runtime, job_id: str) -> str:
    with Session(rt.engine) as s:
        return s.exec(select(Job.state).where(Job.id == job_id)).one()


@contextmanager
def _statements(rt: Runtime) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(rt.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(rt.engine, "before_cursor_execute", count)


def test_a_flood_of_top_priority_jobs_does_not_starve_another_tenant(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url, max_placements_per_tick=20)
    tick(rt, clock())
    flood = _submit(rt, clock, "acme", 60, **HOPELESS)  # three rounds' worth, all at the top priority
    (victim,) = _submit(rt, clock, "beta", 1, priority=-1000)  # the lowest priority, submitted last
    place_pending(rt, clock())
    assert _state(rt, victim) == "running"  # looked at, and placed, in the very first round
    with Session(rt.engine) as s:
        looked = s.exec(
            select(Job).where(col(Job.id).in_(flood), Job.wait_reason != "waiting for the next placement round")
        ).all()
    assert len(looked) == 19  # acme had the rest of the round: its share, not all of it


def test_priority_orders_jobs_only_within_a_tenant(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url, max_placements_per_tick=2)
    tick(rt, clock())
    _submit(rt, clock, "acme", 5, **HOPELESS)
    low, high = _submit(rt, clock, "beta", 1, priority=-5)[0], _submit(rt, clock, "beta", 1, priority=7)[0]
    place_pending(rt, clock())
    assert (_state(rt, high), _state(rt, low)) == ("running", "pending")  # beta's one turn went to its own best


def test_a_job_whose_wait_cannot_have_changed_is_not_judged_again(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url, max_placements_per_tick=500)
    tick(rt, clock())
    flood = _submit(rt, clock, "acme", 200, **HOPELESS)
    with _statements(rt) as first:
        place_pending(rt, clock())
    with _statements(rt) as second:
        place_pending(rt, clock())  # same book, same blocklist, no job changed
    assert len(rt.wait_memo) == 200
    assert len(first) > 400 and len(second) < 20, (len(first), len(second))
    with Session(rt.engine) as s:  # a job that changes (its ceiling raised) is judged again at once
        job = s.get(Job, flood[0])
        assert job is not None
        job.spec = {**job.spec, "max_total_usd": "50000"}
        job.max_total_usd = Decimal(50000)
        job.updated_at = clock()
        s.add(job)
        s.commit()
    place_pending(rt, clock())
    assert _state(rt, flood[0]) == "running"


def test_pending_jobs_per_tenant_are_capped_with_a_clear_429(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
) -> None:
    rt = make_runtime(db_url, max_pending_jobs_per_tenant=3)
    with TestClient(create_app(runtime=rt)) as client:
        client.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
        for i in range(3):
            r = client.post("/v1/jobs", json=job_body(name=f"j{i}"), headers={"Idempotency-Key": f"k{i}"})
            assert r.status_code == 202, r.text
        r = client.post("/v1/jobs", json=job_body(name="one-too-many"))
        assert r.status_code == 429, r.text
        assert "max_pending_jobs_per_tenant" in r.text and "3 pending jobs" in r.text
        assert r.json()["errors"][0]["field"] == "max_pending_jobs_per_tenant"
        again = client.post("/v1/jobs", json=job_body(name="j0"), headers={"Idempotency-Key": "k0"})
        assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"  # a replay is answered
        first = client.get("/v1/jobs").json()["items"][-1]["id"]
        assert client.post(f"/v1/jobs/{first}/cancel").status_code == 200
        assert client.post("/v1/jobs", json=job_body(name="room-again")).status_code == 202
