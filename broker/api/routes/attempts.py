"""GET /v1/jobs/{id}/attempts: a job's attempts (placements), numbered from 1, with their pool, state, times, cost
and why each ended. Tenant-scoped like the other job routes: another tenant's job is a 404."""

from __future__ import annotations

from fastapi import APIRouter

from broker.api.deps import RuntimeDep, Submitter
from broker.api.schemas import AttemptPage
from broker.services.job_attempts import list_attempts

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.get("/{job_id}/attempts", operation_id="jobs.attempts", response_model=AttemptPage)
def job_attempts(job_id: str, rt: RuntimeDep, principal: Submitter) -> AttemptPage:
    """The job's attempts, first to latest (not paged: a job's attempts are bounded by its retry budget)."""
    return AttemptPage(items=list_attempts(rt.engine, principal.tenant, job_id))
