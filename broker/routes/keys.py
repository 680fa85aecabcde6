"""/v1/keys: admins create API keys for their own tenant (the key is shown once)."""

from __future__ import annotations

from fastapi import APIRouter, status

from broker.auth import Role, create_key, parse_key
from broker.deps import Admin, RuntimeDep
from broker.schemas import KeyCreate, KeyCreated

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyCreated)
def make_key(body: KeyCreate, rt: RuntimeDep, principal: Admin) -> KeyCreated:
    key = create_key(rt.engine, tenant=principal.tenant, role=Role(body.role), name=body.name, now=rt.clock())
    return KeyCreated(id=parse_key(key)[0], tenant=principal.tenant, role=body.role, name=body.name, key=key)
