"""GET /v1/jobs/{id}/logs: a job's output, read from the log chunks its instance agent stored (see
broker.services.job_logs), while the attempt runs and after its instance is gone.

Query: `attempt` (a placement id of the job; default its latest attempt), `offset` (the byte to start at), `tail`
(start at most this many bytes before the end: the console's log tail), `follow` (true: stream the log as it grows
until the attempt ends). The answer is the log's bytes as text/plain, with
`X-Overspill-Attempt` (the placement read), `X-Overspill-Next-Offset` (where to read on from) and
`X-Overspill-Attempt-Ended` (true once the attempt is over: nothing more will come). A job none of whose attempts
has run on an agent yet (or ever will: simulated clouds, Slurm) answers an empty log without `X-Overspill-Attempt`.

A followed log is streamed by an async generator on the event loop (broker.services.job_logs.follow_log): it holds
no worker thread while the log is idle, its reads run on a thread pool of their own (`log_follow_threads`), and a
client that disconnects ends it (and frees its slot) at once. A tenant may follow `log_follow_max_per_tenant` logs
at once per API process, the process `log_follow_max_per_process`; beyond, 429 with `Retry-After`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from broker.api.deps import RuntimeDep, Submitter
from broker.api.follows import FollowsFull, FollowSlots, Slot
from broker.runtime import Runtime
from broker.services import job_logs
from broker.services.job_attempts import placement_of_attempt
from providers.storage import StorageError

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

TEXT = "text/plain; charset=utf-8"
FOLLOW_POLL_SECONDS = 1.0  # how soon a followed log is read again after a read that found nothing
FOLLOW_MAX_POLL_SECONDS = 5.0  # ... doubling while it stays idle, up to this
FOLLOW_RETRY_AFTER = "5"  # seconds, on a 429 for too many followed logs


class HeldStream(StreamingResponse):
    """A streamed answer that gives its follow slot back however the stream ends (done, client gone, cancelled by
    shutdown, or the first send failing before the generator ever ran)."""

    def __init__(self, content: AsyncIterator[bytes], slot: Slot, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


@router.get(
    "/{job_id}/logs",
    operation_id="jobs.logs",
    response_class=Response,
    responses={
        200: {
            "content": {TEXT: {"schema": {"type": "string"}}},
            "description": "the log's bytes from `offset`",
            "headers": {
                "X-Overspill-Attempt": {"schema": {"type": "string"}, "description": "the placement read"},
                "X-Overspill-Next-Offset": {"schema": {"type": "integer"}, "description": "where to read on"},
                "X-Overspill-Attempt-Ended": {"schema": {"type": "string"}, "description": "`true` once it ended"},
            },
        }
    },
)
async def job_logs_route(
    request: Request,
    job_id: str,
    rt: RuntimeDep,
    principal: Submitter,
    attempt: Annotated[
        str | None,
        Query(max_length=40, description="an attempt number (1 = the first) or placement id (default: the latest)"),
    ] = None,
    offset: Annotated[int, Query(ge=0, le=2**53, description="the byte of the log to start at")] = 0,
    follow: Annotated[bool, Query(description="stream the log as it grows until the attempt ends")] = False,
    tail: Annotated[
        int | None, Query(ge=1, le=job_logs.READ_LIMIT, description="start at most this many bytes before the end")
    ] = None,
) -> Response:
    """The job's output (stdout and stderr, merged in arrival order) from `offset`."""
    attempt = await run_in_threadpool(placement_of_attempt, rt.engine, principal.tenant, job_id, attempt)
    p, ended = await run_in_threadpool(job_logs.attempt_of, rt.engine, principal.tenant, job_id, attempt)
    if p is None or p.attempt_uri is None:  # no attempt has run on an agent yet: nothing logged
        return Response(b"", media_type=TEXT, headers={"X-Overspill-Next-Offset": str(offset)})
    uri, placement_id = p.attempt_uri, p.id
    stores = rt.checkpoint_stores
    headers = {"X-Overspill-Attempt": placement_id}
    try:
        if tail is not None:
            offset = max(offset, await run_in_threadpool(job_logs.log_size, stores, uri) - tail)
        if not follow:
            data, next_offset = await run_in_threadpool(job_logs.read_log, stores, uri, offset)
    except StorageError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"reading the log at {uri}logs/ failed: {exc}"
        ) from None
    if not follow:
        headers |= {"X-Overspill-Next-Offset": str(next_offset), "X-Overspill-Attempt-Ended": str(ended).lower()}
        return Response(data, media_type=TEXT, headers=headers)

    follows: FollowSlots = request.app.state.log_follows
    try:
        slot = follows.acquire(principal.tenant)
    except FollowsFull as exc:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS, str(exc), headers={"Retry-After": FOLLOW_RETRY_AFTER}
        ) from None
    watch = log_watch(request, rt)

    async def poll(at: int) -> tuple[bytes, int, bool]:
        return await watch.poll(placement_id, uri, at)

    stream = job_logs.follow_log(
        poll,
        offset,
        disconnected=request.is_disconnected,
        poll_seconds=FOLLOW_POLL_SECONDS,
        max_poll_seconds=max(FOLLOW_POLL_SECONDS, FOLLOW_MAX_POLL_SECONDS),
    )
    return HeldStream(stream, slot, media_type=TEXT, headers=headers)


def log_watch(request: Request, rt: Runtime) -> job_logs.LogWatch:
    """The app's shared view of followed attempts (made on first use, on the running event loop), reading on a
    thread pool of its own (`log_follow_threads`): however many logs are followed, their reads never take the
    worker threads other requests run on, and the followers of one attempt share one look per poll interval."""
    watch: job_logs.LogWatch | None = getattr(request.app.state, "log_watch", None)
    if watch is None:
        limiter = anyio.CapacityLimiter(rt.settings.log_follow_threads)
        watch = job_logs.LogWatch(rt.engine, rt.checkpoint_stores, limiter, fresh_seconds=FOLLOW_POLL_SECONDS)
        request.app.state.log_watch = watch
    return watch
