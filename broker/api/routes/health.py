"""/healthz (the process is up) and /readyz (database reachable, price data fresh).

`/readyz` answers everyone with the verdict and a coarse status per component: `status` ("ready" or "not
ready"), `database` ("ok" or "unreachable") and `prices` ("fresh", "stale", or that no price data exists yet).
A valid API key of any role also gets `feeds`: each feed's age, freshness and whether it is failing (what
`/v1/pools` already tells it, per pool; the console shows it). The error detail (each feed's `last_error` text,
the database error's type) is only for the operator's metrics token (`Authorization: Bearer
<OVERSPILL_METRICS_TOKEN>`) or an admin key: error text can name internal hosts and accounts. A missing or invalid
credential is not an error here (probes send none): it gets the coarse answer.
"""

from __future__ import annotations

import hmac
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request, Response, status
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, select
from starlette.concurrency import run_in_threadpool

from broker.api.auth import Role
from broker.api.deps import RuntimeDep, authenticate, request_key
from broker.runtime import Runtime
from broker.store.tables import FeedStatus

router = APIRouter(tags=["health"])


class Liveness(BaseModel):
    status: Literal["ok"]


class FeedHealth(BaseModel):
    age_seconds: float | None = Field(description="since the feed's last successful refresh")
    fresh: bool
    failing: bool = Field(description="its latest refresh failed")
    last_error: str | None = Field(default=None, description="only for the metrics token or an admin key")


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    database: str = Field(description='"ok" or "unreachable"')
    prices: str = Field(description='"fresh", "stale", or that no price data exists yet')
    database_error: str | None = Field(default=None, description="only for the metrics token or an admin key")
    feeds: dict[str, FeedHealth] | None = Field(default=None, description="for any valid credential")


@router.get("/healthz", operation_id="health.live", response_model=Liveness)
async def healthz() -> dict[str, str]:
    """The process is up: answered on the event loop, touching no thread, database or store, so it answers
    whatever holds the worker threads."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    operation_id="health.ready",
    response_model=Readiness,
    response_model_exclude_unset=True,
    responses={503: {"model": Readiness, "description": "not ready (the same body)"}},
    openapi_extra={"security": [{}, {"BearerAuth": []}, {"ApiKeyAuth": []}, {"MetricsToken": []}]},
)
async def readyz(request: Request, rt: RuntimeDep, response: Response) -> dict[str, Any]:
    """503 unless the database answers and every live feed succeeded within the staleness limit.

    A feed whose latest refresh failed is reported `failing` (its last good prices stay in use, marked stale in
    `/v1/pools`); readiness drops only once its last success is older than the limit. Feed detail needs the
    metrics token or an admin key."""
    ready, coarse, detail = await run_in_threadpool(_readiness, rt)
    if not ready:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    answer = {"status": "ready" if ready else "not ready", **coarse}
    level = await _detail_level(request, rt)
    if level == "errors":
        return {**answer, **detail}
    if level == "feeds":
        feeds = {name: {k: v for k, v in f.items() if k != "last_error"} for name, f in detail["feeds"].items()}
        return {**answer, "feeds": feeds}
    return answer


async def _detail_level(request: Request, rt: Runtime) -> str:
    """ "errors" for the metrics token or an admin key, "feeds" for any other valid key, "" otherwise."""
    key = request_key(request)
    if not key:
        return ""
    token = rt.settings.metrics_token
    if token and hmac.compare_digest(key.encode(), token.encode()):
        return "errors"
    try:
        principal = await authenticate(request, rt, key)
    except HTTPException:  # invalid key, or too many being checked: the coarse answer, as for no key
        return ""
    return "errors" if principal.role is Role.ADMIN else "feeds"


def _readiness(rt: Runtime) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """(ready, the coarse status per component, the detail)."""
    now = rt.clock()
    coarse: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    ready = True
    try:
        with Session(rt.engine) as session:
            session.exec(text("SELECT 1"))  # type: ignore[call-overload]
            feeds = session.exec(select(FeedStatus)).all()
        coarse["database"] = "ok"
    except SQLAlchemyError as exc:
        coarse["database"] = "unreachable"
        detail["database_error"] = type(exc).__name__
        feeds = []
        ready = False
    feed_report = {}
    prices_fresh = True
    limit = rt.settings.price_stale_after_seconds
    for f in feeds:
        if f.name.startswith("catalog:"):
            continue  # imported catalogs are static snapshots, not live feeds
        age = (now - f.last_success_at).total_seconds() if f.last_success_at else None
        failed_since = f.last_error_at is not None and (
            f.last_success_at is None or f.last_error_at > f.last_success_at
        )
        fresh = age is not None and age <= limit
        prices_fresh = prices_fresh and fresh
        feed_report[f.name] = {
            "age_seconds": round(age, 1) if age is not None else None,
            "fresh": fresh,
            "failing": failed_since,
            "last_error": f.last_error or None,
        }
    ready = ready and prices_fresh
    coarse["prices"] = "fresh" if prices_fresh else "stale"
    if rt.offering_sources and not feeds:
        ready = False
        coarse["prices"] = "no price data yet (the first tick has not run)"
    detail["feeds"] = feed_report
    return ready, coarse, detail
