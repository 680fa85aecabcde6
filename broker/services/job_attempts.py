"""A job's attempts: its placements in the order they were made, numbered from 1.

- `list_attempts(engine, tenant, job_id)`: every attempt with its pool, state, times, cost and why it ended
  (404 for an unknown job or another tenant's).
- `placement_of_attempt(engine, tenant, job_id, attempt)`: the placement id an `attempt` query parameter names:
  a number (1-based, in the order the attempts were made) or a placement id (passed through); 404 for a number
  the job has no attempt for.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from broker.api.schemas import AttemptPublic
from broker.services.errors import NotFoundError
from broker.store.tables import Job, Placement

MAX_ATTEMPT_NUMBER = 100_000


def _placements(session: Session, tenant: str, job_id: str) -> list[Placement]:
    job = session.get(Job, job_id)
    if job is None or job.tenant != tenant:
        raise NotFoundError("job", job_id)
    query = select(Placement).where(Placement.job_id == job_id)
    return list(session.exec(query.order_by(col(Placement.created_at), col(Placement.id))).all())


def end_reason(p: Placement) -> str:
    """Why the attempt ended, in words ('' while it runs)."""
    if p.ended_at is None and p.state in ("launching", "queued", "running"):
        return ""
    parts = [p.state]
    if p.outcome and p.outcome != p.state:
        parts.append(f"the agent reported {p.outcome}")
    if p.exit_code is not None:
        parts.append(f"exit code {p.exit_code}")
    if p.detail:
        parts.append(p.detail)
    return "; ".join(parts)


def list_attempts(engine: Engine, tenant: str, job_id: str) -> list[AttemptPublic]:
    with Session(engine) as session:
        rows = _placements(session, tenant, job_id)
    return [
        AttemptPublic(
            number=n,
            placement_id=p.id,
            pool=p.offering_key,
            provider=p.provider,
            region=p.region,
            zone=p.zone,
            instance_type=p.instance_type,
            capacity_type=p.capacity_type,
            state=p.state,
            created_at=p.created_at,
            started_at=p.started_at,
            ended_at=p.ended_at,
            cost_usd=p.cost_usd,
            end_reason=end_reason(p),
            has_log=p.attempt_uri is not None,
        )
        for n, p in enumerate(rows, start=1)
    ]


def placement_of_attempt(engine: Engine, tenant: str, job_id: str, attempt: str | None) -> str | None:
    """See the module docstring."""
    if attempt is None or not attempt.isdigit():
        return attempt
    number = int(attempt) if len(attempt) <= 6 else 0
    with Session(engine) as session:
        rows = _placements(session, tenant, job_id)
    if not 1 <= number <= len(rows):
        raise NotFoundError("attempt", attempt)
    return rows[number - 1].id
