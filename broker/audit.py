"""Audit log of every state-changing API request: who (key id, tenant, role), what (method, path, route, status),
when, and from where (client address, request id).

Role: `AuditLog` is pure ASGI middleware. For every POST, PUT, PATCH and DELETE it writes one `audit_log` row
when the response starts, before the client sees it, so a client that got an answer was audited; refused ones
(401, 403, 413, 422...) are recorded too. The caller comes from `request.state.principal`, which
`broker.deps.get_principal` sets once a key is verified; for an unverified request the presented key's id (the
public `ovs_<id>_` part) is recorded with an empty role; an instance's callback (no API key: a per-placement
token) is filed under the placement's tenant with role `instance` once the route set
`request.state.audit_tenant`. A route may add what it did to `detail` by setting `request.state.audit_detail`
(the corrections route records the entry, amount, job and note). Never recorded: the body (beyond such a
detail), the key's secret, any header but `X-Request-ID`. The
client address is the socket peer (uvicorn's `--forwarded-allow-ips` makes it the forwarded one behind a trusted
proxy). If the row cannot be written the failure is logged and the answer still goes out (the change it reports
may already be committed).

`list_audit` reads a tenant's entries, newest first, with an opaque cursor.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.auth import InvalidKey, Principal, parse_key
from broker.errors import Unprocessable
from broker.ratelimit import presented_key
from broker.tables import ApiKey, AuditEntry

log = logging.getLogger(__name__)

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _entry(scope: Scope, status: int, now: datetime) -> AuditEntry:
    state = scope.get("state", {})
    principal = state.get("principal")
    if isinstance(principal, Principal):
        tenant, key_id, role = principal.tenant, principal.key_id, principal.role.value
    elif "audit_tenant" in state:  # an instance's callback, proven by its placement token
        tenant, key_id, role = str(state["audit_tenant"]), "", "instance"
    else:
        tenant, role = "", ""
        try:
            key = presented_key(scope)
            key_id = parse_key(key)[0][:32] if key else ""
        except InvalidKey:
            key_id = ""
    route = scope.get("route")
    request_id = ""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            request_id = value.decode("latin-1")[:128]
    client = scope.get("client")
    return AuditEntry(
        at=now,
        tenant=tenant,
        key_id=key_id,
        role=role,
        method=scope["method"][:8],
        path=scope["path"][:500],
        route=str(getattr(route, "path", ""))[:200],
        status=status,
        client=(client[0] if client else "")[:100],
        request_id=request_id,
        detail=str(state.get("audit_detail", ""))[:500],
    )


def record(engine: Engine, entry: AuditEntry) -> None:
    """Store one entry. A refused key that names a real key id is filed under that key's tenant (its admins
    should see someone trying it), still with no role: it was not verified."""
    with Session(engine) as session:
        if not entry.tenant and entry.key_id:
            owner = session.get(ApiKey, entry.key_id)
            if owner is not None:
                entry.tenant = owner.tenant
        session.add(entry)
        session.commit()


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
                await self._write(scope, int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, audited_send)
        except Exception:
            if not written:
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
