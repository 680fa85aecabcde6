"""The FastAPI application: `create_app(settings | runtime)` builds it; nothing is built at import time.

Errors come back as `{"message": "...", "detail": [{"loc": [...], "msg": "..."}]}` with the field named, in the
same shape FastAPI uses for validation errors. Bodies over `max_request_bytes` get 413.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from broker.errors import BrokerError
from broker.routes import catalog, health, jobs, keys
from broker.runtime import Runtime, build_runtime
from broker.settings import Settings

log = logging.getLogger(__name__)


def _field_of(loc: tuple[object, ...] | list[object]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "header", "path")]
    return ".".join(parts) or "body"


def create_app(settings: Settings | None = None, *, runtime: Runtime | None = None, loop: bool = False) -> FastAPI:
    """Build the app. With `loop=True` the control loop ticks every `tick_interval_seconds` in a thread."""
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = runtime or build_runtime(settings or Settings())
        app.state.runtime = rt
        worker = None
        if loop:
            from broker.loop.runner import run_forever

            worker = threading.Thread(target=run_forever, args=(rt, stop), name="overspill-tick", daemon=True)
            worker.start()
        yield
        stop.set()
        if worker is not None:
            worker.join(timeout=30)

    app = FastAPI(
        title="Overspill",
        version="0.1.0",
        summary="Burst GPU training jobs from on-prem queues to the cheapest suitable cloud pool, "
        "within the cost ceiling each job was given.",
        lifespan=lifespan,
    )
    if runtime is not None:
        app.state.runtime = runtime
    max_bytes = (settings or (runtime.settings if runtime else Settings())).max_request_bytes

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            return JSONResponse(
                {"message": f"body: request body over {max_bytes} bytes", "detail": []},
                status_code=status.HTTP_413_CONTENT_TOO_LARGE,
            )
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        message = "; ".join(f"{_field_of(e['loc'])}: {e['msg']}" for e in errors)
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
        return JSONResponse({"message": message, "detail": detail}, status_code=422)

    @app.exception_handler(BrokerError)
    async def broker_error(_: Request, exc: BrokerError) -> JSONResponse:
        return JSONResponse(
            {
                "message": f"{exc.field}: {exc.message}",
                "detail": [{"loc": ["body", exc.field], "msg": exc.message, "type": type(exc).__name__}],
            },
            status_code=exc.status_code,
        )

    for router in (jobs.router, catalog.router, keys.router, health.router):
        app.include_router(router)
    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory broker.app:app_from_env` (several worker processes, API only).

    Run the control loop separately (`overspill tick --loop`) when serving this way.
    """
    return create_app(Settings())
