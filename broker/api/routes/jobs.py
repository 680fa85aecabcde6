"""/v1/jobs: submit, read, list, update (limits, priority; resumes a paused job), cancel, events."""

from __future__ import annotations

import re
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool

from broker.api.audit import entry_row
from broker.api.auth import InvalidKey
from broker.api.deps import (
    RuntimeDep,
    Submitter,
    SubmitterCheckedInWrite,
    confirm_or_refuse,
    refuse_revoked,
)
from broker.api.schemas import EventPage, JobCreate, JobPage, JobPublic, JobUpdate
from broker.observe.logging_setup import current_context
from broker.runtime import Runtime
from broker.services import jobs as svc
from broker.services.errors import BrokerError, Unprocessable
from broker.services.events import list_events
from broker.store.db_async import AsyncPgPool
from providers.model import JobState

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# OpenAPI links: what a client (or a stateful fuzzer) can do next with the job an answer names
_NEXT = {"GetJob": "jobs.get", "UpdateJob": "jobs.update", "CancelJob": "jobs.cancel", "JobEvents": "jobs.events"}


def _links(status_code: int, description: str) -> dict[int | str, dict[str, Any]]:
    links = {name: {"operationId": op, "parameters": {"job_id": "$response.body#/id"}} for name, op in _NEXT.items()}
    return {status_code: {"description": description, "links": links}}


@router.post(
    "",
    operation_id="jobs.submit",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobPublic,
    responses=_links(202, "the job, queued (the same job again for a repeated `Idempotency-Key`)"),
)
async def submit_job(
    body: JobCreate,
    principal: SubmitterCheckedInWrite,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=128)] = None,
) -> JobPublic:
    """Queue a job. Retrying with the same `Idempotency-Key` returns the same job (never a second one)."""
    # async: the checks never block, and on PostgreSQL the write is awaited on the event loop (one statement: the
    # key's revocation check, the job, its event and its audit row); elsewhere it runs in a worker thread.
    rt: Runtime = request.app.state.runtime
    now = rt.clock()
    options: dict[str, Any] = {
        "tenant": principal.tenant,
        "create": body,
        "idempotency_key": idempotency_key,
        "now": now,
        "request_id": current_context().get("request_id"),
        "checkpoints": rt.checkpoint_stores,
        "settings": rt.settings,
        "audit": entry_row(request.scope, status.HTTP_202_ACCEPTED, now),
        "key_id": principal.key_id,  # the key's revocation is re-read in the job's transaction
    }
    pool: AsyncPgPool | None = getattr(request.app.state, "job_pool", None)
    try:
        if pool is not None:
            public, created = await svc.submit_job_async(pool, rt.engine, rt.catalog, **options)
        else:
            job, created = await run_in_threadpool(partial(svc.submit_job, rt.engine, rt.catalog, **options))
            public = svc.job_public(job, None)
    except InvalidKey:
        raise refuse_revoked(request, rt, principal) from None
    except BrokerError:
        await confirm_or_refuse(request, rt, principal)  # a revoked key is told 401, never how its job fared
        raise
    if created:
        request.state.audited = True  # the audit row committed with the job (broker.api.audit)
    else:
        await confirm_or_refuse(request, rt, principal)  # a replay wrote nothing, so nothing re-read the key
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/jobs/{public.id}"
    return public


@router.get("", operation_id="jobs.list", response_model=JobPage)
def list_jobs(
    rt: RuntimeDep,
    principal: Submitter,
    state: JobState | None = None,
    team: Annotated[str | None, Query(max_length=64)] = None,
    project: Annotated[str | None, Query(max_length=64)] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JobPage:
    return svc.list_jobs(
        rt.engine,
        principal.tenant,
        state=state.value if state else None,
        team=team,
        project=project,
        cursor=cursor,
        limit=limit,
        now=rt.clock(),
    )


@router.get("/{job_id}", operation_id="jobs.get", response_model=JobPublic, responses=_links(200, "the job"))
def get_job(job_id: str, rt: RuntimeDep, principal: Submitter) -> JobPublic:
    job, placement, report = svc.get_job_with_report(rt.engine, principal.tenant, job_id)
    return svc.job_public(job, placement, rt.clock(), report, svc.launch_time_of(rt.engine, placement))


@router.patch(
    "/{job_id}", operation_id="jobs.update", response_model=JobPublic, responses=_links(200, "the job, changed")
)
def update_job(job_id: str, body: JobUpdate, rt: RuntimeDep, principal: Submitter) -> JobPublic:
    """Raise (or lower) a job's ceilings, move its deadline or change its priority. A job paused to honour its
    ceiling goes back to pending and is placed under the new limits."""
    svc.update_job(rt.engine, principal.tenant, job_id, body, rt.clock())
    job, placement = svc.get_job(rt.engine, principal.tenant, job_id)
    return svc.job_public(job, placement, rt.clock())


@router.post("/{job_id}/cancel", operation_id="jobs.cancel", response_model=JobPublic)
def cancel_job(job_id: str, rt: RuntimeDep, principal: Submitter) -> JobPublic:
    """Cancel a job; any instance it holds is stopped by the next tick."""
    job = svc.cancel_job(rt.engine, principal.tenant, job_id, rt.clock())
    return svc.job_public(job, None)


@router.post("/{job_id}/notice", operation_id="jobs.notice")
def notice_job(job_id: str, rt: RuntimeDep, principal: Submitter) -> dict[str, str]:
    """Development drill: deliver a provider-format spot interruption notice to the job's running attempt (the
    agent checkpoints, the job is re-placed and resumes). 409 in production, for a job not running, or on a
    provider that cannot deliver one (the local pool can)."""
    from broker.services.notice_drill import deliver_notice

    return deliver_notice(rt, principal.tenant, job_id, rt.clock())


EVENT_KIND = r"[a-z_]{1,32}"


@router.get("/{job_id}/events", operation_id="jobs.events", response_model=EventPage)
def job_events(
    job_id: str,
    rt: RuntimeDep,
    principal: Submitter,
    after: Annotated[str | None, Query(max_length=20, description="an event id: continue right after it")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    kind: Annotated[list[str] | None, Query(max_length=20, description="keep only these kinds (repeatable)")] = None,
    fold: Annotated[bool, Query(description="one item per run of cost accruals of a placement")] = True,
) -> EventPage:
    """The job's timeline in time order: placements, starts, preemptions, cost accruals (folded), the end.
    `next_cursor` is set when more follow; to watch a running job, poll with `after` = the last item's id."""
    for k in kind or []:
        if not re.fullmatch(EVENT_KIND, k):
            raise Unprocessable("kind", f"{k[:40]!r} is not an event kind (lowercase letters and '_')")
    svc.get_job(rt.engine, principal.tenant, job_id)
    return list_events(rt.engine, job_id, after=after, limit=limit, kinds=kind, fold=fold)
