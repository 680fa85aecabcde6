"""GET /metrics: the Prometheus text exposition of `broker.observe.metrics` (database state + this process's loop).

Operator-level, since it spans tenants: open by default (scraped on a private network), or protected by
`OVERSPILL_METRICS_TOKEN`, which Prometheus then sends as `Authorization: Bearer <token>`. API keys are not
accepted here: a tenant's admin must not read other tenants' spend.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, HTTPException, Request, Response, status
from prometheus_client import CONTENT_TYPE_LATEST

from broker.api.deps import RuntimeDep

router = APIRouter(tags=["operations"])


@router.get(
    "/metrics",
    operation_id="metrics.get",
    response_class=Response,
    openapi_extra={"security": [{}, {"MetricsToken": []}]},
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}},
)
def metrics(rt: RuntimeDep, request: Request) -> Response:
    """Prometheus text exposition. Operator-level: spans tenants. Needs `Bearer <OVERSPILL_METRICS_TOKEN>` when
    that is set."""
    token = rt.settings.metrics_token
    if token:
        presented = request.headers.get("authorization", "").partition(" ")[2].strip()
        if not hmac.compare_digest(presented.encode(), token.encode()):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "authorization: /metrics needs 'Authorization: Bearer <OVERSPILL_METRICS_TOKEN>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
    rt.metrics.attach_state(rt.engine, rt.clock)
    return Response(rt.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
