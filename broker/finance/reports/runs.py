"""Running reports: `run_report` produces one (render, store bytes and sha256, queue its delivery),
`deliver_pending_reports` (a tick step) delivers what is queued, and `run_due_reports` (a tick step, and the entry
point of the serverless "reports" schedule) runs every schedule whose time came.

Schedules fire on a cron expression evaluated in their IANA time zone (croniter + zoneinfo). A due schedule is
claimed under a row lock in the same transaction that advances `next_run_at` and inserts its run row, whose
unique key (schedule, fire time) stops a second replica from running it again. A run left `running` by a crash
is picked up again after `STALE_AFTER`. Reports are a pure function of the period's ledger: re-running a
period gives byte-identical output (the sha256 shows it).

Delivery never happens inside a request (nor inside `run_report`): a run with a destination is stored with it,
`state` `delivering` and `delivery_state` `pending`, and answered at once; the control loop's
`deliver_pending_reports` step claims each pending run under a row lock (skipped if another replica holds it),
delivers it within `delivery_deadline_seconds`, `delivery_workers` at a time, starting none after
`delivery_step_seconds`, and records the outcome: `delivered` (`state` `succeeded`), or after
`MAX_DELIVERY_ATTEMPTS` failures (or at once for a destination the settings no longer allow) `failed`. A crash
mid-delivery rolls the claim back, so the next tick delivers it again (at least once).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from broker.finance.dispatch import run_bounded
from broker.finance.reports import data as report_data
from broker.finance.reports.deliver import DeliveryError, DestinationRefused, deliver
from broker.finance.reports.period import label, relative_period
from broker.finance.reports.render import render
from broker.runtime import Runtime
from broker.services.bulkhead import Bulkhead, bulkhead
from broker.services.jobs import new_id
from broker.store.tables import ReportRunRow, ReportScheduleRow

log = logging.getLogger(__name__)

STALE_AFTER = timedelta(minutes=15)
MAX_DELIVERY_ATTEMPTS = 3
Progress = Callable[[str, float], None]


def next_fire(cron: str, tz: str, after: datetime) -> datetime:
    """The first time strictly after `after` that `cron` matches in zone `tz`, in UTC."""
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"timezone {tz!r} is not an IANA time zone") from exc
    if not croniter.is_valid(cron):
        raise ValueError(f"cron {cron!r} is not a valid cron expression")
    nxt = croniter(cron, after.astimezone(zone)).get_next(datetime)
    return nxt.astimezone(UTC)


def filename_for(tenant: str, start: datetime, end: datetime, ext: str) -> str:
    return f"overspill-costs-{tenant}-{label(start, end)}.{ext}"


def run_report(
    rt: Runtime,
    tenant: str,
    fmt: str,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    destination: dict[str, Any] | None = None,
    progress: Progress | None = None,
    run_id: str | None = None,
) -> ReportRunRow:
    """Produce one report; the run row records it, and its destination, if any, for the delivery step (nothing
    is sent from here). A rendering error marks the run failed and is re-raised."""
    step = progress or (lambda _msg, _frac: None)
    with Session(rt.engine, expire_on_commit=False) as session:
        run = session.get(ReportRunRow, run_id) if run_id else None
        if run is None:
            run = ReportRunRow(
                id=new_id("rpt"),
                tenant=tenant,
                format=fmt,
                period_start_at=start,
                period_end_at=end,
                state="running",
                created_at=now,
                destination=dict(destination or {}),
            )
            session.add(run)
            session.commit()
    try:
        step("reading the ledger", 0.1)
        report = report_data.load(rt.engine, tenant, start, end, now=now)
        step(f"rendering {fmt} from {len(report.entries)} entries", 0.4)
        content, content_type, ext = render(fmt, report)
    except Exception as exc:
        _finish(rt, run.id, now, state="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    step("done", 1.0)
    if destination:
        outcome: dict[str, Any] = {"destination": dict(destination), "delivery_state": "pending", "state": "delivering"}
    else:
        outcome = {"state": "succeeded", "delivery_state": ""}
    return _finish(
        rt,
        run.id,
        None if destination else now,
        **outcome,
        error="",
        filename=filename_for(tenant, start, end, ext),
        content_type=content_type,
        content=content,
        entries=len(report.entries),
        data_as_of=report.as_of,
    )


def _finish(rt: Runtime, run_id: str, finished_at: datetime | None, **values: Any) -> ReportRunRow:
    with Session(rt.engine, expire_on_commit=False) as session:
        run = session.exec(select(ReportRunRow).where(ReportRunRow.id == run_id)).one()
        content = values.pop("content", None)
        for key, value in values.items():
            setattr(run, key, value[:1000] if key == "error" else value)
        if content is not None:
            run.content = content
            run.size_bytes = len(content)
            run.sha256 = hashlib.sha256(content).hexdigest()
        run.finished_at = finished_at
        session.add(run)
        session.commit()
        return run


def deliver_pending_reports(rt: Runtime, now: datetime) -> int:
    """Tick step: deliver every pending run (see the module docstring). Returns the runs delivered."""
    with Session(rt.engine) as session:
        ids = session.exec(
            select(ReportRunRow.id)
            .where(ReportRunRow.delivery_state == "pending")
            .order_by(col(ReportRunRow.delivery_attempts), col(ReportRunRow.created_at), col(ReportRunRow.id))
        ).all()
    with bulkhead(rt, "deliver_reports", now) as bh:
        return run_bounded(
            (partial(_guarded_delivery, rt, run_id, now, bh) for run_id in ids if not bh.skip(run_id)),
            workers=rt.settings.delivery_workers,
            budget_seconds=rt.settings.delivery_step_seconds,
            name="report-deliveries",
        )


def _guarded_delivery(rt: Runtime, run_id: str, now: datetime, bh: Bulkhead) -> bool:
    """One delivery behind the step's bulkhead: an unexpected error is this run's, never the other runs'."""
    with bh.item(run_id):
        return _deliver_run(rt, run_id, now)
    return False


def _deliver_run(rt: Runtime, run_id: str, now: datetime) -> bool:
    with Session(rt.engine, expire_on_commit=False) as session:
        run = session.exec(
            select(ReportRunRow).where(ReportRunRow.id == run_id).with_for_update(skip_locked=True)
        ).first()
        if run is None or run.delivery_state != "pending":
            return False
        run.delivery_attempts += 1
        try:
            where = deliver(
                rt.settings, run.tenant, dict(run.destination), run.filename, run.content or b"", run.content_type
            )
        except DeliveryError as exc:
            final = isinstance(exc, DestinationRefused) or run.delivery_attempts >= MAX_DELIVERY_ATTEMPTS
            log.warning(
                "report %s (tenant %s) not delivered, attempt %d: %s", run.id, run.tenant, run.delivery_attempts, exc
            )
            if final:
                run.state, run.delivery_state, run.finished_at = "failed", "failed", now
                run.error = f"delivery failed: {exc}"[:1000]
            else:
                run.error = f"delivery attempt {run.delivery_attempts} failed: {exc}; retried by the next tick"[:1000]
            delivered = False
        else:
            run.state, run.delivery_state, run.finished_at = "succeeded", "delivered", now
            run.delivered_to, run.error = where[:500], ""
            delivered = True
        session.add(run)
        session.commit()
        return delivered


def run_due_reports(rt: Runtime, now: datetime) -> int:
    """Run every enabled schedule whose `next_run_at` has come, and resume runs a crash left behind.
    Returns the number of reports produced."""
    with Session(rt.engine) as session:
        due = session.exec(
            select(ReportScheduleRow.id).where(
                ReportScheduleRow.enabled == True,  # noqa: E712
                col(ReportScheduleRow.next_run_at) <= now,
            )
        ).all()
    done = 0
    with bulkhead(rt, "run_due_reports", now) as bh:
        for schedule_id in due:
            if bh.skip(f"schedule:{schedule_id}"):
                continue
            with bh.item(f"schedule:{schedule_id}"):
                claimed = _claim(rt, schedule_id, now)
                if claimed is not None:
                    done += _execute(rt, claimed[0], claimed[1], now)
        for run_id, dest in _stale_runs(rt, now):
            if bh.skip(f"run:{run_id}"):
                continue
            with bh.item(f"run:{run_id}"):
                done += _execute(rt, run_id, dest, now)
    return done


def _execute(rt: Runtime, run_id: str, dest: dict[str, Any], now: datetime) -> int:
    with Session(rt.engine) as session:
        run = session.get(ReportRunRow, run_id)
        if run is None:
            return 0
        tenant, fmt, start, end = run.tenant, run.format, run.period_start_at, run.period_end_at
    try:
        run_report(rt, tenant, fmt, start, end, now, destination=dest, run_id=run_id)
    except Exception:  # recorded on the run; the next schedule still runs
        log.exception("scheduled report %s failed", run_id)
        return 0
    return 1


def _claim(rt: Runtime, schedule_id: str, now: datetime) -> tuple[str, dict[str, Any]] | None:
    try:
        with Session(rt.engine) as session:
            s = session.exec(
                select(ReportScheduleRow).where(ReportScheduleRow.id == schedule_id).with_for_update(skip_locked=True)
            ).first()
            if s is None or not s.enabled or s.next_run_at > now:
                return None
            fire_at = s.next_run_at
            start, end = relative_period(s.period, fire_at)
            run = ReportRunRow(
                id=new_id("rpt"),
                tenant=s.tenant,
                destination=dict(s.destination),
                schedule_id=s.id,
                scheduled_for=fire_at,
                format=s.format,
                period_start_at=start,
                period_end_at=end,
                state="running",
                created_at=now,
            )
            s.next_run_at = next_fire(s.cron, s.timezone, max(now, fire_at))
            s.last_run_at = now
            s.updated_at = now
            session.add(run)
            session.add(s)
            session.commit()
            return run.id, dict(s.destination)
    except IntegrityError:
        return None  # another replica ran this slot


def _stale_runs(rt: Runtime, now: datetime) -> list[tuple[str, dict[str, Any]]]:
    """Runs a crash left `running` for longer than STALE_AFTER, each claimed (its clock restarted under a row
    lock) so that only one replica redoes it."""
    out: list[tuple[str, dict[str, Any]]] = []
    with Session(rt.engine) as session:
        ids = session.exec(
            select(ReportRunRow.id).where(
                ReportRunRow.state == "running", col(ReportRunRow.created_at) < now - STALE_AFTER
            )
        ).all()
    for run_id in ids:
        with Session(rt.engine) as session:
            run = session.exec(
                select(ReportRunRow).where(ReportRunRow.id == run_id).with_for_update(skip_locked=True)
            ).first()
            if run is None or run.state != "running" or run.created_at >= now - STALE_AFTER:
                continue
            run.created_at = now
            session.add(run)
            dest = dict(run.destination)
            session.commit()
            out.append((run_id, dest))
    return out
