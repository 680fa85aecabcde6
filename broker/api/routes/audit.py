"""/v1/audit: the audit log of state-changing requests in the caller's tenant (admins only), newest first."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from broker.api.audit import list_audit
from broker.api.deps import Admin, RuntimeDep

router = APIRouter(prefix="/v1/audit", tags=["audit"])


class AuditPublic(BaseModel):
    id: int
    at: datetime
    key_id: str
    role: str
    method: str
    path: str
    route: str
    status: int
    client: str
    request_id: str
    detail: str


class AuditPage(BaseModel):
    items: list[AuditPublic]
    next_cursor: str | None


@router.get("", operation_id="audit.list", response_model=AuditPage)
def read_audit(
    rt: RuntimeDep,
    principal: Admin,
    cursor: Annotated[str | None, Query(max_length=20, description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """Who changed what, when and from where: every POST, PUT, PATCH and DELETE, refused ones included."""
    rows, next_cursor = list_audit(rt.engine, principal.tenant, cursor=cursor, limit=limit)
    items = [
        AuditPublic(
            id=r.id or 0,
            at=r.at,
            key_id=r.key_id,
            role=r.role,
            method=r.method,
            path=r.path,
            route=r.route,
            status=r.status,
            client=r.client,
            request_id=r.request_id,
            detail=r.detail,
        )
        for r in rows
    ]
    return AuditPage(items=items, next_cursor=next_cursor)
