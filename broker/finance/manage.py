"""Finance service functions behind the API and CLI: budgets and report schedules CRUD, report runs, cost
summaries and corrections. Every function takes the caller's tenant and never touches another tenant's rows
(another tenant's id answers NotFoundError, like an unknown one)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlmodel import Session, col, select

from broker.finance import budgets as bud
from broker.finance.costs import as_of, entries, group, money, shown
from broker.finance.ledger import LedgerError, record_correction
from broker.finance.outbound import check_url
from broker.finance.reports.deliver import check_destination
from broker.finance.reports.period import title
from broker.finance.reports.runs import next_fire
from broker.finance.schemas import (
    BudgetCreate,
    BudgetPublic,
    BudgetUpdate,
    RunPublic,
    ScheduleCreate,
    SchedulePublic,
    ScheduleUpdate,
    check_period,
)
from broker.runtime import Runtime
from broker.services.errors import NotFoundError, Unprocessable
from broker.services.jobs import new_id
from broker.store.tables import BudgetAlertRow, BudgetRow, CostEntryRow, Job, ReportRunRow, ReportScheduleRow


def cost_summary(rt: Runtime, tenant: str, group_by: list[str], start: datetime, end: datetime) -> dict[str, Any]:
    """Sums per group, exact (`cost_usd`, `wasted_usd`, `on_demand_usd`, `savings_usd`: see
    `broker.finance.costs`) and rounded for display (`display`: cents, each column allocated so that its rows
    add up to the total's, `broker.finance.money`); `title`: the window for people ("1-25 November 2026 (month to
    date)"); `as_of`: the latest accrued time among the entries."""
    items = entries(rt.engine, tenant, start, end)
    grouped = group(items, group_by)
    ordered = grouped.sorted_rows()
    lines, footer = shown([sums for _, sums in ordered])
    rows = [
        {**dict(zip(group_by, key, strict=True)), **sums.money(), "entries": sums.entries, "display": line.plain()}
        for (key, sums), line in zip(ordered, lines, strict=True)
    ]
    latest = as_of(items, end)
    return {
        "from": start.isoformat(),
        "to": end.isoformat(),
        "title": title(start, end),
        "as_of": latest.isoformat() if latest else None,
        "group_by": group_by,
        "currency": "USD",
        "rows": rows,
        "total": {**grouped.total.money(), "entries": grouped.total.entries, "display": footer.plain()},
    }


# budgets


def budget_public(session: Session, b: BudgetRow, now: datetime) -> BudgetPublic:
    st = bud.status(session, b, now)
    return BudgetPublic(
        id=b.id,
        scope=b.scope,
        name=b.name,
        period=b.period,
        starts_at=b.starts_at,
        ends_at=b.ends_at,
        amount_usd=money(b.amount_usd),
        hard=b.hard,
        thresholds=list(b.thresholds),
        webhook_url=b.webhook_url,
        email_to=list(b.email_to),
        spent_usd=money(st.spent_usd),
        forecast_usd=money(st.forecast_usd),
        fired=st.fired,
        period_start=st.start,
        period_end=st.end,
    )


def _budget(session: Session, tenant: str, budget_id: str) -> BudgetRow:
    b = session.get(BudgetRow, budget_id)
    if b is None or b.tenant != tenant:
        raise NotFoundError("budget", budget_id)
    return b


def _check_webhook(rt: Runtime, url: str) -> None:
    """A budget's webhook URL naming an IP address must be public or in an allowed network (422)."""
    if url:
        try:
            check_url(url, "webhook_url", rt.settings.webhook_networks)
        except ValueError as exc:
            raise Unprocessable("webhook_url", str(exc).removeprefix("webhook_url").lstrip(": ")) from exc


def create_budget(rt: Runtime, tenant: str, body: BudgetCreate) -> BudgetPublic:
    now = rt.clock()
    _check_webhook(rt, body.webhook_url)
    b = BudgetRow(id=new_id("bdg"), tenant=tenant, created_at=now, updated_at=now, **body.model_dump())
    with Session(rt.engine, expire_on_commit=False) as session:
        session.add(b)
        session.commit()
        return budget_public(session, b, now)


def list_budgets(rt: Runtime, tenant: str) -> list[BudgetPublic]:
    now = rt.clock()
    with Session(rt.engine) as session:
        rows = session.exec(select(BudgetRow).where(BudgetRow.tenant == tenant).order_by(col(BudgetRow.id))).all()
        return [budget_public(session, b, now) for b in rows]


def get_budget(rt: Runtime, tenant: str, budget_id: str) -> BudgetPublic:
    with Session(rt.engine) as session:
        return budget_public(session, _budget(session, tenant, budget_id), rt.clock())


def update_budget(rt: Runtime, tenant: str, budget_id: str, body: BudgetUpdate) -> BudgetPublic:
    now = rt.clock()
    with Session(rt.engine, expire_on_commit=False) as session:
        b = _budget(session, tenant, budget_id)
        for key, value in body.model_dump(exclude_unset=True).items():
            if value is None and key not in ("starts_at", "ends_at"):
                raise Unprocessable(key, "may not be null")
            if key == "webhook_url":
                _check_webhook(rt, value)
            setattr(b, key, value)
        try:
            check_period(b.period, b.starts_at, b.ends_at)
        except ValueError as exc:
            raise Unprocessable("period", str(exc)) from exc
        b.updated_at = now
        session.add(b)
        session.commit()
        return budget_public(session, b, now)


def delete_budget(rt: Runtime, tenant: str, budget_id: str) -> None:
    with Session(rt.engine) as session:
        b = _budget(session, tenant, budget_id)
        for alert in session.exec(select(BudgetAlertRow).where(BudgetAlertRow.budget_id == b.id)).all():
            session.delete(alert)
        session.delete(b)
        session.commit()


# report schedules


def schedule_public(s: ReportScheduleRow) -> SchedulePublic:
    return SchedulePublic(
        id=s.id,
        name=s.name,
        cron=s.cron,
        timezone=s.timezone,
        format=s.format,
        period=s.period,
        destination=dict(s.destination),
        enabled=s.enabled,
        next_run_at=s.next_run_at,
        last_run_at=s.last_run_at,
    )


def _next(cron: str, tz: str, now: datetime) -> datetime:
    try:
        return next_fire(cron, tz, now)
    except ValueError as exc:
        raise Unprocessable("timezone" if "timezone" in str(exc) else "cron", str(exc)) from exc


def allowed_destination(rt: Runtime, tenant: str, destination: dict[str, Any]) -> dict[str, Any]:
    """A validated destination if the operator's settings allow it for `tenant` (422 naming the field)."""
    if not destination:
        return {}
    try:
        return check_destination(rt.settings, tenant, destination)
    except ValueError as exc:
        raise Unprocessable("destination", str(exc)) from exc


def create_schedule(rt: Runtime, tenant: str, body: ScheduleCreate) -> SchedulePublic:
    now = rt.clock()
    allowed_destination(rt, tenant, body.destination)
    s = ReportScheduleRow(
        id=new_id("rsc"),
        tenant=tenant,
        next_run_at=_next(body.cron, body.timezone, now),
        created_at=now,
        updated_at=now,
        **body.model_dump(),
    )
    with Session(rt.engine, expire_on_commit=False) as session:
        session.add(s)
        session.commit()
    return schedule_public(s)


def _schedule(session: Session, tenant: str, schedule_id: str) -> ReportScheduleRow:
    s = session.get(ReportScheduleRow, schedule_id)
    if s is None or s.tenant != tenant:
        raise NotFoundError("report schedule", schedule_id)
    return s


def list_schedules(rt: Runtime, tenant: str) -> list[SchedulePublic]:
    with Session(rt.engine) as session:
        rows = session.exec(
            select(ReportScheduleRow).where(ReportScheduleRow.tenant == tenant).order_by(col(ReportScheduleRow.id))
        ).all()
        return [schedule_public(s) for s in rows]


def get_schedule(rt: Runtime, tenant: str, schedule_id: str) -> SchedulePublic:
    with Session(rt.engine) as session:
        return schedule_public(_schedule(session, tenant, schedule_id))


def update_schedule(rt: Runtime, tenant: str, schedule_id: str, body: ScheduleUpdate) -> SchedulePublic:
    now = rt.clock()
    with Session(rt.engine, expire_on_commit=False) as session:
        s = _schedule(session, tenant, schedule_id)
        changes = body.model_dump(exclude_unset=True)
        for key, value in changes.items():
            if value is None:
                raise Unprocessable(key, "may not be null")
            if key == "destination":
                allowed_destination(rt, tenant, value)
            setattr(s, key, value)
        if {"cron", "timezone"} & changes.keys() or changes.get("enabled"):
            s.next_run_at = _next(s.cron, s.timezone, now)
        s.updated_at = now
        session.add(s)
        session.commit()
        return schedule_public(s)


def delete_schedule(rt: Runtime, tenant: str, schedule_id: str) -> None:
    with Session(rt.engine) as session:
        session.delete(_schedule(session, tenant, schedule_id))
        session.commit()


# report runs


def _through(r: ReportRunRow) -> datetime | None:
    """Where the data of a run's period stopped if the period was still running when the run was made (as its
    file says: `broker.finance.reports.data.ReportData.title`), else None."""
    return (r.data_as_of or r.period_start_at) if r.created_at < r.period_end_at else None


def run_public(r: ReportRunRow) -> RunPublic:
    return RunPublic(
        id=r.id,
        schedule_id=r.schedule_id,
        format=r.format,
        period_start=r.period_start_at,
        period_end=r.period_end_at,
        period_title=title(r.period_start_at, r.period_end_at, through=_through(r)),
        data_as_of=r.data_as_of,
        state=r.state,
        filename=r.filename,
        content_type=r.content_type,
        sha256=r.sha256,
        size_bytes=r.size_bytes,
        entries=r.entries,
        delivered_to=r.delivered_to,
        error=r.error,
        delivery_state=r.delivery_state,
        delivery_attempts=r.delivery_attempts,
        created_at=r.created_at,
        finished_at=r.finished_at,
        download_url=f"/v1/report-runs/{r.id}/download",
    )


_RUN_COLUMNS = [c for c in ReportRunRow.__table__.columns if c.name != "content"]  # type: ignore[attr-defined]


def list_runs(rt: Runtime, tenant: str, limit: int = 100) -> list[RunPublic]:
    from sqlalchemy import select as sa_select

    query = (
        sa_select(*_RUN_COLUMNS)
        .where(ReportRunRow.__table__.c.tenant == tenant)  # type: ignore[attr-defined]
        .order_by(ReportRunRow.__table__.c.created_at.desc(), ReportRunRow.__table__.c.id.desc())  # type: ignore[attr-defined]
        .limit(limit)
    )
    with rt.engine.connect() as conn:
        return [run_public(ReportRunRow(**dict(row._mapping))) for row in conn.execute(query)]


def get_run(rt: Runtime, tenant: str, run_id: str) -> ReportRunRow:
    with Session(rt.engine, expire_on_commit=False) as session:
        r = session.get(ReportRunRow, run_id)
        if r is None or r.tenant != tenant:
            raise NotFoundError("report run", run_id)
        return r


# corrections


def correct_entry(rt: Runtime, tenant: str, entry_id: int, usd: Decimal, note: str) -> dict[str, Any]:
    now = rt.clock()
    with Session(rt.engine, expire_on_commit=False) as session:
        original = session.get(CostEntryRow, entry_id)
        if original is None or original.tenant != tenant:
            raise NotFoundError("cost entry", str(entry_id))
        job = session.exec(select(Job).where(Job.id == original.job_id).with_for_update()).one()
        try:
            entry = record_correction(session, job, entry_id, usd, note, now)
        except LedgerError as exc:
            raise Unprocessable("entry_id", str(exc)) from exc
        session.commit()
        return {"id": entry.id, "corrects_id": entry_id, "usd": money(entry.usd), "job_id": job.id, "note": entry.note}
