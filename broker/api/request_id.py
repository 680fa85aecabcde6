"""Request ids: every HTTP request gets one, logs carry it, the response returns it in `X-Request-ID`.

Contract: a client's own `X-Request-ID` is kept when it is sane (1-128 characters of `A-Za-z0-9._:-`), so a
caller can follow its request through the broker's logs; anything else (a newline included) is replaced by a fresh
`req-<uuid>`. The audit log stores this sanitised id, never the raw header.
The id is bound in the log context (`broker.observe.logging_setup.log_context`) for the whole request, and a job
submitted
by the request keeps it (`job.request_id`), so the control loop's records about that job carry it too. One
`http request` record per request logs method, route, status and duration (INFO, logger `broker.access`).
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.observe.logging_setup import log_context

HEADER = "X-Request-ID"
_SANE = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
access_log = logging.getLogger("broker.access")


def new_request_id(prefix: str = "req") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def accepted_request_id(value: str | None) -> str:
    """The client's id if it is sane, else a new one."""
    return value if value is not None and _SANE.fullmatch(value) else new_request_id()


class RequestIdMiddleware:
    """Pure ASGI middleware: binds the request id, returns it as a header, writes the access record."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        request_id = accepted_request_id(incoming.decode("latin-1") if incoming is not None else None)
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        with log_context(request_id=request_id):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                if access_log.isEnabledFor(logging.INFO):
                    route = scope.get("route")
                    access_log.info(
                        "http request",
                        extra={
                            "method": scope["method"],
                            "path": getattr(route, "path", scope["path"]),
                            "status": status,
                            "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                        },
                    )
