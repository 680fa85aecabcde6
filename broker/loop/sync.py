"""Tick step: bring every live placement in line with its provider, and enforce cancellations and ceilings.

Scaling: the step first reads every live placement with its job (no locks, one read of only the columns the screens
read, as named tuples: `_snapshot`) and asks each provider about all of its instances at once
(`providers.base.describe`: one DescribeInstances per 200 ids on AWS, one query for the simulated clouds, whose
store re-reads only what can change: `broker.store.simstore`). A placement that is settled (its instance runs as
recorded,
or still starts as recorded, the job is not cancelled and the ceiling guard passes) needs nothing and takes no lock
and no transaction: with thousands of running jobs almost every placement is settled on almost every tick. The
ceiling guard is computed by the database in the same read, for every placement at once (`_near_ceiling`: a bound of
the projection from above), so a settled placement costs a dict lookup and a few comparisons; only a placement near
its ceiling, or on a pool whose price rose, is projected exactly in Decimal (`_projected_spend`).
Every other one goes through the locked path below, which reads the placement, the job and the instance again
before acting, so a decision is never taken on the unlocked snapshot.

Placements that need attention are handled `loop_batch_size` (a setting) to a transaction (`_sync_batch`).
For each of them (row-locked, so one replica handles it):
- a placement recorded but never launched (the broker crashed in between) is launched again with its token;
- a job that was cancelled has its instance terminated;
- a running placement that would break its job's `max_total_usd` before the next tick is stopped and the job
  paused with the reason (the ceiling is a promise: stopping early is allowed, overspending is not); the hourly
  rate it projects is the pool's price plus what the instance bills beside compute (boot disk, public IPv4);
- a launch the cloud accepted and then refused in its operation (the instance FAILED with `launch_error`: no
  capacity, quota, a policy) fails the placement exactly as a refusal at launch does (`place.launch_failed`: the
  error's scope blocklisted, the job re-placed, the cloud's message in the event); the tick never waits on the
  cloud's operation, it reads its outcome here;
- otherwise the provider's view is copied: started, finished, preempted (the job goes back to pending with the
  work its last checkpoint saved, and the zone is avoided for a while), failed or gone. A failure the provider
  classifies as the job's own (`Outcome.USER_FAILED`: a Slurm FAILED, TIMEOUT, OUT_OF_MEMORY from accounting)
  fails the job for good; any other failure (node or boot failure, an unclassified one) re-places it.
Every instance that ended is then terminated (deleted), success included: a finished GCP or Azure VM is only
stopped by its start-up script, and a stopped VM keeps its disk (an Azure VM stopped without deallocation keeps
billing full compute). Terminate converges, so repeating it is harmless; a failed one is left to the orphan sweep.
"""

from __future__ import annotations

import logging
from collections import defaultdict, namedtuple
from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Float, Numeric, cast, literal
from sqlalchemy import select as core_select
from sqlalchemy.orm.exc import StaleDataError
from sqlmodel import Session, col, select

from broker.crashpoints import crashpoint
from broker.finance.unaccrued import hours_and_rate
from broker.loop.common import PREEMPTION_BLOCK, bind_job, block, in_scope, lock_batch, locked
from broker.loop.place import launch_failed, launch_placement
from broker.market.availability import record_reclaim
from broker.runtime import Runtime
from broker.services.agent_reports import INFRA_FAILED, LOG_TAIL_CHARS, NOTICE_GRACE
from broker.services.bulkhead import Bulkhead, bulkhead, job_event
from broker.services.jobs import add_event, spec_of
from broker.store.bulk import select_among
from broker.store.tables import Job, Placement, PlacementReport
from providers.base import ComputeProvider, Instance, InstanceState, NotFound, ProviderError, describe
from providers.model import JobState, Outcome, PlacementState, hours_between

log = logging.getLogger(__name__)

_LIVE = (PlacementState.LAUNCHING.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value)
_P = Placement.__table__  # type: ignore[attr-defined]
_J = Job.__table__  # type: ignore[attr-defined]


def sync_instances(rt: Runtime, now: datetime) -> int:
    """Returns the number of placements whose state changed. Works on the live placements of this replica's
    shards (`broker.store.shards`; all of them outside a tick)."""
    with bulkhead(rt, "sync_instances", now) as bh:
        return _sync(rt, now, bh)


def _sync(rt: Runtime, now: datetime, bh: Bulkhead) -> int:
    rows, risen = _snapshot(rt, now)
    if bh.known:
        rows = [(p, job) for p, job in rows if not bh.skip(p.id)]
    views = observe_instances(rt, [p for p, _ in rows])
    changed = 0
    for p, _ in rows:
        if p.instance_id is None:
            with bh.item(p.id):
                changed += _relaunch(rt, p.id, now)
    attention, exact = [], []
    for p, job in rows:
        if p.instance_id is not None:
            verdict = _settled(p, job, views.get(p.instance_id), risen)
            if verdict is None:
                exact.append(p.id)
            elif not verdict:
                attention.append(p.id)
    attention = sorted(attention + _over_ceiling(rt, exact, now, bh))
    if rt.tick_cache is not None:  # for return-on-prem's screen: what sync left alone is as it read it
        touched = {p.id for p, _ in rows if p.instance_id is None} | set(attention)
        rt.tick_cache.settled = {p.id: (p, job) for p, job in rows if p.id not in touched}
        rt.tick_cache.touched = sorted(touched)
    size = rt.settings.loop_batch_size
    for start in range(0, len(attention), size):
        changed += _sync_batch(rt, attention[start : start + size], now, bh)
    return changed


# What the unlocked screens read of every live placement and of its job (`_settled`,
# `broker.loop.return_onprem._returnable` and its memo): not the whole rows (a job's spec, a placement's user data,
# the money columns only the exact projection reads: `_over_ceiling` reads those for the few that need it).
_SNAP_P = tuple(
    _P.c[name]
    for name in (
        "id", "job_id", "state", "provider", "offering_key", "capacity_type", "instance_id", "started_at", "outcome",
        "notice_deadline_at",
    )
)  # fmt: skip
_SNAP_J = tuple(
    _J.c[name]
    for name in ("id", "state", "current_placement_id", "updated_at", "tenant", "team", "project")
)  # fmt: skip


SnapPlacement = namedtuple("SnapPlacement", [c.name for c in _SNAP_P] + ["near_ceiling"])  # type: ignore[misc]
SnapJob = namedtuple("SnapJob", [c.name for c in _SNAP_J])  # type: ignore[misc]


def _over_ceiling(rt: Runtime, ids: list[str], now: datetime, bh: Bulkhead) -> list[str]:
    """Of the running placements `ids` (near their ceilings by the database's bound, or on a pool whose price
    rose), those whose exact projection (`_projected_spend`, in Decimal) breaks their job's ceiling: read whole
    (`broker.store.bulk.select_among`)."""
    over = []
    with rt.engine.connect() as conn:
        query = core_select(_P, _J.c.spent_usd, _J.c.max_total_usd).select_from(_P.join(_J, _J.c.id == _P.c.job_id))
        for p in select_among(conn, query, _P.c.id, ids):
            if p.started_at is None:
                continue
            with bh.item(p.id):
                projected, _ = _projected_spend(rt, p, p, now)
                if projected > p.max_total_usd:
                    over.append(p.id)
    return over


# the set-based ceiling screen leaves to the exact projection every placement within this much of its ceiling
GUARD_MARGIN_USD = Decimal("0.01")


def _snapshot(rt: Runtime, now: datetime) -> tuple[list[tuple[Any, Any]], frozenset[str]]:
    """The live placements of this replica's shards with their jobs, unlocked, as plain tuples of the columns the
    screens read (one Core read of the placements joined with their jobs, each row split into a `SnapPlacement`
    and a `SnapJob`: named tuples, whose fields read several times faster than a result row's, and the screens
    read a dozen per placement), and the offerings whose price rose above some running placement's rate. Each
    placement carries `near_ceiling`, the ceiling guard computed by the database for all of them at once
    (`_near_ceiling`)."""
    live = (_P.c.state.in_(_LIVE), in_scope(rt, _P.c.id))
    with rt.engine.connect() as conn:
        near = _near_ceiling(rt, conn.dialect.name, now).label("near_ceiling")
        rows = conn.execute(
            core_select(*_SNAP_P, near, *(c.label(f"job_{c.name}") for c in _SNAP_J))
            .select_from(_P.join(_J, _J.c.id == _P.c.job_id))
            .where(*live)
        ).all()
        risen = _risen_offerings(rt, conn, now)
    split, make_p, make_j = len(_SNAP_P) + 1, SnapPlacement._make, SnapJob._make
    return [(make_p(r[:split]), make_j(r[split:])) for r in rows], risen


def _near_ceiling(rt: Runtime, dialect: str, now: datetime) -> Any:
    """SQL, per placement: could its job's spend reach its ceiling (less `GUARD_MARGIN_USD`) within the guard
    horizon? A bound of `_projected_spend` from above: the placement's highest rate on record plus the most any
    instance bills beside compute, over its unaccrued hours plus the whole horizon. False lets the screen skip the
    exact projection; a pool whose price rose above the rate on record is left to it too (`_risen_offerings`)."""
    hours, rate = hours_and_rate(dialect, now)
    extra = max((ex.hourly_usd(c) for ex in rt.extras.values() for c in ("spot", "on_demand", "reserved")), default=0)
    horizon = Decimal(str(guard_horizon_seconds(rt))) / 3600
    if dialect == "postgresql":
        spent, ceiling = cast(_J.c.spent_usd, Numeric()), cast(_J.c.max_total_usd, Numeric())
        add, horizon_h, margin = literal(Decimal(extra), Numeric()), literal(horizon, Numeric()), GUARD_MARGIN_USD
        return spent + (rate + add) * (hours + horizon_h) > ceiling - literal(margin, Numeric())
    spent, ceiling = _J.c.spent_usd, _J.c.max_total_usd
    return cast(spent, Float) + (rate + float(extra)) * (hours + float(horizon)) > cast(ceiling, Float) - float(
        GUARD_MARGIN_USD
    )


def _risen_offerings(rt: Runtime, conn: Any, now: datetime) -> frozenset[str]:
    """The offerings whose price in the book now is above the rate on record (placement or segment price) of some
    running placement in scope: one DISTINCT read, a few rows per pool."""
    book = rt.catalog.book(now)
    pairs = conn.execute(
        core_select(_P.c.offering_key, _P.c.hourly_usd, _P.c.price_segment_hourly_usd)
        .where(_P.c.state == PlacementState.RUNNING.value, in_scope(rt, _P.c.id))
        .distinct()
    )
    risen = set()
    for key, hourly, segment in pairs:
        current = book.get(key)
        if current is not None and current.price.hourly_usd > max(hourly, segment or hourly):
            risen.add(key)
    return frozenset(risen)


def _relaunch(rt: Runtime, pid: str, now: datetime) -> int:
    """A placement recorded but never launched (a crash in between): launch it with its token (idempotent)."""
    bind_job(None)
    with Session(rt.engine) as session:
        p = session.exec(locked(select(Placement).where(Placement.id == pid))).first()
        if p is None or p.state not in _LIVE or p.instance_id is not None:
            return 0
    launch_placement(rt, pid, now)
    return 1


def observe_instances(
    rt: Runtime, placements: list[Placement], *, this_tick: bool = False
) -> dict[str, Instance | ProviderError]:
    """Each launched placement's instance as its provider sees it now, by instance id: one batched read per
    provider (`providers.base.describe`). Providers this process does not have are left out; failures are
    logged once per provider.

    Inside a tick every answer is also kept for the tick (`rt.tick_cache`); `this_tick=True` takes the
    instances sync already read this tick from there instead of asking again (for an unlocked screen only: what
    is decided under locks reads the instance afresh)."""
    kept = rt.tick_cache.instances if rt.tick_cache is not None else None
    views: dict[str, Instance | ProviderError] = {}
    by_provider: dict[str, list[str]] = defaultdict(list)
    for p in placements:
        if p.instance_id is None:
            continue
        if this_tick and kept is not None and p.instance_id in kept:
            views[p.instance_id] = kept[p.instance_id]
        else:
            by_provider[p.provider].append(p.instance_id)
    for name, ids in by_provider.items():
        provider = rt.provider(name)
        if provider is None:
            continue
        answers = describe(provider, ids)
        failed = [a for a in answers.values() if isinstance(a, ProviderError) and not isinstance(a, NotFound)]
        if failed:
            log.warning("sync: %s could not describe %d of %d instances: %s", name, len(failed), len(ids), failed[0])
        views.update(answers)
        if kept is not None:
            kept.update(answers)
    return views


# read once: an enum member's `.value` is a descriptor call, and `_settled` runs for every live placement
_CANCELLED, _QUEUED, _RUN = JobState.CANCELLED.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value
_PENDING, _UP = InstanceState.PENDING, InstanceState.RUNNING


def _settled(p: Any, job: Any, view: Instance | ProviderError | None, risen: frozenset[str]) -> bool | None:
    """True when syncing `p` would change nothing: no cancellation to act on, the instance in the state recorded
    (starting, or running with its start recorded) and the ceiling guard passing; None when only the exact ceiling
    projection can tell (`_over_ceiling`). Read on the unlocked snapshot, so it only ever lets the step skip work;
    anything else is decided under the row locks.

    An instance its provider could not answer for (`ProviderError`, logged by `observe_instances`) is left for the
    next tick, as the locked path would leave it, unless its job was cancelled (terminating needs no answer); so is
    one whose provider this process does not have (`None`)."""
    if view is None:
        return True
    if job.state == _CANCELLED or isinstance(view, NotFound):
        return False
    if p.outcome is not None or p.notice_deadline_at is not None:
        return False  # the agent reported its outcome, or works to an interruption notice's deadline
    if isinstance(view, ProviderError):
        return True
    if view.state is _PENDING:
        return p.state == _QUEUED
    if view.state is not _UP or p.state != _RUN or p.started_at is None:
        return False
    if not p.near_ceiling and p.offering_key not in risen:
        return True  # the database's bound of the projection is below the ceiling
    return None


def _sync_batch(rt: Runtime, ids: Sequence[str], now: datetime, bh: Bulkhead) -> int:
    """Sync a batch of placements in one transaction: the placements row-locked (skipping those another replica
    holds), their jobs locked in id order (so two replicas' batches never wait on each other in a cycle),
    their instances read again under the locks, each placement handled in a savepoint (a provider error undoes
    that placement's changes only; any other exception too, caught by the step's bulkhead, which records it on the
    job). Returns how many placements changed state."""
    with Session(rt.engine, expire_on_commit=False) as session:
        placements, jobs = lock_batch(session, ids, lambda p: p.state in _LIVE and p.instance_id is not None)
        if not placements:
            return 0
        views = observe_instances(rt, placements)
        changed = 0
        for p in placements:
            job, provider = jobs[p.job_id], rt.provider(p.provider)
            if provider is None:
                continue  # provider disabled in this process's configuration; leave it to one that has it
            assert p.instance_id is not None
            bind_job(job, p)
            before = p.state
            try:
                record = job_event(session, job, "sync_instances", now, placement_id=p.id)
                with bh.item(p.id, record, passes=(ProviderError,)), session.begin_nested():
                    _sync_one(rt, session, provider, p, job, now, views[p.instance_id])
            except ProviderError as exc:
                log.warning("sync of %s on %s failed: %s", p.id, p.provider, exc)
                continue
            except StaleDataError:  # its job was cancelled (or changed) between the batch's read and this write
                log.info("sync of %s: its job changed state meanwhile; left to the next tick", p.id)
                continue
            if p.state != before:
                log.info("placement %s", p.state, extra={"previous_state": before, "job_state": job.state})
                changed += 1
        bind_job(None)
        session.commit()
    return changed


def _sync_one(
    rt: Runtime,
    session: Session,
    provider: ComputeProvider,
    p: Placement,
    job: Job,
    now: datetime,
    view: Instance | ProviderError,
) -> None:
    """Act on one locked placement given its instance's `view` (read under the lock); raises the view's
    `ProviderError` when the provider could not answer for it and its job needs no terminate."""
    assert p.instance_id is not None
    if job.state == JobState.CANCELLED.value:
        stop_placement(session, provider, p, job, now, "job cancelled")
        return
    if isinstance(view, NotFound):
        blocks = bool(getattr(provider, "preemption_blocks_zone", True))
        if p.attempt_uri is not None and p.outcome is not None:  # the agent's verdict stands, the VM gone or not
            _reported_outcome(rt, session, p, job, None, now, blocks=blocks)
        elif p.attempt_uri is not None and p.notice_deadline_at is not None:
            _preempted(session, p, job, now, None, "reclaimed after an interruption notice", blocks=blocks)
        else:
            _ended(session, p, job, now, PlacementState.FAILED, None, "instance disappeared at the provider")
        return
    if isinstance(view, ProviderError):
        raise view
    inst = view
    if inst.launch_error is not None and p.started_at is None:  # the cloud refused the launch in its operation
        launch_failed(session, p, job, inst.launch_error, now)
        _release(provider, p)  # the VM a failed create left behind (Azure), or nothing (converges)
        return
    if inst.state is InstanceState.PENDING:
        if p.state == PlacementState.LAUNCHING.value:
            p.state = PlacementState.QUEUED.value
            session.add(p)
        return
    if inst.started_at is not None and p.started_at is None:
        started = _within(inst.started_at, p.created_at, now)
        p.started_at = started
        p.state = PlacementState.RUNNING.value
        p.accrued_until = started
        session.add(p)
        # the timeline keeps `placed` and `launched` before `started`; accrual counts from the real start
        add_event(
            session, job, started, "started", f"running on {p.offering_key}", not_before=p.created_at,
            placement_id=p.id,
        )  # fmt: skip
    if p.attempt_uri is not None and _agent_verdict(rt, session, provider, p, job, inst, now):
        return
    if inst.state is InstanceState.RUNNING:
        _guard_ceiling(rt, session, provider, p, job, inst, now)
        return
    if p.exit_code is not None and inst.state is not InstanceState.PREEMPTED:
        # the instance reported its container's exit status itself: the most reliable verdict there is
        if p.exit_code == 0:
            _ended(session, p, job, now, PlacementState.SUCCEEDED, inst, "finished (exit 0)")
        else:
            _ended(session, p, job, now, PlacementState.FAILED, inst, f"the job exited {p.exit_code}", job_failed=True)
    elif inst.state is InstanceState.SUCCEEDED:
        _ended(session, p, job, now, PlacementState.SUCCEEDED, inst, "finished")
    elif inst.state is InstanceState.PREEMPTED:
        _ended(session, p, job, now, PlacementState.PREEMPTED, inst, "preempted by the provider")
        record_reclaim(session, p.offering_key, p.ended_at or now)
        block(session, f"{p.provider}/{p.region}/{p.zone}", now + PREEMPTION_BLOCK, "recent preemption")
    elif inst.state is InstanceState.FAILED:
        final = inst.outcome is Outcome.USER_FAILED  # the job's own failure (exit, signal, time limit): not re-run
        why = inst.detail or "the job's command failed"
        if inst.outcome is not None:
            why = f"{inst.outcome.value}: {why}"
        _ended(session, p, job, now, PlacementState.FAILED, inst, why, job_failed=final)
    else:
        _ended(session, p, job, now, PlacementState.STOPPED, inst, "terminated")
    if not inst.released:
        _release(provider, p)


def _agent_verdict(
    rt: Runtime,
    session: Session,
    provider: ComputeProvider,
    p: Placement,
    job: Job,
    inst: Instance,
    now: datetime,
) -> bool:
    """The verdict on a placement whose instance runs the agent, from what the agent reported: True when this
    decided (ended the placement, or holds it for a notice or a late report), False to sync it as any other.

    - A `final` report's outcome decides, whatever the cloud says: succeeded, user_failed (final for the job, the
      log tail in the event), infra_failed (re-placed elsewhere, that pool no longer tried for the job, until
      `max_infra_retries` such failures: then the job fails with the reason), preempted (re-placed from the
      checkpoint the agent reported). The instance is then deleted.
    - Warned of an interruption (the agent's `notice` report, or the cloud's notice, `notice_deadline_at`): left
      alone until its final report lands or the deadline (plus `NOTICE_GRACE` for the upload) passes; then the job
      goes back to pending from the last checkpoint the agent reported.
    - The instance ended with no final report: reclaimed by the provider -> preempted; otherwise, once
      `REPORT_GRACE` has passed for a late report, an infrastructure failure (the agent never said the workload
      succeeded, so it is never counted as a success; a lost callback cannot turn a failure into one).
    """
    blocks = bool(getattr(provider, "preemption_blocks_zone", True))
    if p.outcome is not None:
        _reported_outcome(rt, session, p, job, inst, now, blocks=blocks)
    elif p.notice_deadline_at is not None:
        if now < p.notice_deadline_at + NOTICE_GRACE and inst.state in (InstanceState.RUNNING, InstanceState.PREEMPTED):
            return True  # its final checkpoint is on the way: leave it alone
        _preempted(session, p, job, now, inst, "reclaimed after an interruption notice", blocks=blocks)
    elif inst.state is InstanceState.RUNNING:
        return False
    elif inst.state is InstanceState.PREEMPTED:
        _preempted(session, p, job, now, inst, "preempted by the provider", blocks=blocks)
    else:
        since = inst.ended_at or p.last_report_at
        if since is not None and now < since + REPORT_GRACE:
            return True  # the final report may still be on its way to the mailbox
        _infra_failed(
            rt, session, p, job, now, inst, f"the instance ended ({inst.state.value}) without the agent's final report"
        )
    if not inst.released:
        _release(provider, p)
    return True


REPORT_GRACE = timedelta(minutes=2)


def _reported_outcome(
    rt: Runtime, session: Session, p: Placement, job: Job, inst: Instance | None, now: datetime, *, blocks: bool = True
) -> None:
    outcome, detail = p.outcome, p.detail
    if outcome == "succeeded":
        _ended(session, p, job, now, PlacementState.SUCCEEDED, inst, "finished (the agent reports success)")
    elif outcome == "user_failed":
        tail = _log_tail(session, p)
        message = f"the job failed (exit code {p.exit_code}){': ' + detail if detail else ''}"
        _ended(session, p, job, now, PlacementState.FAILED, inst, message, job_failed=True, log_tail=tail)
    elif outcome == "preempted":
        _preempted(session, p, job, now, inst, "preempted (the agent saved its final checkpoint)", blocks=blocks)
    else:
        _infra_failed(rt, session, p, job, now, inst, detail or "the agent reports an infrastructure failure")


def _log_tail(session: Session, p: Placement) -> str:
    rows = session.exec(
        select(PlacementReport.data).where(PlacementReport.placement_id == p.id, PlacementReport.kind == "final")
    ).all()
    return str(rows[0].get("log_tail", ""))[-LOG_TAIL_CHARS:] if rows else ""


def _preempted(
    session: Session,
    p: Placement,
    job: Job,
    now: datetime,
    inst: Instance | None,
    message: str,
    *,
    blocks: bool = True,
) -> None:
    """The placement was preempted; its zone is avoided a while unless the provider says its notices tell nothing
    about the zone (`blocks` False: the local pool, whose notices are drills)."""
    _ended(session, p, job, now, PlacementState.PREEMPTED, inst, message)
    record_reclaim(session, p.offering_key, p.ended_at or now)
    if blocks:
        block(session, f"{p.provider}/{p.region}/{p.zone}", now + PREEMPTION_BLOCK, "recent preemption")


def _infra_failed(
    rt: Runtime, session: Session, p: Placement, job: Job, now: datetime, inst: Instance | None, why: str
) -> None:
    """An attempt that could not run through no fault of the workload: the pool is out of the job's choices
    (`place.refused_pools`), and the job is re-placed unless it has used up `max_infra_retries`."""
    p.detail = f"{INFRA_FAILED}: {why}"[:500]
    failures = 1 + len(
        session.exec(
            select(Placement.id).where(
                Placement.job_id == job.id,
                Placement.id != p.id,
                Placement.state == PlacementState.FAILED.value,
                col(Placement.detail).startswith(f"{INFRA_FAILED}:"),
            )
        ).all()
    )
    allowed = spec_of(job).max_infra_retries
    if failures > allowed:
        message = f"failed: {failures} infrastructure failures, over max_infra_retries {allowed}; the last: {why}"
        _ended(session, p, job, now, PlacementState.FAILED, inst, message, job_failed=True, infra_failures=failures)
    else:
        message = f"infrastructure failure ({why}); retrying elsewhere, {failures} of max_infra_retries {allowed}"
        _ended(session, p, job, now, PlacementState.FAILED, inst, message, infra_failures=failures)


def _release(provider: ComputeProvider, p: Placement) -> None:
    """Delete what an ended instance leaves behind, whatever the verdict: a finished, reclaimed or failed VM that
    is only stopped (GCP, Azure) keeps its disk and quota, an Azure VM stopped without deallocation bills full
    compute. Terminate converges, so repeating it is harmless; one that fails is the orphan sweep's."""
    assert p.instance_id is not None
    try:
        provider.terminate(p.instance_id)
    except ProviderError as exc:
        log.warning(
            "releasing ended instance %s on %s failed (the orphan sweep retries): %s", p.instance_id, p.provider, exc
        )


def saved_work(p: Placement, inst: Instance | None) -> Decimal | None:
    """The work of `p` its last durable checkpoint holds: the provider's figure or the agent's, the larger."""
    known = [h for h in (inst.checkpointed_work_hours if inst else None, p.checkpointed_work_hours) if h is not None]
    return max(known) if known else None


def _remaining_after(p: Placement, inst: Instance | None) -> Decimal:
    saved = saved_work(p, inst)
    if saved is None:
        return p.work_hours_at_start
    return max(Decimal("0"), p.work_hours_at_start - saved)


def _ended(
    session: Session,
    p: Placement,
    job: Job,
    now: datetime,
    state: PlacementState,
    inst: Instance | None,
    message: str,
    *,
    job_failed: bool = False,
    **data: object,
) -> None:
    """Record a placement's end and move its job on: succeeded, failed (its own command failed: not retried),
    or back to pending with the work its last checkpoint saved."""
    p.state = state.value
    ended = inst.ended_at if inst and inst.ended_at else None
    p.ended_at = _within(ended, p.started_at or p.created_at, now) if ended is not None else now
    session.add(p)
    remaining = Decimal("0") if state is PlacementState.SUCCEEDED else _remaining_after(p, inst)
    if state is PlacementState.PREEMPTED:  # the ledger prices the work lost since the last checkpoint as wasted
        p.saved_work_hours = p.work_hours_at_start - remaining
    add_event(
        session,
        job,
        p.ended_at,
        {PlacementState.SUCCEEDED: "finished", PlacementState.PREEMPTED: "preempted"}.get(state, state.value),
        f"{message} on {p.offering_key}",
        placement_id=p.id,
        remaining_work_hours=str(remaining),
        **data,
    )
    if job.current_placement_id != p.id or JobState(job.state).terminal:
        return
    job.remaining_work_hours = remaining
    job.current_placement_id = None
    job.updated_at = now
    if state is PlacementState.SUCCEEDED:
        job.state = JobState.SUCCEEDED.value
        job.finished_at = p.ended_at
        job.wait_reason = ""
    elif job_failed:
        job.state = JobState.FAILED.value
        job.finished_at = p.ended_at
        job.wait_reason = f"{message} on {p.offering_key}"
    elif job.state == JobState.RUNNING.value:
        job.state = JobState.PENDING.value
        job.wait_reason = f"{message}; re-placing with {remaining} h of work left"
        if saved_work(p, inst) is not None and job.checkpoint_uri:
            job.checkpoint_provider = p.provider
            job.checkpoint_region = p.region
    session.add(job)


def _within(at: datetime, earliest: datetime, now: datetime) -> datetime:
    """A time a provider reports for a placement (its instance's start or end), kept between the placement's
    creation (or start, less a day of clock skew) and now: a hostile or broken answer (year 1, year 9999) would
    otherwise have accrual walk two thousand years of days, or overflow."""
    return min(max(at, earliest - timedelta(days=1)), now)


def stop_placement(
    session: Session, provider: ComputeProvider, p: Placement, job: Job, now: datetime, why: str
) -> Instance | None:
    assert p.instance_id is not None
    provider.terminate(p.instance_id)
    crashpoint("sync.after_terminate")
    try:
        inst = provider.get(p.instance_id)
    except NotFound:
        inst = None
    _ended(session, p, job, now, PlacementState.STOPPED, inst, why)
    return inst


def guard_horizon_seconds(rt: Runtime) -> float:
    """How far ahead the ceiling guard looks: two tick periods, where a period is the configured interval or, when
    ticks take longer than that (thousands of jobs, a slow cloud API), the last tick's own duration. The next
    sync of a placement comes at most one interval plus one tick later, so a guard shorter than that would let a
    job run past its ceiling between two looks."""
    return 2 * max(rt.settings.tick_interval_seconds, rt.last_tick_seconds)


def _projected_spend(rt: Runtime, p: Placement, job: Job, now: datetime) -> tuple[Decimal, Decimal]:
    """(the job's spend by the end of the guard horizon if `p` keeps running, the hourly price assumed): the
    highest of the placement's price, its price segment's (what its unaccrued stretch is charged at) and the
    pool's current one, over what is not accrued yet (up to an accrual cadence and a tick: `broker.loop.accrue`)
    plus the horizon (or the run's remaining work, if shorter). The price includes what the instance bills beside
    compute (boot disk, public IPv4: `rt.extras`), which the ledger accrues next to it."""
    assert p.started_at is not None
    hourly = rt.catalog.book(now).get(p.offering_key)
    segment = p.price_segment_hourly_usd or p.hourly_usd
    price = max(p.hourly_usd, segment, hourly.price.hourly_usd if hourly else p.hourly_usd) + extra_hourly_usd(rt, p)
    accrued_until = p.accrued_until or p.started_at
    unaccrued = hours_between(accrued_until, now) if now > accrued_until else Decimal("0")
    if p.checkpointed_work_hours is not None:  # the agent reports real progress: what its checkpoint has not saved
        run_left = p.work_hours_at_start - p.checkpointed_work_hours
    else:
        run_left = p.work_hours_at_start - hours_between(p.started_at, now)
    guard = hours_between(now, now + timedelta(seconds=guard_horizon_seconds(rt)))
    return job.spent_usd + price * (unaccrued + max(Decimal("0"), min(run_left, guard))), price


def extra_hourly_usd(rt: Runtime, p: Placement) -> Decimal:
    """What `p`'s instance bills per hour beside compute (0 for providers without extras: simulated, on-prem)."""
    extras = rt.extras.get(p.provider)
    return extras.hourly_usd(p.capacity_type) if extras is not None else Decimal("0")


def _guard_ceiling(
    rt: Runtime,
    session: Session,
    provider: ComputeProvider,
    p: Placement,
    job: Job,
    inst: Instance,
    now: datetime,
) -> None:
    """Stop before the job could overspend: unaccrued spend plus the run until the next sync must fit the ceiling."""
    projected, price = _projected_spend(rt, p, job, now)
    if projected <= job.max_total_usd:
        return
    stopped = stop_placement(session, provider, p, job, now, "stopped to honour max_total_usd")
    job.state = JobState.PAUSED.value
    job.remaining_work_hours = _remaining_after(p, stopped)
    job.wait_reason = (
        f"paused: ${job.spent_usd} spent of max_total_usd ${job.max_total_usd}; continuing on "
        f"{p.offering_key} at ${price}/h would exceed it. Raise the ceiling or cancel."
    )
    job.updated_at = now
    session.add(job)
    add_event(session, job, now, "paused", job.wait_reason, placement_id=p.id)
