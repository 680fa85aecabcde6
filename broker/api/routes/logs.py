"""GET /v1/jobs/{id}/logs: a job's output, read from the log chunks its instance agent stored (see
broker.services.job_logs), while the attempt runs and after its instance is gone.

Query: `attempt` (a placement id of the job; default its latest attempt), `offset` (the byte to start at), `tail`
(start at most this many bytes before the end: the console's log tail), `follow` (true: stream the log as it grows
until the attempt ends). The answer is the log's bytes as text/plain, with
`X-Overspill-Attempt` (the placement read), `X-Overspill-Next-Offset` (where to read on from) and
`X-Overspill-Attempt-Ended` (true once the attempt is over: nothing more will come). A job none of whose attempts
has run on an agent yet (or ever will: simulated clouds, Slurm) answers an empty log without `X-Overspill-Attempt`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status
from fastapi.responses import StreamingResponse
from sqlmodel import Session

from broker.api.deps import RuntimeDep, Submitter
from broker.services import job_logs
from broker.services.agent_reports import LIVE
from broker.services.job_attempts import placement_of_attempt
from broker.store.tables import Placement
from providers.storage import StorageError

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

TEXT = "text/plain; charset=utf-8"
FOLLOW_POLL_SECONDS = 1.0  # how often a followed log is read again while its attempt runs


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
def job_logs_route(
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
    attempt = placement_of_attempt(rt.engine, principal.tenant, job_id, attempt)  # a number: the Nth attempt
    p, ended = job_logs.attempt_of(rt.engine, principal.tenant, job_id, attempt)
    if p is None or p.attempt_uri is None:  # no attempt has run on an agent yet: nothing logged
        return Response(b"", media_type=TEXT, headers={"X-Overspill-Next-Offset": str(offset)})
    uri = p.attempt_uri

    def read(at: int) -> tuple[bytes, int]:
        return job_logs.read_log(rt.checkpoint_stores, uri, at)

    headers = {"X-Overspill-Attempt": p.id}
    if tail is not None:
        try:
            offset = max(offset, job_logs.log_size(rt.checkpoint_stores, uri) - tail)
        except StorageError as exc:
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE, f"reading the log at {uri}logs/ failed: {exc}"
            ) from None
    if follow:

        def over() -> bool:
            with Session(rt.engine) as session:
                row = session.get(Placement, p.id)
            return row is None or row.state not in LIVE

        stream = job_logs.follow_log(read, over, offset, poll_seconds=FOLLOW_POLL_SECONDS)
        return StreamingResponse(stream, media_type=TEXT, headers=headers)
    try:
        data, next_offset = read(offset)
    except StorageError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"reading the log at {uri}logs/ failed: {exc}"
        ) from None
    headers |= {"X-Overspill-Next-Offset": str(next_offset), "X-Overspill-Attempt-Ended": str(ended).lower()}
    return Response(data, media_type=TEXT, headers=headers)
