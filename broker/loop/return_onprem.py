"""Tick step: bring cloud work back on-prem when on-prem pressure drops.

For every job running (or still starting) on a cloud pool, the step asks two questions of the pure policy code:
would the job's remaining work be placed on an on-prem pool now (`broker.loop.place.choose_pool`, the very
choice `place_pending` makes next: the deadline-aware strategy for deadline jobs, cheapest expected cost
otherwise), and does moving it pay (`federation.burst.decide_return`: on-prem starts it at once, the deadline
still holds after a restart, and it saves at least `return_min_saving_usd` against finishing in the cloud)? When
both say yes:
- a job whose instance has not started yet is stopped now and re-queued with all of its work;
- a running job is stopped at its next checkpoint: when the work done since its last checkpoint is at most one
  tick's worth (so at most that much is redone), it is stopped and re-queued with what the checkpoint saved;
  until then the step waits (one `return_planned` event, not one per tick).
The next `place_pending` then places it on-prem, with its checkpoint pre-staged there when a store is configured.
Stopping goes through the same code as any other end of a placement (`broker.loop.sync.end_placement`), under
the same row locks, so a replica syncing the placement at the same moment cannot double-handle it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from sqlmodel import Session, col, select

from broker.loop.common import active_blocklist, locked
from broker.loop.place import choose_pool, placement_context
from broker.loop.sync import stop_placement
from broker.runtime import Runtime
from broker.services.jobs import add_event, spec_of
from broker.tables import Job, JobEvent, Placement
from federation.burst import BurstParams, CloudJob, CloudOption, Verdict, decide_return
from providers.base import ComputeProvider, Instance, NotFound, ProviderError
from providers.model import CapacityType, JobState, Offering, PlacementState, hours_between

log = logging.getLogger(__name__)

_CLOUD_LIVE = (PlacementState.LAUNCHING.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value)


def return_onprem(rt: Runtime, now: datetime) -> int:
    """Returns the number of cloud placements stopped to move their jobs on-prem."""
    if not rt.settings.return_onprem:
        return 0
    book = rt.catalog.book(now)
    if not any(o.capacity_type is CapacityType.ON_PREM for o in book):
        return 0
    with Session(rt.engine) as session:
        ids = session.exec(
            select(Placement.id).where(
                col(Placement.state).in_(_CLOUD_LIVE), Placement.capacity_type != CapacityType.ON_PREM.value
            )
        ).all()
    returned = 0
    for pid in ids:
        with Session(rt.engine, expire_on_commit=False) as session:
            p = session.exec(locked(select(Placement).where(Placement.id == pid))).first()
            if p is None or p.state not in _CLOUD_LIVE or p.instance_id is None:
                continue
            job = session.exec(select(Job).where(Job.id == p.job_id).with_for_update()).one()
            if job.state != JobState.RUNNING.value or job.current_placement_id != p.id:
                continue
            provider = rt.provider(p.provider)
            current = book.get(p.offering_key)
            if provider is None or current is None:
                continue
            try:
                returned += _consider(rt, session, provider, p, job, current, now)
            except ProviderError as exc:
                log.warning("returning %s on-prem: %s failed: %s", job.id, p.provider, exc)
                session.rollback()
                continue
            session.commit()
    return returned


def _consider(
    rt: Runtime, session: Session, provider: ComputeProvider, p: Placement, job: Job, current: Offering, now: datetime
) -> int:
    assert p.instance_id is not None
    try:
        inst: Instance | None = provider.get(p.instance_id)
    except NotFound:
        return 0  # sync records the disappearance
    started = p.started_at is not None
    done = Decimal("0")
    if started and inst is not None and inst.checkpointed_work_hours is not None:
        done = inst.checkpointed_work_hours
    remaining = max(Decimal("0"), p.work_hours_at_start - done)
    spec = spec_of(job)
    with Session(rt.engine) as session_read:
        blocklist = active_blocklist(session_read, now)
    ctx = replace(placement_context(rt, job, now, blocklist), remaining_work_hours=remaining)
    best, _, _ = choose_pool(rt, session, job, rt.catalog.book(now), ctx, now)
    if best is None or best.offering.capacity_type is not CapacityType.ON_PREM:
        return 0
    onprem = best.offering
    params = BurstParams(
        onprem_usd_per_gpu_hour=float(onprem.price.hourly_usd / onprem.accelerator_count),
        return_min_saving_usd=rt.settings.return_min_saving_usd,
        return_max_wait_hours=rt.settings.return_max_wait_hours,
        restart_hours=rt.settings.restart_hours,
        placement=rt.params,
    )
    cloud = CloudOption(current, 1, rt.params)
    decision = decide_return(CloudJob(job.id, spec, cloud, remaining, started), now, onprem.expected_wait_hours, params)
    if decision.verdict is not Verdict.RETURN:
        return 0
    if started and not _checkpoint_is_fresh(rt, p, inst, now):
        _plan_once(session, job, p, now, f"{decision.reason} (to {onprem.key})")
        return 0
    why = f"returning on-prem to {onprem.key}: {decision.reason}"
    stop_placement(session, provider, p, job, now, why)
    if not started:
        job.remaining_work_hours = p.work_hours_at_start
    session.add(job)
    add_event(session, job, now, "returning_onprem", why, placement_id=p.id, onprem_offering=onprem.key)
    return 1


def _checkpoint_is_fresh(rt: Runtime, p: Placement, inst: Instance | None, now: datetime) -> bool:
    """At most one tick's work since the last checkpoint (by the instance's report, else by the cadence)."""
    assert p.started_at is not None
    ran = hours_between(p.started_at, now)
    tick = Decimal(str(rt.settings.tick_interval_seconds)) / 3600
    if inst is not None and inst.checkpointed_work_hours is not None:
        return ran - inst.checkpointed_work_hours <= tick
    interval = Decimal(str(rt.settings.checkpoint_interval_hours))
    return ran % interval <= tick


def _plan_once(session: Session, job: Job, p: Placement, now: datetime, why: str) -> None:
    planned = session.exec(
        select(JobEvent.data).where(JobEvent.job_id == job.id, JobEvent.kind == "return_planned")
    ).all()
    if not any(data.get("placement_id") == p.id for data in planned):
        add_event(session, job, now, "return_planned", f"at its next checkpoint: {why}", placement_id=p.id)
