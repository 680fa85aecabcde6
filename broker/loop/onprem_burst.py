"""Tick step: burst opted-in jobs waiting in the on-prem Slurm queue to the cloud, holding them there meanwhile.

A Slurm user opts a job in with its comment: `overspill-burst` followed by an optional JSON object of job fields
(`max_total_usd` is required; `image`, `command`, `work_gpu_hours` or `runtime_hours`, `team`, `project`,
`deadline`, `max_hourly_usd`... as in POST /v1/jobs; the GPU type and count default to the Slurm request):

    sbatch --gres=gpu:a100:2 --comment='overspill-burst {"max_total_usd": "40", "image": "ghcr.io/x/train:1",
           "work_gpu_hours": "16"}' train.sh

When such a job is pending for capacity (reasons Resources/Priority), the on-prem wait for its shape is longer
than `burst_after_wait_hours`, and a cloud pool fits within its ceiling, the broker records a job for it (keyed by
its Slurm id, so never twice) and holds the Slurm job with the reason. Afterwards, per tick:
- the cloud job succeeded: the held Slurm job is cancelled (it ran elsewhere, exactly once);
- the cloud job failed, was paused or cancelled, or could not be placed for `burst_give_up_minutes`: the broker
  job is cancelled and the Slurm job released, back in its place in the queue.
A crash between recording and holding is repaired by the next tick (holding converges).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import ValidationError
from sqlmodel import Session, col, select

from broker.finance.budgets import budget_block_reason
from broker.loop.common import bind_job
from broker.metrics import BurstReason
from broker.runtime import Runtime
from broker.schemas import JobCreate
from broker.services.jobs import add_event, new_id, spec_of
from broker.tables import Job
from federation.placement import PlacementContext, place
from providers.base import ProviderError
from providers.model import JobState

log = logging.getLogger(__name__)

OPT_IN = "overspill-burst"


def _burstable_providers(rt: Runtime) -> list[Any]:
    return [p for p in rt.providers.values() if hasattr(p, "queued_jobs") and hasattr(p, "hold")]


def burst_onprem_queue(rt: Runtime, now: datetime) -> int:
    """Returns the number of Slurm jobs newly burst."""
    burst = 0
    for provider in _burstable_providers(rt):
        try:
            queued = provider.queued_jobs()
        except ProviderError as exc:
            log.warning("reading the %s queue failed: %s", provider.name, exc)
            continue
        for q in queued:
            bind_job(None)
            if q.burstable and OPT_IN in (q.job.comment or "") and q.held_by is None:
                burst += _maybe_burst(rt, provider, q, now)
        _settle(rt, provider, now)
    return burst


def _origin(provider: Any, job_id: int) -> str:
    return f"{provider.name}:{job_id}"


def _maybe_burst(rt: Runtime, provider: Any, q: Any, now: datetime) -> int:
    origin = _origin(provider, q.job.job_id)
    with Session(rt.engine) as session:
        existing = session.exec(select(Job).where(Job.origin == origin)).first()
    if existing is not None:
        if not existing.origin_settled:
            _hold(provider, q.job.job_id, existing.id)  # a crash came between recording and holding
        return 0
    create = _spec_from_comment(q, [name for name in rt.providers if name != provider.name])
    if create is None:
        rt.metrics.burst_decision("stay", BurstReason.UNUSABLE_SPEC)
        return 0
    wait = provider.model().expected_wait_hours(q.accelerator.upper(), q.gpus, now, work_hours=None)
    if wait < rt.settings.burst_after_wait_hours:
        rt.metrics.burst_decision("stay", BurstReason.SHORT_WAIT)
        return 0
    job = _new_job(rt, create, origin, now)
    with Session(rt.engine) as session:
        if budget_block_reason(session, job, now):
            return 0  # its team's or project's hard budget is spent: it stays queued on-prem
    book = rt.catalog.book(now)
    spec = spec_of(job)
    if place(spec, book, PlacementContext(now=now, remaining_work_hours=spec.work_hours, params=rt.params)) is None:
        rt.metrics.burst_decision("stay", BurstReason.NO_CLOUD_POOL)
        return 0  # no cloud pool within its ceiling now: it stays queued on-prem
    with Session(rt.engine, expire_on_commit=False) as session:
        session.add(job)
        add_event(
            session,
            job,
            now,
            "burst_from_onprem",
            f"Slurm job {q.job.job_id} waited for {q.reason}; expected on-prem wait {wait:.1f} h: bursting",
            slurm_job_id=q.job.job_id,
            expected_onprem_wait_hours=round(wait, 2),
        )
        session.commit()
    _hold(provider, q.job.job_id, job.id)
    rt.metrics.burst_decision("burst", BurstReason.LONG_WAIT)
    bind_job(job)
    log.info("bursting Slurm job %s to the cloud", q.job.job_id, extra={"expected_onprem_wait_hours": wait})
    return 1


def _hold(provider: Any, slurm_job_id: int, broker_job_id: str) -> None:
    try:
        provider.hold(slurm_job_id, f"bursting to the cloud as overspill job {broker_job_id}")
    except ProviderError as exc:
        log.warning("holding Slurm job %s failed: %s", slurm_job_id, exc)


def _spec_from_comment(q: Any, cloud_providers: list[str]) -> JobCreate | None:
    text = q.job.comment.split(OPT_IN, 1)[1].strip()
    try:
        fields: dict[str, Any] = json.loads(text) if text else {}
        fields.setdefault("name", q.job.name or f"slurm-{q.job.job_id}")
        fields.setdefault("image", "slurm-batch")
        fields.setdefault("accelerators", [q.accelerator])
        fields.setdefault("gpu_count", q.gpus)
        if "work_gpu_hours" not in fields and "runtime_hours" not in fields:
            limit = q.job.time_limit or 60
            fields["runtime_hours"] = str(Decimal(limit) / 60)
        fields.setdefault("allowed_providers", cloud_providers)
        return JobCreate(**fields)
    except (ValueError, ValidationError) as exc:
        log.warning("Slurm job %s asks to burst but its spec is unusable: %s", q.job.job_id, exc)
        return None


def _new_job(rt: Runtime, create: JobCreate, origin: str, now: datetime) -> Job:
    job = Job(
        id=new_id("job"),
        tenant=rt.settings.bootstrap_tenant,
        team=create.team,
        project=create.project,
        name=create.name,
        spec=create.model_dump(mode="json"),
        state=JobState.PENDING.value,
        wait_reason="burst from the on-prem queue; waiting for the next placement round",
        priority=create.priority,
        max_total_usd=create.max_total_usd,
        max_hourly_usd=create.max_hourly_usd,
        deadline_at=create.deadline,
        checkpoint_uri=create.checkpoint_uri,
        origin=origin,
        created_at=now,
        updated_at=now,
    )
    spec = spec_of(job)
    job.work_hours = job.remaining_work_hours = spec.work_hours
    return job


def _settle(rt: Runtime, provider: Any, now: datetime) -> None:
    """Finish the on-prem side of bursts whose cloud side has an outcome."""
    give_up = timedelta(minutes=rt.settings.burst_give_up_minutes)
    with Session(rt.engine) as session:
        jobs = session.exec(
            select(Job).where(col(Job.origin).startswith(f"{provider.name}:"), Job.origin_settled == False)  # noqa: E712
        ).all()
    for job in jobs:
        bind_job(job)
        slurm_id = int(str(job.origin).split(":", 1)[1])
        if job.state == JobState.SUCCEEDED.value:
            action, message = "cancel", f"ran in the cloud as {job.id}; the held Slurm job is cancelled"
            reason = BurstReason.CLOUD_SUCCEEDED
        elif job.state in (JobState.FAILED.value, JobState.CANCELLED.value, JobState.PAUSED.value):
            action, message = "release", f"cloud job {job.state}; Slurm job {slurm_id} released on-prem"
            reason = BurstReason.CLOUD_ENDED + job.state
        elif job.state == JobState.PENDING.value and now - job.created_at >= give_up:
            action, message = "release", f"no cloud placement within {give_up}; Slurm job {slurm_id} released on-prem"
            reason = BurstReason.GAVE_UP
        else:
            continue
        try:
            if action == "cancel":
                provider.cancel_held(slurm_id)
            else:
                provider.release(slurm_id)
        except ProviderError as exc:
            log.warning("settling Slurm job %s failed (retried next tick): %s", slurm_id, exc)
            continue
        with Session(rt.engine) as session:
            row = session.exec(select(Job).where(Job.id == job.id).with_for_update()).one()
            row.origin_settled = True
            if action == "release" and row.state in (JobState.PENDING.value, JobState.PAUSED.value):
                # the job now runs on-prem: the cloud side must never be resumed or placed again
                row.state = JobState.CANCELLED.value
                row.finished_at = now
                row.wait_reason = "returned to the on-prem queue"
            row.updated_at = now
            session.add(row)
            add_event(session, row, now, "onprem_" + ("cancelled" if action == "cancel" else "released"), message)
            session.commit()
        rt.metrics.burst_decision("cancel_onprem" if action == "cancel" else "release", reason)
        log.info(message)
