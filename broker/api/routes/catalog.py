"""/v1/quotes, /v1/pools and /v1/pressure: what running a job would cost where, and the live market."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from broker.api.deps import Reader, RuntimeDep, Submitter
from broker.api.schemas import JobCreate, PoolPage, PressurePage, PricePage, QuoteResponse, aware_utc
from broker.services import catalog_view as svc
from broker.services.errors import Unprocessable
from providers.accelerators import canonical
from providers.model import CapacityType

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.post("/quotes", operation_id="quotes.create", response_model=QuoteResponse)
def quote(
    body: JobCreate,
    rt: RuntimeDep,
    principal: Submitter,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 50,
) -> QuoteResponse:
    """Ranked suitable pools with expected cost and finish time, and why every other pool was rejected."""
    return svc.quote_job(rt, principal.tenant, body, limit)


@router.get("/pools", operation_id="pools.list", response_model=PoolPage)
def pools(
    rt: RuntimeDep,
    principal: Reader,
    accelerator: Annotated[str | None, Query(max_length=32)] = None,
    provider: Annotated[str | None, Query(max_length=64)] = None,
    capacity_type: CapacityType | None = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> PoolPage:
    """Every pool (up to `limit`) with its current price, where the price came from and how fresh it is."""
    pools = svc.list_pools(
        rt,
        accelerator=canonical(accelerator) if accelerator else None,
        provider=provider,
        capacity_type=capacity_type.value if capacity_type else None,
        limit=limit,
    )
    return PoolPage(items=pools)


@router.get("/prices/history", operation_id="prices.history", response_model=PricePage)
def prices_history(
    rt: RuntimeDep,
    principal: Reader,
    offering: Annotated[str, Query(min_length=1, max_length=200, description="pool key, as in GET /v1/pools")],
    start: Annotated[datetime | None, Query(alias="from", description="inclusive, ISO 8601 with zone")] = None,
    end: Annotated[datetime | None, Query(alias="to", description="exclusive, ISO 8601 with zone")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> PricePage:
    """Every change of one pool's price (not every sample), oldest first, up to `limit`."""
    try:
        start = aware_utc(start)
    except ValueError as exc:
        raise Unprocessable("from", str(exc)) from None
    try:
        end = aware_utc(end)
    except ValueError as exc:
        raise Unprocessable("to", str(exc)) from None
    if start is not None and end is not None and end <= start:
        raise Unprocessable("to", "must be after from")
    return PricePage(items=svc.price_history(rt, offering, start, end, limit))


@router.get("/pressure", operation_id="pressure.list", response_model=PressurePage)
def pressure(rt: RuntimeDep, principal: Reader) -> PressurePage:
    """On-prem queue pressure per GPU type, as last sampled."""
    return PressurePage(items=svc.list_pressure(rt))
