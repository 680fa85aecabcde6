"""The FastAPI application: `create_app(settings | runtime)` builds it; nothing is built at import time.

Errors come back as RFC 9457 problem details (broker/api/problems.py) naming each field at fault and where it
was sent; a request without a valid credential gets its 401 before its body is looked at. Bodies over
`max_request_bytes` get 413; a key over its rate limit gets 429 with `Retry-After` (broker/api/ratelimit.py); every
state-changing request is audited (broker/api/audit.py). The OpenAPI document and `/docs`: broker/api/docs.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm.exc import StaleDataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.api.audit import AuditLog
from broker.api.deps import HashGate
from broker.api.docs import mount_docs, openapi_document
from broker.api.follows import FollowSlots
from broker.api.http_errors import authentication_first, field_error, http_problem, locate, problem_response
from broker.api.problems import PROBLEM_MEDIA_TYPE, FieldError, Problem, problem, problem_bytes
from broker.api.ratelimit import RateLimit, SharedBuckets
from broker.api.request_id import RequestIdMiddleware
from broker.api.routes import (
    attempts,
    audit,
    budgets,
    catalog,
    costs,
    health,
    jobs,
    keys,
    logs,
    metrics,
    placements,
    reports,
    whoami,
)
from broker.config.settings import Settings
from broker.console import router as console_router
from broker.observe.logging_setup import configure_logging
from broker.runtime import Runtime, build_runtime
from broker.services.errors import BrokerError, Conflict
from broker.store.db_async import AsyncPgPool

log = logging.getLogger(__name__)


class BodySizeLimit:
    """Pure ASGI middleware: 413 for a declared Content-Length over the limit, and for a chunked body once it
    grows past it (cheaper per request than Starlette's BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_bytes:
                    await self._reject(send)
                    return
                break
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = problem_bytes(413, f"body: request body over {self.max_bytes} bytes")
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(HTTPException):
    """Raised from inside body reading; FastAPI lets HTTPExceptions through its body parser as they are."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"body: request body over {max_bytes} bytes")


_ERRORS = {
    400: "bad request",
    401: "missing or invalid API key",
    403: "the key's role may not do this",
    404: "no such resource in your tenant",
    409: "conflicts with the resource's state",
    413: "request body too large",
    422: "a field is invalid (each one named in `errors`)",
    429: "rate limit exceeded (see Retry-After)",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": text} for code, text in _ERRORS.items()
}


def rate_limit_store(settings: Settings, *, several_processes: bool = False) -> str:
    """Where the per-key buckets live: `settings.rate_limit_store`, or for `auto` the database ("shared") on
    PostgreSQL (replicas) or when `several_processes` serve one database, else this process ("local": a single
    process on SQLite, where a database write per request would buy nothing)."""
    if settings.rate_limit_store != "auto":
        return settings.rate_limit_store
    postgres = settings.resolved_database_url.startswith("postgresql")
    return "shared" if postgres or several_processes else "local"


def create_app(
    settings: Settings | None = None,
    *,
    runtime: Runtime | None = None,
    loop: bool = False,
    several_processes: bool = False,
) -> FastAPI:
    """Build the app. With `loop=True` the control loop ticks every `tick_interval_seconds` in a thread.

    `several_processes`: other API processes serve the same database (uvicorn workers), so the `auto` rate-limit
    store is the shared one even on SQLite."""
    stop = threading.Event()
    config = runtime.settings if runtime is not None else (settings or Settings())
    shared_buckets: SharedBuckets | None = None  # closed with the app

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = runtime or build_runtime(config)
        app.state.runtime = rt
        # POST /v1/jobs writes through its own asynchronous connections on PostgreSQL (broker/store/db_async.py);
        # without a lifespan (a test client used without `with`) it falls back to the engine in a worker thread
        job_pool = app.state.job_pool = AsyncPgPool.for_engine(rt.engine)
        worker = None
        if loop:
            from broker.loop.runner import run_forever

            worker = threading.Thread(target=run_forever, args=(rt, stop), name="overspill-tick", daemon=True)
            worker.start()
        yield
        stop.set()
        if worker is not None:
            worker.join(timeout=30)
        if shared_buckets is not None:
            await shared_buckets.aclose()
        if job_pool is not None:
            app.state.job_pool = None
            await job_pool.aclose()

    app = FastAPI(
        title="Overspill",
        docs_url=None,  # served from the package, offline (broker/api/docs.py)
        redoc_url=None,
        version="0.1.0",
        summary="Burst GPU training jobs from on-prem queues to the cheapest suitable cloud pool, "
        "within the cost ceiling each job was given.",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    if runtime is not None:
        app.state.runtime = runtime
    app.state.hash_gate = HashGate(config.key_hash_concurrency)  # slow hashes of unverified keys (broker/api/deps.py)
    # followed logs held open, capped per tenant and per process (broker/api/follows.py)
    app.state.log_follows = FollowSlots(config.log_follow_max_per_tenant, config.log_follow_max_per_process)
    max_bytes = config.max_request_bytes

    app.add_middleware(BodySizeLimit, max_bytes=max_bytes)
    app.add_middleware(AuditLog)
    if config.rate_limit_per_second > 0:  # a flood is refused before anything else is paid for

        def verified(scope: Scope, key: str) -> bool:
            rt = getattr(scope["app"].state, "runtime", None)
            return rt is not None and rt.verifier.cached(key) is not None

        def tenant_of(scope: Scope, key: str) -> str | None:
            rt = getattr(scope["app"].state, "runtime", None)
            principal = rt.verifier.cached(key) if rt is not None else None
            return principal.tenant if principal is not None else None

        if rate_limit_store(config, several_processes=several_processes) == "shared":
            shared_buckets = SharedBuckets.open(
                config.resolved_database_url, config.rate_limit_per_second, config.rate_limit_burst
            )
        app.add_middleware(
            RateLimit,
            rate=config.rate_limit_per_second,
            burst=config.rate_limit_burst,
            unverified_rate=config.rate_limit_unverified_per_second,
            unverified_burst=config.rate_limit_unverified_burst,
            is_verified=verified,
            tenant_of=tenant_of,
            tenant_rate=config.rate_limit_tenant_per_second,
            tenant_burst=config.rate_limit_tenant_burst,
            shared=shared_buckets,
        )
    app.add_middleware(RequestIdMiddleware)  # outermost: every response, a 413 or 429 included, carries X-Request-ID

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        refused = await authentication_first(request)  # no or a bad credential: 401/403, whatever the body
        if refused is not None:
            return refused
        errors = [field_error(e, exc.body) for e in exc.errors()]
        detail = "; ".join(f"{e.field}: {e.message}" for e in errors) or "invalid request"
        return problem_response(problem(422, detail, errors))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return http_problem(request, exc)

    @app.exception_handler(StaleDataError)
    async def state_raced(request: Request, exc: StaleDataError) -> Response:
        # a conditional write (broker/store/tables.py) found the job or placement in another state than it read
        return await broker_error(
            request, Conflict("state", "the job changed state while this request was applied; read it and retry")
        )

    @app.exception_handler(BrokerError)
    async def broker_error(request: Request, exc: BrokerError) -> Response:
        error = FieldError(
            field=exc.field,
            location=locate(request, exc.field, exc.status_code),
            message=exc.message,
            type=type(exc).__name__,
        )
        return problem_response(problem(exc.status_code, f"{exc.field}: {exc.message}", [error]))

    mount_docs(app)
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
    for router in (
        jobs.router,
        logs.router,
        attempts.router,
        catalog.router,
        keys.router,
        placements.router,
        health.router,
        audit.router,
        costs.router,
        budgets.router,
        reports.schedules,
        reports.runs,
        whoami.router,
        metrics.router,
        console_router.router,
    ):
        app.include_router(router)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        """A browser opening the broker's address lands on the console (the API lives under /v1, docs at /docs)."""
        return RedirectResponse("/console/", status_code=307)

    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory broker.app:app_from_env` (several worker processes, API only).

    Run the control loop separately (`overspill tick --loop`) when serving this way. The workers share one
    rate-limit bucket per key through the database (unless `OVERSPILL_RATE_LIMIT_STORE=local`). uvicorn's own
    proxy settings apply here, and by default they trust `X-Forwarded-For` from 127.0.0.1: pass
    `--no-proxy-headers`, or `--forwarded-allow-ips` naming your proxy (`overspill serve` does this from
    `OVERSPILL_FORWARDED_ALLOW_IPS`).
    """
    settings = Settings()
    configure_logging(settings)
    return create_app(settings, several_processes=True)
