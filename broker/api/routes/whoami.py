"""GET /v1/whoami: who the presented API key is (tenant, role, key id), so clients such as the web console can
adapt to the caller's role. Any valid key may ask; it reveals nothing beyond the key's own identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from broker.api.auth import Principal
from broker.api.deps import get_principal

router = APIRouter(prefix="/v1", tags=["keys"])


class WhoAmI(BaseModel):
    key_id: str
    tenant: str
    role: str


@router.get("/whoami", operation_id="keys.whoami", response_model=WhoAmI)
async def whoami(principal: Annotated[Principal, Depends(get_principal)]) -> WhoAmI:
    return WhoAmI(key_id=principal.key_id, tenant=principal.tenant, role=principal.role.value)
