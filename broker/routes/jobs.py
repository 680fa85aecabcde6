"""/v1/jobs: submit, read, list, update (limits, priority; resumes a paused job), cancel, events."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response, status

from broker.audit import entry_row
from broker.deps import RuntimeDep, Submitter
from broker.logging_setup import current_context
from broker.schemas import EventPublic, JobCreate, JobPage, JobPublic, JobUpdate
from broker.services import jobs as svc
from providers.model import JobState

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=JobPublic)
def submit_job(
    body: JobCreate,
    rt: RuntimeDep,
    principal: Submitter,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=128)] = None,
) -> JobPublic:
    """Queue a job. Retrying with the same `Idempotency-Key` returns the same job (never a second one)."""
    now = rt.clock()
    job, created = svc.submit_job(
        rt.engine,
        rt.catalog,
        tenant=principal.tenant,
        create=body,
        idempotency_key=idempotency_key,
        now=now,
        request_id=current_context().get("request_id"),
        checkpoints=rt.checkpoint_stores,
        settings=rt.settings,
        audit=entry_row(request.scope, status.HTTP_202_ACCEPTED, now),
    )
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    if created:
        request.state.audited = True  # the audit row committed with the job (broker.audit)
    else:
        response.headers["Idempotent-Replayed"] = "true"
    return svc.job_public(job, None)


@router.get("", response_model=JobPage)
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
    )


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: str, rt: RuntimeDep, principal: Submitter) -> JobPublic:
    job, placement = svc.get_job(rt.engine, principal.tenant, job_id)
    return svc.job_public(job, placement)


@router.patch("/{job_id}", response_model=JobPublic)
def update_job(job_id: str, body: JobUpdate, rt: RuntimeDep, principal: Submitter) -> JobPublic:
    """Raise (or lower) a job's ceilings, move its deadline or change its priority. A job paused to honour its
    ceiling goes back to pending and is placed under the new limits."""
    svc.update_job(rt.engine, principal.tenant, job_id, body, rt.clock())
    job, placement = svc.get_job(rt.engine, principal.tenant, job_id)
    return svc.job_public(job, placement)


@router.post("/{job_id}/cancel", response_model=JobPublic)
def cancel_job(job_id: str, rt: RuntimeDep, principal: Submitter) -> JobPublic:
    """Cancel a job; any instance it holds is stopped by the next tick."""
    job = svc.cancel_job(rt.engine, principal.tenant, job_id, rt.clock())
    return svc.job_public(job, None)


@router.get("/{job_id}/events", response_model=list[EventPublic])
def job_events(job_id: str, rt: RuntimeDep, principal: Submitter) -> list[EventPublic]:
    """Every placement, start, preemption, cost accrual and end, in order."""
    return svc.list_events(rt.engine, principal.tenant, job_id)
