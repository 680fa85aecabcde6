"""Audit log of every state-changing API request: who (key id, tenant, role), what (method, path, route, status),
when, and from where (client address, request id).

Role: `AuditLog` is pure ASGI middleware. For every POST, PUT, PATCH and DELETE it writes when the response starts,
before the client sees it, so a client that got an answer was audited:
- a request whose API key was verified (`request.state.principal`, set by `broker.api.deps.get_principal`), refused
  ones included (403, 404, 422...), or an instance's callback whose per-placement token was verified (the route
  sets `request.state.audit_tenant`; role `instance`): one `audit_log` row in that tenant's log;
- any other request (no key, an invalid or revoked key, a bad callback token, a body refused before the key was
  checked): no `audit_log` row and no tenant; it is counted in `audit_refused`, one row per minute, client
  address, method, route template and status (`record_refused`: an upsert), so a flood of refused requests
  neither writes to a tenant's log nor grows a table row by row.
The request id stored is the sanitised one `broker.api.request_id` bound (the client's only if it is sane, else a
fresh one). A route may add what it did to `detail` by setting `request.state.audit_detail` (the corrections
route records the entry, amount, job and note). Never recorded: the body (beyond such a detail), the key's secret,
any header but `X-Request-ID`. The client address is the socket peer (`OVERSPILL_FORWARDED_ALLOW_IPS` makes it the
forwarded one behind a trusted proxy). If the row cannot be written the failure is logged and the answer still goes
out (the change it reports may already be committed).
A route may instead write its own entry inside the transaction of the change it reports (`entry_row` gives the
row; the route then sets `request.state.audited`): `POST /v1/jobs` does, so a job and its audit row commit or
roll back together, in one transaction instead of two. The middleware writes no second row for such a request;
when the route's transaction does not commit (a refusal, an idempotent replay) the middleware writes as usual.

`list_audit` reads a tenant's entries, newest first, with an opaque cursor.

`record_system` writes an entry for something the broker decided on its own (no request, no key): role `system`,
`method` the action (e.g. BURST, REFUSE), `path` what it acted on, `route` the reason code, `client` who it acted
for outside the broker (e.g. `slurm user=alice account=acme`), `request_id` the broker job id if any.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.api.auth import Principal
from broker.services.errors import Unprocessable
from broker.store.tables import AuditEntry, AuditRefused

log = logging.getLogger(__name__)

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _entry(scope: Scope, status: int, now: datetime) -> AuditEntry | AuditRefused:
    """The audit row for this request: an `AuditEntry` for a verified caller, else an `AuditRefused` count."""
    columns = entry_row(scope, status, now)
    if columns is not None:
        return AuditEntry(**columns)
    route = str(getattr(scope.get("route"), "path", ""))[:200]
    client = (scope.get("client") or ("",))[0][:100]
    minute = now.replace(second=0, microsecond=0)
    return AuditRefused(
        minute=minute, client=client, method=scope["method"][:8], route=route, status=status, last_at=now
    )


def entry_row(scope: Scope, status: int, now: datetime) -> dict[str, Any] | None:
    """The `audit_log` columns (all but `id`) of this request answered with `status`, for a verified caller; None
    when the caller is not verified (the middleware counts those). A route that inserts the row in its own
    transaction sets `request.state.audited`. Plain values, no model built: `POST /v1/jobs` calls this per request."""
    state = scope.get("state", {})
    principal = state.get("principal")
    if isinstance(principal, Principal):
        tenant, key_id, role = principal.tenant, principal.key_id, principal.role.value
    elif "audit_tenant" in state:  # an instance's callback, proven by its placement token
        tenant, key_id, role = str(state["audit_tenant"]), "", "instance"
    else:
        return None
    return {
        "at": now,
        "tenant": tenant,
        "key_id": key_id,
        "role": role,
        "method": scope["method"][:8],
        "path": scope["path"][:500],
        "route": str(getattr(scope.get("route"), "path", ""))[:200],
        "status": status,
        "client": (scope.get("client") or ("",))[0][:100],
        "request_id": str(state.get("request_id", ""))[:128],  # sanitised by broker.api.request_id
        "detail": str(state.get("audit_detail", ""))[:500],
    }


def record(engine: Engine, entry: AuditEntry | AuditRefused) -> None:
    """Store one entry: an `AuditEntry` appended, an `AuditRefused` added to its minute's count."""
    if isinstance(entry, AuditRefused):
        record_refused(engine, entry)
        return
    with Session(engine) as session:
        session.add(entry)
        session.commit()


def record_system(
    engine: Engine,
    *,
    at: datetime,
    tenant: str,
    action: str,
    subject: str,
    reason: str,
    status: int,
    actor: str = "",
    ref: str = "",
) -> None:
    """Store one entry of a decision the broker took itself (see the module docstring). A failure is logged, never
    raised: the decision stands."""
    entry = AuditEntry(
        at=at,
        tenant=tenant[:64],
        key_id="",
        role="system",
        method=action[:8],
        path=subject[:500],
        route=reason[:200],
        status=status,
        client=actor[:100],
        request_id=ref[:128],
    )
    try:
        record(engine, entry)
    except SQLAlchemyError as exc:
        log.error("audit: could not record %s %s (%s): %s", action, subject, reason, exc)


def record_refused(engine: Engine, entry: AuditRefused) -> None:
    """Count one refused request in its (minute, client, method, route, status) row: one atomic upsert."""
    table = AuditRefused.__table__  # type: ignore[attr-defined]
    insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    values = {c: getattr(entry, c) for c in ("minute", "client", "method", "route", "status", "last_at")}
    statement = insert(table).values(count=1, **values)
    statement = statement.on_conflict_do_update(
        index_elements=["minute", "client", "method", "route", "status"],
        set_={"count": table.c.count + 1, "last_at": statement.excluded.last_at},
    )
    with engine.begin() as conn:
        conn.execute(statement)


class AuditLog:
    """ASGI middleware writing one `AuditEntry` per state-changing request (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in STATE_CHANGING:
            await self.app(scope, receive, send)
            return
        written = False

        async def audited_send(message: Message) -> None:
            nonlocal written
            if message["type"] == "http.response.start" and not written:
                written = True
                if not scope.get("state", {}).get("audited"):  # else the route wrote it with its change
                    await self._write(scope, int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, audited_send)
        except Exception:
            if not written and not scope.get("state", {}).get("audited"):
                await self._write(scope, 500)
            raise

    async def _write(self, scope: Scope, status: int) -> None:
        app = scope.get("app")
        rt = getattr(getattr(app, "state", None), "runtime", None)
        if rt is None:
            log.error("audit: no runtime to record %s %s", scope["method"], scope["path"])
            return
        try:
            await run_in_threadpool(record, rt.engine, _entry(scope, status, rt.clock()))
        except SQLAlchemyError as exc:
            log.error("audit: could not record %s %s (%s): %s", scope["method"], scope["path"], status, exc)


def list_audit(engine: Engine, tenant: str, *, cursor: str | None, limit: int) -> tuple[list[AuditEntry], str | None]:
    """A tenant's audit entries, newest first; the cursor of the next page (None at the end)."""
    query = select(AuditEntry).where(AuditEntry.tenant == tenant)
    if cursor is not None:
        if not cursor.isdigit() or len(cursor) > 18:
            raise Unprocessable("cursor", "not a cursor from a previous page")
        query = query.where(col(AuditEntry.id) < int(cursor))
    with Session(engine) as session:
        rows = list(session.exec(query.order_by(col(AuditEntry.id).desc()).limit(limit + 1)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (str(rows[-1].id) if more and rows else None)
