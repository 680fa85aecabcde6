"""A development drill: deliver a provider-format spot interruption notice to a job's current attempt.

`deliver_notice(rt, tenant, job_id, now)` (route `POST /v1/jobs/{id}/notice`, CLI `overspill notice JOB`) finds the
job's live placement and asks its provider to announce an interruption the way the cloud would, through the
instance's own metadata endpoint (the local pool: an EC2 `spot/instance-action`, `LocalPool.inject_notice`). The
agent then does what it does on a real reclaim: tells the workload (notice file, SIGUSR1), waits for its
checkpoint, uploads it and reports `preempted`; the broker re-places the job and the next attempt resumes.

Refused (`Conflict`, 409) in production (`OVERSPILL_ENV=production`), for a job with no running attempt, and on a
provider that cannot deliver one (only providers with `inject_notice` can: the local pool). Records a
`notice_drill` event on the job.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from broker.runtime import Runtime
from broker.services.errors import Conflict, NotFoundError
from broker.services.jobs import add_event
from broker.store.tables import Job, Placement
from providers.base import ProviderError
from providers.model import PlacementState


def deliver_notice(rt: Runtime, tenant: str, job_id: str, now: datetime) -> dict[str, str]:
    """Deliver the drill; returns the placement, instance and the notice's deadline (ISO 8601)."""
    if rt.settings.env == "production":
        raise Conflict("env", "notice drills are a development tool, refused when OVERSPILL_ENV=production")
    with Session(rt.engine, expire_on_commit=False) as session:
        job = session.get(Job, job_id)
        if job is None or job.tenant != tenant:
            raise NotFoundError("job", job_id)
        p = session.get(Placement, job.current_placement_id) if job.current_placement_id else None
    if p is None or p.instance_id is None or p.state != PlacementState.RUNNING.value:
        raise Conflict("job", f"job {job_id} has no running attempt to interrupt (state {job.state})")
    provider = rt.provider(p.provider)
    inject = getattr(provider, "inject_notice", None)
    if not callable(inject):
        raise Conflict("job", f"the {p.provider} provider cannot deliver a notice drill (the local pool can)")
    try:
        deadline: datetime = inject(p.instance_id)
    except ProviderError as exc:
        raise Conflict("job", f"delivering the notice to {p.instance_id} failed: {exc}") from None
    with Session(rt.engine) as session:
        job = session.get(Job, job_id)
        if job is not None:
            add_event(
                session,
                job,
                now,
                "notice_drill",
                f"a spot interruption notice was delivered to {p.instance_id} (deadline {deadline.isoformat()})",
                placement_id=p.id,
                instance_id=p.instance_id,
            )
            session.commit()
    return {"job_id": job_id, "placement_id": p.id, "instance_id": p.instance_id, "deadline": deadline.isoformat()}
