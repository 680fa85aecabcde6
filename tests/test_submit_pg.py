"""`POST /v1/jobs`'s PostgreSQL write (broker/services/jobs_pg.py on broker/store/db_async.py), on a real server:

- the job, its event and its audit row go in together or not at all: a revoked or unknown key, or a repeated
  Idempotency-Key, leaves no row of the submission behind;
- what it stores reads back exactly as what the engine's path (`submit_job`, SQLAlchemy) stores for the same
  request, column by column;
- an idle connection the server dropped is replaced within the same submission, which is stored once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from broker.api.audit import entry_row
from broker.api.auth import InvalidKey, Role, create_key, revoke_key
from broker.api.schemas import JobCreate
from broker.runtime import Runtime
from broker.services.jobs import submit_job, submit_job_async
from broker.store.db_async import AsyncPgPool
from broker.store.tables import AuditEntry, Job, JobEvent
from tests.builders import job_body

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_rt(postgres: Any, make_runtime: Callable[..., Runtime]) -> Runtime:
    return make_runtime(postgres.create_database(), simulated=False)


def _audit(rt: Runtime, key_id: str, tenant: str) -> dict[str, Any]:
    from broker.api.auth import Principal

    scope = {
        "method": "POST",
        "path": "/v1/jobs",
        "client": ("10.0.0.1", 1),
        "state": {"principal": Principal(key_id, tenant, Role.SUBMITTER), "request_id": "req-1"},
    }
    row = entry_row(scope, 202, rt.clock())
    assert row is not None
    return row


def _counts(rt: Runtime) -> tuple[int, int, int]:
    with Session(rt.engine) as s:
        return tuple(  # type: ignore[return-value]
            int(s.exec(select(func.count()).select_from(table)).one()) for table in (Job, JobEvent, AuditEntry)
        )


def _submit(pool: AsyncPgPool, rt: Runtime, key: str, **options: Any) -> tuple[str, bool]:
    key_id = key.split("_")[1]
    body = JobCreate(**job_body(**options.pop("body", {})))
    options.setdefault("idempotency_key", None)

    async def run() -> tuple[str, bool]:
        try:
            public, created = await submit_job_async(
                pool,
                rt.engine,
                rt.catalog,
                tenant="acme",
                create=body,
                now=rt.clock(),
                audit=_audit(rt, key_id, "acme"),
                key_id=key_id,
                **options,
            )
            return public.id, created
        finally:
            await pool.aclose()

    return asyncio.run(run())


def test_a_submission_is_stored_whole_or_not_at_all(pg_rt: Runtime) -> None:
    rt = pg_rt
    pool = AsyncPgPool.for_engine(rt.engine)
    assert pool is not None
    key = create_key(rt.engine, tenant="acme", role=Role.SUBMITTER, name="ci", now=rt.clock())
    before = _counts(rt)

    job_id, created = _submit(pool, rt, key, idempotency_key="k1")
    assert created and _counts(rt) == (before[0] + 1, before[1] + 1, before[2] + 1)
    with Session(rt.engine) as s:
        assert s.exec(select(JobEvent.kind).where(JobEvent.job_id == job_id)).all() == ["submitted"]
        entry = s.exec(select(AuditEntry).where(AuditEntry.key_id == key.split("_")[1])).one()
        assert (entry.method, entry.path, entry.status, entry.request_id) == ("POST", "/v1/jobs", 202, "req-1")

    again, created = _submit(pool, rt, key, idempotency_key="k1")
    assert (again, created) == (job_id, False), "the same Idempotency-Key answers with the earlier job"
    with pytest.raises(Exception, match="Idempotency-Key"):  # Conflict: same key, another request
        _submit(pool, rt, key, idempotency_key="k1", body={"name": "other"})
    assert _counts(rt) == (before[0] + 1, before[1] + 1, before[2] + 1), "a replay or conflict stores nothing"

    revoke_key(rt.engine, "acme", key.split("_")[1], rt.clock())
    with pytest.raises(InvalidKey):
        _submit(pool, rt, key)
    unknown = "ovs_nosuchkey_" + "x" * 24
    with pytest.raises(InvalidKey):
        _submit(pool, rt, unknown)
    assert _counts(rt) == (before[0] + 1, before[1] + 1, before[2] + 1), "a revoked or unknown key stores nothing"


def _stored(rt: Runtime, job_id: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
        event = s.exec(select(JobEvent).where(JobEvent.job_id == job_id)).one()
        audit = s.exec(select(AuditEntry).order_by(AuditEntry.id.desc())).first()  # type: ignore[union-attr]
        assert job is not None and audit is not None
        return (
            job.model_dump(exclude={"id", "request_id"}),
            event.model_dump(exclude={"id", "job_id"}),
            audit.model_dump(exclude={"id"}),
        )


def test_the_statement_stores_what_the_engine_path_stores(pg_rt: Runtime) -> None:
    rt = pg_rt
    pool = AsyncPgPool.for_engine(rt.engine)
    assert pool is not None
    key = create_key(rt.engine, tenant="acme", role=Role.SUBMITTER, name="ci", now=rt.clock())
    key_id = key.split("_")[1]
    body = job_body(
        max_hourly_usd="3.25",
        deadline="2099-01-02T03:04:05.123456Z",
        priority=7,
        env={"A": "é ü"},
        allowed_regions=["us-east-1"],
        work_gpu_hours="1.123457",
    )
    job_id, _ = _submit(pool, rt, key, body=body, idempotency_key="same")
    async_rows = _stored(rt, job_id)
    engine_job, created = submit_job(
        rt.engine,
        rt.catalog,
        tenant="acme",
        create=JobCreate(**body),
        idempotency_key="other",
        now=rt.clock(),
        audit=_audit(rt, key_id, "acme"),
        key_id=key_id,
    )
    assert created
    engine_rows = _stored(rt, engine_job.id)
    async_job, engine_job_row = dict(async_rows[0]), dict(engine_rows[0])
    assert async_job.pop("idempotency_key") == "same" and engine_job_row.pop("idempotency_key") == "other"
    assert async_job == engine_job_row
    assert async_rows[1:] == engine_rows[1:]


def test_a_connection_the_server_dropped_is_replaced_and_the_job_stored_once(pg_rt: Runtime) -> None:
    rt = pg_rt
    pool = AsyncPgPool.for_engine(rt.engine)
    assert pool is not None
    key = create_key(rt.engine, tenant="acme", role=Role.SUBMITTER, name="ci", now=rt.clock())
    key_id = key.split("_")[1]

    async def run() -> list[tuple[str, bool]]:
        made = []
        try:
            for n in range(2):
                if n == 1:  # the server ends every other session (a restart, an idle timeout)
                    with psycopg.connect(pool.conninfo, autocommit=True) as admin:
                        ended = admin.execute(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                            "AND application_name = ''"
                        ).fetchone()
                        assert ended is not None and ended[0] >= 1
                public, created = await submit_job_async(
                    pool,
                    rt.engine,
                    rt.catalog,
                    tenant="acme",
                    create=JobCreate(**job_body(name=f"n{n}")),
                    idempotency_key=None,
                    now=rt.clock(),
                    audit=_audit(rt, key_id, "acme"),
                    key_id=key_id,
                )
                made.append((public.id, created))
        finally:
            await pool.aclose()
        return made

    rt.engine.dispose()  # only the pool's connection is left for the server to end
    before = _counts(rt)
    rt.engine.dispose()
    made = asyncio.run(run())
    assert [created for _, created in made] == [True, True]
    assert pool.opened == 2, "the dropped connection was replaced by one new connection"
    assert _counts(rt) == (before[0] + 2, before[1] + 2, before[2] + 2)
