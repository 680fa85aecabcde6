"""The PostgreSQL write of `POST /v1/jobs`: the job, its `submitted` event, its audit row and the API key's
revocation check in one statement, one round trip, awaited on the event loop (broker/store/db_async.py).

Contract of `insert_submission(pool, job, event, audit, key_id)`:
- One statement (data-modifying CTEs, so it is atomic on its own): when `key_id` is given and that key is missing
  or revoked at that moment, nothing is inserted and it returns False; otherwise the three rows are inserted
  together and it returns True. A revocation committed before the statement starts is always seen.
- A second job with the tenant's Idempotency-Key violates `uq_job_tenant_idempotency_key`: nothing is inserted and
  `psycopg.errors.UniqueViolation` is raised (the caller answers with the earlier job).
- Values are bound as SQLAlchemy would bind them for these columns (`Money`, `UTCDateTime` through their
  `process_bind_param`, JSON as its text), each cast to its column's type, strings to `text` (so a value too long
  for its column fails as it would in a plain INSERT, never truncated).
- A statement that failed on an idle connection the server had dropped runs once more on a fresh one; if the first
  one had committed after all, the second finds the job's own id taken (`job_pkey`) and that counts as inserted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

import psycopg
from sqlalchemy import JSON, Column, String, Table, TypeDecorator
from sqlalchemy.dialects import postgresql

from broker.store.db_async import AsyncPgPool
from broker.store.tables import AuditEntry, Job, JobEvent

_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]
_JOB: Table = Job.__table__  # type: ignore[attr-defined]
_EVENT: Table = JobEvent.__table__  # type: ignore[attr-defined]
_AUDIT: Table = AuditEntry.__table__  # type: ignore[attr-defined]
_API_KEY = "api_key"


def _inserted(table: Table) -> list[Column[Any]]:
    """The columns an insert sets: all but an autoincrement primary key."""
    return [c for c in table.columns if c is not table.autoincrement_column]


def _impl(column: Column[Any]) -> Any:
    kind = column.type
    return kind.load_dialect_impl(_DIALECT) if isinstance(kind, TypeDecorator) else kind


def _cast(column: Column[Any]) -> str:
    impl = _impl(column)
    return "text" if isinstance(impl, String) else str(impl.compile(dialect=_DIALECT))


def _processor(column: Column[Any]) -> Callable[[Any], Any] | None:
    """How SQLAlchemy would turn a non-None value of this column into what the driver gets."""
    kind = column.type
    if isinstance(kind, TypeDecorator) and type(kind).process_bind_param is not TypeDecorator.process_bind_param:
        return lambda value: kind.process_bind_param(value, _DIALECT)
    if isinstance(_impl(column), JSON):
        return json.dumps
    return None


def _select_list(table: Table, prefix: str) -> tuple[str, str]:
    columns = _inserted(table)
    names = ", ".join(c.name for c in columns)
    values = ", ".join(f"CAST(%({prefix}{c.name})s AS {_cast(c)})" for c in columns)
    return names, values


@cache
def submission_sql(check_key: bool, with_audit: bool) -> str:
    """The statement (see the module docstring); built once per variant from the tables' metadata."""
    job_names, job_values = _select_list(_JOB, "j_")
    event_names, event_values = _select_list(_EVENT, "e_")
    source = (
        f"(SELECT 1 FROM {_API_KEY} WHERE id = %(key_id)s AND revoked_at IS NULL) AS live_key"
        if check_key
        else "(SELECT 1) AS always"
    )
    parts = [
        f"new_job AS (INSERT INTO {_JOB.name} ({job_names}) SELECT {job_values} FROM {source} RETURNING id)",
        f"new_event AS (INSERT INTO {_EVENT.name} ({event_names}) SELECT {event_values} FROM new_job)",
    ]
    if with_audit:
        audit_names, audit_values = _select_list(_AUDIT, "a_")
        parts.append(f"new_audit AS (INSERT INTO {_AUDIT.name} ({audit_names}) SELECT {audit_values} FROM new_job)")
    return "WITH " + ",\n".join(parts) + "\nSELECT count(*) FROM new_job"


@cache
def _binders(table: Table, prefix: str) -> list[tuple[str, str, Any, Callable[[Any], Any] | None]]:
    """(column, parameter, default, processor) of each inserted column."""
    return [(c.name, prefix + c.name, _default(c), _processor(c)) for c in _inserted(table)]


def _bind(table: Table, prefix: str, row: dict[str, Any], params: dict[str, Any]) -> None:
    for name, param, default, processor in _binders(table, prefix):
        value = row.get(name, default)
        params[param] = processor(value) if processor is not None and value is not None else value


def _default(column: Column[Any]) -> Any:
    default = column.default
    if default is None:
        return None
    return default.arg if default.is_scalar else None  # type: ignore[attr-defined]


async def insert_submission(
    pool: AsyncPgPool,
    job: dict[str, Any],
    event: dict[str, Any],
    audit: dict[str, Any] | None,
    key_id: str | None,
) -> bool:
    """Insert the rows of one submission (see the module docstring)."""
    params: dict[str, Any] = {}
    _bind(_JOB, "j_", job, params)
    _bind(_EVENT, "e_", event, params)
    if audit is not None:
        _bind(_AUDIT, "a_", audit, params)
    if key_id is not None:
        params["key_id"] = key_id
    sql = submission_sql(key_id is not None, audit is not None)
    try:
        rows = await pool.fetch(sql, params, retry_stale=True)
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name == f"{_JOB.name}_pkey":  # a retry found the first attempt's job: it committed
            return True
        raise
    return bool(rows and rows[0][0])


_PENDING_SQL = f"SELECT count(*) FROM {_JOB.name} WHERE tenant = %(tenant)s AND state = 'pending'"


async def pending_jobs(pool: AsyncPgPool, tenant: str) -> int:
    """How many pending jobs `tenant` has (for the per-tenant cap, read before the submission's insert)."""
    rows = await pool.fetch(_PENDING_SQL, {"tenant": tenant}, retry_stale=True)
    return int(rows[0][0]) if rows else 0
