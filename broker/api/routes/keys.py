"""/v1/keys: admins create, list and revoke the API keys of their own tenant.

- `POST /v1/keys` creates one (the key is shown once).
- `GET /v1/keys` lists the tenant's keys, revoked ones included: id, name, role, created_at, revoked_at (never the
  key or its hash).
- `DELETE /v1/keys/{key_id}` revokes one (idempotent; answers the key as it now is). Another tenant's key id is a
  404. The revocation holds at once for state-changing requests in every API process and replica, and for reads
  within one second (broker/api/auth.py); the process that revoked it forgets it at once.
Every call is audited (broker/api/audit.py).
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, HTTPException, Path, status
from pydantic import BaseModel

from broker.api.auth import Role, TooManyKeys, create_key, list_keys, parse_key, revoke_key
from broker.api.deps import Admin, RuntimeDep
from broker.api.schemas import KeyCreate, KeyCreated, Page
from broker.services.errors import NotFoundError
from broker.store.tables import ApiKey

router = APIRouter(prefix="/v1/keys", tags=["keys"])


class KeyPublic(BaseModel):
    id: str
    tenant: str
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None


class KeyPage(Page[KeyPublic]):
    pass


def _public(row: ApiKey) -> KeyPublic:
    return KeyPublic(
        id=row.id, tenant=row.tenant, name=row.name, role=row.role, created_at=row.created_at, revoked_at=row.revoked_at
    )


@router.post("", operation_id="keys.create", status_code=status.HTTP_201_CREATED, response_model=KeyCreated)
def make_key(body: KeyCreate, rt: RuntimeDep, principal: Admin) -> KeyCreated:
    """A new key of the tenant; 409 once the tenant holds `max_keys_per_tenant` active keys (each key is its own
    rate-limit bucket, so keys without limit would multiply the per-key limit; the tenant's own limit holds anyway)."""
    try:
        key = create_key(
            rt.engine,
            tenant=principal.tenant,
            role=Role(body.role),
            name=body.name,
            now=rt.clock(),
            max_active=rt.settings.max_keys_per_tenant,
        )
    except TooManyKeys as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    return KeyCreated(id=parse_key(key)[0], tenant=principal.tenant, role=body.role, name=body.name, key=key)


@router.get("", operation_id="keys.list", response_model=KeyPage)
def read_keys(rt: RuntimeDep, principal: Admin) -> KeyPage:
    """The tenant's keys, oldest first, revoked ones included."""
    return KeyPage(items=[_public(row) for row in list_keys(rt.engine, principal.tenant)])


@router.delete("/{key_id}", operation_id="keys.revoke", response_model=KeyPublic)
def delete_key(
    rt: RuntimeDep, principal: Admin, key_id: str = Path(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9.:~-]+$")
) -> KeyPublic:
    """Revoke a key of the tenant (it may be the caller's own)."""
    row = revoke_key(rt.engine, principal.tenant, key_id, rt.clock())
    if row is None:
        raise NotFoundError("key", key_id)
    rt.verifier.forget(key_id)
    return _public(row)
