"""Tick steps that protect against lost work and unseen bills: interruption notices and the orphan sweep.

- `handle_interruptions`: providers that push notices (AWS EventBridge -> SQS, relayed Azure Scheduled Events,
  GCP preemption operations) are polled; a notice for a live placement marks it preempted as of the reclaim time
  and sends the job back to be re-placed at once, from the work its last checkpoint saved, instead of waiting to
  discover the loss by polling. The zone is avoided for a while. Notices are at-least-once: a repeat is a no-op.
  `apply_notice` is the same action for one notice delivered another way (the Lambda's SQS event source).
- `sweep_orphans`: any instance carrying this broker's tags without a live placement (a crash between a launch and
  its record, a reclaim the broker never heard of, a placement stopped while its terminate failed, a finished VM
  whose delete failed) is terminated once older than the grace period, and logged; nothing keeps billing unseen.
  That includes an ended instance that still exists (`Instance.lingering`: a stopped GCP VM holding its disk, an
  Azure VM stopped or deallocated, a VM left Failed by its create). An instance that is `released` (gone, or being
  deleted) is skipped, so the sweep converges: each orphan is terminated once, and the next passes find nothing.
  An instance warned of an interruption (until its deadline) or whose agent still reports (within two heartbeats)
  is never swept.
- A notice ahead of time for an instance that runs the agent only records its deadline (`notice_deadline_at`): the
  agent signals the workload and uploads its final checkpoint, and the sync step re-places the job from it once the
  agent's final report lands or the deadline passes (broker.loop.sync).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import or_
from sqlmodel import Session, col, select

from agent.bounded import HostileInput, bounded_time
from broker.crashpoints import crashpoint
from broker.loop.common import PREEMPTION_BLOCK, bind_job, block, locked
from broker.market.availability import record_reclaim
from broker.runtime import Runtime
from broker.services.agent_reports import NOTICE_DEFAULT, NOTICE_GRACE
from broker.services.bulkhead import Bulkhead, bulkhead
from broker.services.jobs import add_event
from broker.store.copystate import claim_lease
from broker.store.tables import Job, Placement
from providers.base import InterruptionNotice, InterruptionSource, NotFound, ProviderError
from providers.model import JobState, PlacementState

log = logging.getLogger(__name__)

_LIVE = (PlacementState.LAUNCHING.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value)


def handle_interruptions(rt: Runtime, now: datetime) -> int:
    """Returns the number of placements marked preempted from notices."""
    handled = 0
    with bulkhead(rt, "handle_interruptions", now) as bh:
        for provider in rt.providers.values():
            if not isinstance(provider, InterruptionSource):
                continue
            bind_job(None)
            with bh.item(f"provider:{provider.name}"):
                handled += _poll(rt, provider, now, bh)
    return handled


def _poll(rt: Runtime, provider: Any, now: datetime, bh: Bulkhead) -> int:
    """Apply one provider's notices, each behind the bulkhead; acknowledge those applied (or quarantined), so a
    notice that failed is delivered again next tick, until it is quarantined."""
    try:
        notices = provider.poll_interruptions()
    except ProviderError as exc:
        log.warning("polling interruptions from %s failed: %s", provider.name, exc)
        return 0
    handled, done = 0, []
    for notice in notices:
        bind_job(None)
        key = f"{provider.name}:{notice.instance_id}"
        if not bh.skip(key):
            with bh.item(key):
                handled += _apply(rt, provider.name, notice.instance_id, notice.kind, notice.action_at or now, now)
        if key not in bh.failed or bh.failed[key][2]:
            done.append(notice)
    ack = getattr(provider, "ack_interruptions", None)
    if ack is not None and done:  # only now: a crash before this line gets the notices delivered again
        ack(done)
    return handled


# how far from now a cloud's notice deadline may lie; beyond it (a malformed answer) the shortest notice is assumed
NOTICE_HORIZON = timedelta(days=1)


def bounded_action_at(action_at: datetime, now: datetime) -> datetime:
    """A notice's reclaim time as the cloud gave it when within `NOTICE_HORIZON` of `now`; else now (a time long
    past) or the shortest notice a cloud gives (a time far ahead, up to the calendar's end), so no deadline
    arithmetic overflows and a hostile answer never keeps an instance alive."""
    try:
        return bounded_time(action_at, "notice.action_at", now, NOTICE_HORIZON)
    except HostileInput as exc:
        log.warning("interruption notice refused as given (%s); assuming the shortest notice", exc)
        return now if action_at.year < now.year else now + NOTICE_DEFAULT


def apply_notice(rt: Runtime, notice: InterruptionNotice, now: datetime) -> int:
    """Act on one notice delivered outside the step above (the Lambda's SQS records), exactly as the step does.

    Returns 1 when a live placement was marked preempted, 0 otherwise (not ours, a repeat, or a rebalance
    recommendation). Database errors propagate, so a caller that can redeliver (SQS) retries the notice."""
    return _apply(rt, notice.provider, notice.instance_id, notice.kind, notice.action_at or now, now)


def _apply(rt: Runtime, provider: str, instance_id: str, kind: str, action_at: datetime, now: datetime) -> int:
    action_at = bounded_action_at(action_at, now)
    with Session(rt.engine, expire_on_commit=False) as session:
        p = session.exec(
            locked(select(Placement).where(Placement.provider == provider, Placement.instance_id == instance_id))
        ).first()
        if p is None or p.state not in _LIVE:
            return 0  # not ours, or already handled (notices repeat)
        job = session.exec(select(Job).where(Job.id == p.job_id).with_for_update()).one()
        bind_job(job, p)
        if kind != "interruption":
            add_event(
                session, job, now, "rebalance_notice", f"{provider} warns of elevated reclaim risk", placement_id=p.id
            )
            session.commit()
            return 0
        if p.attempt_uri is not None and action_at > now:  # the agent saves a final checkpoint first: wait for it
            return _warn(session, p, job, provider, instance_id, action_at, now)
        saved = _checkpointed(rt, provider, instance_id)
        p.state = PlacementState.PREEMPTED.value
        p.ended_at = max(action_at, p.started_at or action_at)
        session.add(p)
        record_reclaim(session, p.offering_key, p.ended_at)
        remaining = max(Decimal("0"), p.work_hours_at_start - saved) if saved is not None else p.work_hours_at_start
        p.saved_work_hours = p.work_hours_at_start - remaining  # the ledger prices the rest as wasted work
        add_event(
            session,
            job,
            now,
            "interruption_notice",
            f"{provider} will reclaim {instance_id} at {action_at.isoformat(timespec='seconds')}; re-placing now",
            placement_id=p.id,
            remaining_work_hours=str(remaining),
        )
        block(session, f"{p.provider}/{p.region}/{p.zone}", now + PREEMPTION_BLOCK, "interruption notice")
        if action_at <= now:  # already reclaimed (GCP reports after the fact): delete what it left behind now;
            _release(rt, provider, instance_id)  # a warning ahead of time leaves the VM its final checkpoint
        crashpoint("preempt.before_commit")
        if job.current_placement_id == p.id and job.state == JobState.RUNNING.value:
            job.state = JobState.PENDING.value
            job.current_placement_id = None
            job.remaining_work_hours = remaining
            job.wait_reason = f"spot reclaim notice on {p.offering_key}; re-placing with {remaining} h of work left"
            job.updated_at = now
            if job.checkpoint_uri:
                job.checkpoint_provider, job.checkpoint_region = p.provider, p.region
            session.add(job)
        session.commit()
        log.info("spot reclaim notice applied", extra={"action_at": action_at.isoformat(), "job_state": job.state})
        return 1


def _warn(
    session: Session, p: Placement, job: Job, provider: str, instance_id: str, action_at: datetime, now: datetime
) -> int:
    """A notice ahead of time for an instance that runs the agent: record its deadline and leave it alone; the sync
    step re-places the job from the final checkpoint once the agent reports it, or once the deadline passes."""
    if p.notice_deadline_at is not None and p.notice_deadline_at <= action_at:
        return 0  # a repeat
    p.notice_deadline_at = action_at
    session.add(p)
    add_event(
        session,
        job,
        now,
        "interruption_notice",
        f"{provider} will reclaim {instance_id} at {action_at.isoformat(timespec='seconds')}; the agent is saving a "
        "final checkpoint, the job is re-placed from it",
        placement_id=p.id,
        deadline=action_at.isoformat(),
        via=provider,
    )
    crashpoint("preempt.before_commit")  # a crash here leaves the notice unacknowledged: it is delivered again
    session.commit()
    return 1


def _release(rt: Runtime, provider: str, instance_id: str) -> None:
    adapter = rt.provider(provider)
    if adapter is None:
        return
    try:
        adapter.terminate(instance_id)
    except ProviderError as exc:
        log.warning("deleting reclaimed %s on %s failed (the orphan sweep retries): %s", instance_id, provider, exc)


def _checkpointed(rt: Runtime, provider: str, instance_id: str) -> Decimal | None:
    adapter = rt.provider(provider)
    if adapter is None:
        return None
    try:
        return adapter.get(instance_id).checkpointed_work_hours
    except ProviderError:
        return None


def reporting_window(rt: Runtime) -> timedelta:
    """How long after its last report an instance's agent counts as still at work: two heartbeats."""
    return timedelta(seconds=2 * rt.settings.agent_heartbeat_seconds)


SWEEP_LEASE = "tick:sweep_orphans"


def sweep_orphans(rt: Runtime, now: datetime) -> int:
    """Terminate tagged instances that no live placement owns, once older than the grace period.

    Runs at most every `orphan_sweep_seconds` per process (listing every provider's instances costs API calls),
    and among long-running replicas (`rt.shares_work`) only in the one that takes the sweep's lease for that
    interval (`broker.store.copystate.claim_lease`): N replicas do not list every cloud N times.
    """
    last = rt.marks.get("sweep_orphans")
    if last is not None and (now - last).total_seconds() < rt.settings.orphan_sweep_seconds:
        return 0
    rt.marks["sweep_orphans"] = now
    interval = timedelta(seconds=rt.settings.orphan_sweep_seconds)
    if rt.shares_work and interval and not claim_lease(rt.engine, SWEEP_LEASE, rt.replica_id, now + interval, now):
        return 0  # another replica sweeps this interval
    swept = 0
    with Session(rt.engine) as session:
        live = {
            (prov, iid)
            for prov, iid in session.exec(  # type: ignore[call-overload]
                select(Placement.provider, Placement.instance_id).where(col(Placement.state).in_(_LIVE))
            ).all()
        }
        # a launch not yet recorded (crash or lost answer between the request and the record) is known by its token;
        # once the placement records its instance, another instance with the same token is a duplicate (a cloud
        # that forgot the token's first launch) and is swept like any orphan
        # an instance warned of an interruption keeps until its deadline (its agent uploads the final checkpoint),
        # and one whose agent still reports is still at work: neither is swept, whatever its placement's state
        busy = {
            (prov, iid)
            for prov, iid in session.exec(  # type: ignore[call-overload]
                select(Placement.provider, Placement.instance_id).where(
                    col(Placement.instance_id).is_not(None),
                    or_(
                        col(Placement.notice_deadline_at) > now - NOTICE_GRACE,
                        col(Placement.last_report_at) > now - reporting_window(rt),
                    ),
                )
            ).all()
        }
        live |= busy
        unrecorded_tokens = set(
            session.exec(
                select(Placement.launch_token).where(
                    col(Placement.state).in_(_LIVE), col(Placement.instance_id).is_(None)
                )
            ).all()
        )
    with bulkhead(rt, "sweep_orphans", now) as bh:
        for provider in rt.providers.values():
            with bh.item(f"provider:{provider.name}"):
                swept += _sweep_provider(rt, provider, live, unrecorded_tokens, now, bh)
    return swept


def _sweep_provider(
    rt: Runtime, provider: Any, live: set[Any], unrecorded_tokens: set[str], now: datetime, bh: Bulkhead
) -> int:
    """Sweep one provider's orphans; a malformed instance in its list answer is that instance's failure only."""
    swept = 0
    try:
        instances = provider.list_instances()
    except ProviderError as exc:
        log.warning("listing %s instances for the orphan sweep failed: %s", provider.name, exc)
        return 0
    for inst in instances:
        with bh.item(f"{provider.name}:{getattr(inst, 'id', '?')}"):
            swept += _sweep_one(rt, provider, inst, live, unrecorded_tokens, now)
    return swept


def _sweep_one(
    rt: Runtime, provider: Any, inst: Any, live: set[Any], unrecorded_tokens: set[str], now: datetime
) -> int:
    if inst.released or (provider.name, inst.id) in live or inst.launch_token in unrecorded_tokens:
        return 0  # an ended VM that still exists (stopped, holding its disk) is `lingering`: swept too
    if (now - inst.launched_at).total_seconds() < rt.settings.orphan_grace_seconds:
        return 0
    try:
        provider.terminate(inst.id)
    except NotFound:
        pass
    except ProviderError as exc:
        log.warning("could not terminate orphan %s on %s: %s", inst.id, provider.name, exc)
        return 0
    log.warning(
        "terminated orphan instance %s on %s (tags %s): no live placement owns it", inst.id, provider.name, inst.tags
    )
    return 1
