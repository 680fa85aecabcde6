"""/healthz (the process is up) and /readyz (database reachable, price data fresh)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, select

from broker.deps import RuntimeDep
from broker.tables import FeedStatus

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(rt: RuntimeDep, response: Response) -> dict[str, Any]:
    """503 unless the database answers and every live feed succeeded within the staleness limit.

    A feed whose latest refresh failed is reported `failing` (its last good prices stay in use, marked stale in
    `/v1/pools`); readiness drops only once its last success is older than the limit."""
    now = rt.clock()
    checks: dict[str, Any] = {}
    ready = True
    try:
        with Session(rt.engine) as session:
            session.exec(text("SELECT 1"))  # type: ignore[call-overload]
            feeds = session.exec(select(FeedStatus)).all()
        checks["database"] = "ok"
    except SQLAlchemyError as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
        feeds = []
        ready = False
    feed_report = {}
    limit = rt.settings.price_stale_after_seconds
    for f in feeds:
        if f.name.startswith("catalog:"):
            continue  # imported catalogs are static snapshots, not live feeds
        age = (now - f.last_success_at).total_seconds() if f.last_success_at else None
        failed_since = f.last_error_at is not None and (
            f.last_success_at is None or f.last_error_at > f.last_success_at
        )
        fresh = age is not None and age <= limit
        ready = ready and fresh
        feed_report[f.name] = {
            "age_seconds": round(age, 1) if age is not None else None,
            "fresh": fresh,
            "failing": failed_since,
            "last_error": f.last_error or None,
        }
    if rt.offering_sources and not feeds:
        ready = False
        checks["prices"] = "no price data yet (the first tick has not run)"
    checks["feeds"] = feed_report
    if not ready:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return {"status": "ready" if ready else "not ready", **checks}
