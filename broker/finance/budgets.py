"""Budgets: what a team or project has spent in its budget period, the month-end forecast, threshold alerts, and
the hard-budget gate that keeps new cloud placements on-prem.

- Period: `monthly` is the calendar month in UTC containing `now`; `custom` is `[starts_at, ends_at)`.
- Spent: the sum of the tenant's ledger entries for that team (or project) whose period starts in the window,
  plus, while the window runs, what its running placements cost since their last accrual (accrual runs on a
  cadence: `broker.finance.unaccrued`), so alerts and the gate never trail the spend by a cadence.
- Forecast (method): linear on the period-to-date run rate, `spent x period length / time elapsed`; equal to
  `spent` once the period is over. Simple and explainable; it over-reacts on the first day of a period.
- Alerts: each threshold (percent of the amount) fires once per budget period. `check_budgets` (a tick step)
  inserts a `budget_alert` row first; its unique key (budget, period start, threshold) means one replica wins and
  the others skip. Then the webhook and email are sent; a failed delivery is retried on later ticks (up to
  `MAX_ATTEMPTS`), so an alert is delivered at least once and never re-fired. Alerts are sent side by side
  (`broker.finance.dispatch.run_bounded`), each within `delivery_deadline_seconds` and under its own guard: one
  budget's bad address or dead webhook fails that alert alone (its `last_error`), never another budget's or
  tenant's. Webhooks go to public addresses only (`broker.finance.outbound`); an alert whose webhook resolves to
  an address that is not allowed is not retried.
- Gate: `budget_block_reason(session, job, now)` names the first hard budget of the job's team or project that is
  spent (>= 100%); the placement step then only considers on-prem pools for that job, and it waits with the reason.
  `HardBudgetGate` answers the same question for every job of a step with one read of the budgets.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from broker.finance.dispatch import run_bounded
from broker.finance.notify import NotifyError, post_webhook, send_email
from broker.finance.outbound import UnsafeTarget
from broker.finance.unaccrued import unaccrued_by
from broker.runtime import Runtime
from broker.store.tables import BudgetAlertRow, BudgetRow, CostEntryRow, Job
from pricing.book import PriceBook
from pricing.extras import InstanceExtras
from providers.model import CapacityType

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
ZERO = Decimal("0")


def month_window(now: datetime) -> tuple[datetime, datetime]:
    now = now.astimezone(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    end = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def window(b: BudgetRow, now: datetime) -> tuple[datetime, datetime]:
    """The budget period that applies at `now` (a custom budget has one period, before, during or after now)."""
    if b.period == "custom" and b.starts_at is not None and b.ends_at is not None:
        return b.starts_at, b.ends_at
    return month_window(now)


def spent(
    session: Session,
    b: BudgetRow,
    start: datetime,
    end: datetime,
    now: datetime | None = None,
    extras: Mapping[str, InstanceExtras] | None = None,
) -> Decimal:
    """The ledger's entries of the budget's team or project in `[start, end)`, plus (given `now` inside the
    window) what its running placements have cost since their last accrual (`broker.finance.unaccrued`)."""
    return spent_many(session, [(b, start, end)], now, extras)[0]


def spent_many(
    session: Session,
    windows: Sequence[tuple[BudgetRow, datetime, datetime]],
    now: datetime | None = None,
    extras: Mapping[str, InstanceExtras] | None = None,
) -> list[Decimal]:
    """`spent(session, b, start, end, now, extras)` for each `(b, start, end)` of `windows`, in order, with two
    aggregate statements per distinct (window, scope) (in a tick: one for the month's team budgets, one for its
    project budgets, whatever the number of budgets), not two per budget. The ledger's sum is the database's
    exact numeric SUM on PostgreSQL; SQLite stores money as text, so there the matching entries are read and
    summed in Decimal (still one statement)."""
    groups: dict[tuple[datetime, datetime, bool], list[int]] = defaultdict(list)
    for i, (b, start, end) in enumerate(windows):
        groups[(start, end, b.scope == "team")].append(i)
    out = [ZERO] * len(windows)
    job = Job.__table__  # type: ignore[attr-defined]
    for (start, end, team), members in groups.items():
        field = CostEntryRow.team if team else CostEntryRow.project
        tenants = sorted({windows[i][0].tenant for i in members})
        names = sorted({windows[i][0].name for i in members})
        where = (
            col(CostEntryRow.tenant).in_(tenants),
            col(field).in_(names),
            col(CostEntryRow.period_start_at) >= start,
            col(CostEntryRow.period_start_at) < end,
        )
        ledger: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        if session.get_bind().dialect.name == "postgresql":
            query = select(CostEntryRow.tenant, field, func.sum(CostEntryRow.usd))  # type: ignore[call-overload]
            for tenant, name, usd in session.exec(query.where(*where).group_by(CostEntryRow.tenant, field)):
                ledger[(tenant, name)] = usd if usd is not None else ZERO
        else:
            rows = select(CostEntryRow.tenant, field, CostEntryRow.usd)  # type: ignore[call-overload]
            for tenant, name, usd in session.exec(rows.where(*where)):
                ledger[(tenant, name)] += usd
        unaccrued: dict[tuple[object, ...], Decimal] = {}
        if now is not None and start <= now < end:
            owner = job.c.team if team else job.c.project
            unaccrued = unaccrued_by(
                session.connection(),
                now,
                (job.c.tenant, owner),
                job.c.tenant.in_(tenants),
                owner.in_(names),
                since=start,
                extras=extras,
            )
        for i in members:
            key = (windows[i][0].tenant, windows[i][0].name)
            out[i] = ledger.get(key, ZERO) + unaccrued.get(key, ZERO)
    return out


def forecast(spent_usd: Decimal, start: datetime, end: datetime, now: datetime) -> Decimal:
    if now >= end or now <= start:
        return spent_usd
    elapsed = Decimal((now - start).total_seconds())
    length = Decimal((end - start).total_seconds())
    return (spent_usd * length / elapsed).quantize(Decimal("0.01"))


@dataclass(frozen=True)
class BudgetStatus:
    budget: BudgetRow
    start: datetime
    end: datetime
    spent_usd: Decimal
    forecast_usd: Decimal
    fired: list[int]

    @property
    def percent(self) -> Decimal:
        return self.spent_usd * 100 / self.budget.amount_usd if self.budget.amount_usd > 0 else Decimal("100")


def status(
    session: Session, b: BudgetRow, now: datetime, extras: Mapping[str, InstanceExtras] | None = None
) -> BudgetStatus:
    return statuses(session, [b], now, extras)[0]


def statuses(
    session: Session, budgets: Sequence[BudgetRow], now: datetime, extras: Mapping[str, InstanceExtras] | None = None
) -> list[BudgetStatus]:
    """Each budget's status at `now`, in order: its spend by `spent_many` and its fired thresholds in one read."""
    windows = [(b, *window(b, now)) for b in budgets]
    totals = spent_many(session, windows, now, extras)
    fired: dict[tuple[int, datetime], list[int]] = defaultdict(list)
    ids = sorted({b.id for b in budgets if b.id is not None})
    if ids:
        for budget_id, start, threshold in session.exec(
            select(BudgetAlertRow.budget_id, BudgetAlertRow.period_start_at, BudgetAlertRow.threshold)  # type: ignore[call-overload]
            .where(col(BudgetAlertRow.budget_id).in_(ids))
            .order_by(col(BudgetAlertRow.threshold))
        ):
            fired[(budget_id, start)].append(threshold)
    return [
        BudgetStatus(b, start, end, total, forecast(total, start, end, now), fired.get((b.id, start), []))  # type: ignore[arg-type]
        for (b, start, end), total in zip(windows, totals, strict=True)
    ]


def budget_block_reason(session: Session, job: Job, now: datetime) -> str | None:
    """Why `job` may not start new cloud spend now (a spent hard budget of its team or project), or None."""
    return HardBudgetGate(session, now).block_reason(job)


class HardBudgetGate:
    """`budget_block_reason` for many jobs in one step: the hard budgets are read once, and their spend once,
    all together on first need (`spent_many`), instead of two queries per job. Use within one step (spend does not move
    while placements are chosen; accrual is a later step).

    `db` is an open session, used for every read, or an engine, from which a short session is opened for each."""

    def __init__(self, db: Session | Engine, now: datetime, extras: Mapping[str, InstanceExtras] | None = None) -> None:
        self._db = db
        self._now = now
        self._extras = extras
        with self._reading() as session:
            self._budgets = session.exec(
                select(BudgetRow).where(BudgetRow.hard == True).order_by(col(BudgetRow.id))  # noqa: E712
            ).all()
        self._reasons: dict[int, str | None] | None = None

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        if isinstance(self._db, Session):
            yield self._db
        else:
            with Session(self._db, expire_on_commit=False) as session:
                yield session

    def block_reason(self, job: Job) -> str | None:
        for b in self._budgets:
            if b.tenant != job.tenant or b.name != (job.team if b.scope == "team" else job.project):
                continue
            if b.scope not in ("team", "project"):
                continue
            assert b.id is not None
            reason = self._all_reasons().get(b.id)
            if reason:
                return reason
        return None

    def blocking(self) -> frozenset[int]:
        """The ids of the hard budgets spent now (none read when there is no hard budget)."""
        if not self._budgets:
            return frozenset()
        return frozenset(b for b, reason in self._all_reasons().items() if reason)

    def _all_reasons(self) -> dict[int, str | None]:
        """Every hard budget's reason, computed on first need for all of them at once (`spent_many`)."""
        if self._reasons is None:
            current = [(b, *window(b, self._now)) for b in self._budgets]
            current = [(b, start, end) for b, start, end in current if start <= self._now < end]
            with self._reading() as session:
                totals = spent_many(session, current, self._now, self._extras)
            self._reasons = {
                b.id: self._reason(b, total, end)
                for (b, _, end), total in zip(current, totals, strict=True)
                if b.id is not None
            }
        return self._reasons

    @staticmethod
    def _reason(b: BudgetRow, total: Decimal, end: datetime) -> str | None:
        if total < b.amount_usd:
            return None
        return (
            f"budget_exhausted: hard {b.period} budget {b.id} of {b.scope} {b.name!r} is spent "
            f"(${total.quantize(Decimal('0.01'))} of ${b.amount_usd} until {end.isoformat()}); "
            "waiting for on-prem capacity or for the budget to be raised"
        )


def onprem_only(book: PriceBook, now: datetime) -> PriceBook:
    """The on-prem pools of a price book (what a job behind a spent hard budget may still use)."""
    return PriceBook.build([o for o in book if o.capacity_type is CapacityType.ON_PREM], now, book.feed_observed_at)


def check_budgets(rt: Runtime, now: datetime) -> int:
    """Tick step: fire every newly crossed threshold once and deliver pending alerts. Returns alerts delivered."""
    fired = 0
    with Session(rt.engine) as session:
        budgets = session.exec(select(BudgetRow).order_by(col(BudgetRow.id))).all()
        states = statuses(session, budgets, now, rt.extras)
    for b, st in zip(budgets, states, strict=True):
        if not st.start <= now < st.end or b.amount_usd <= 0:
            continue
        for threshold in sorted(set(b.thresholds)):
            if threshold in st.fired or st.spent_usd * 100 < b.amount_usd * threshold:
                continue
            _claim(rt, b, st, threshold, now)
    fired += _deliver_pending(rt, now)
    return fired


def _claim(rt: Runtime, b: BudgetRow, st: BudgetStatus, threshold: int, now: datetime) -> None:
    try:
        with Session(rt.engine) as session:
            session.add(
                BudgetAlertRow(
                    budget_id=b.id,
                    tenant=b.tenant,
                    period_start_at=st.start,
                    threshold=threshold,
                    spent_usd=st.spent_usd,
                    amount_usd=b.amount_usd,
                    fired_at=now,
                )
            )
            session.commit()
    except IntegrityError:
        pass  # another replica fired it first


def _deliver_pending(rt: Runtime, now: datetime) -> int:
    """Deliver every undelivered alert with attempts left, least-tried first, `delivery_workers` at a time within
    `delivery_step_seconds` (the rest wait for the next tick). Each alert is its own task: a bad address or a
    dead webhook fails that alert alone, recorded in its `last_error`."""
    with Session(rt.engine) as session:
        ids = session.exec(
            select(BudgetAlertRow.id)
            .where(col(BudgetAlertRow.delivered_at).is_(None), col(BudgetAlertRow.attempts) < MAX_ATTEMPTS)
            .order_by(col(BudgetAlertRow.attempts), col(BudgetAlertRow.id))
        ).all()
    return run_bounded(
        (partial(_deliver_one, rt, alert_id, now) for alert_id in ids if alert_id is not None),
        workers=rt.settings.delivery_workers,
        budget_seconds=rt.settings.delivery_step_seconds,
        name="budget-alerts",
    )


def _deliver_one(rt: Runtime, alert_id: int, now: datetime) -> bool:
    """Claim one alert (row lock, skipped if another replica holds it), send it, record the outcome."""
    with Session(rt.engine) as session:
        alert = session.exec(
            select(BudgetAlertRow).where(BudgetAlertRow.id == alert_id).with_for_update(skip_locked=True)
        ).first()
        if alert is None or alert.delivered_at is not None:
            return False
        b = session.get(BudgetRow, alert.budget_id)
        alert.attempts += 1
        delivered = False
        if b is None:
            alert.last_error = "budget deleted"
            alert.attempts = MAX_ATTEMPTS
        else:
            try:
                _send(rt, b, alert, now)
                alert.delivered_at = now
                alert.last_error = ""
                delivered = True
            except NotifyError as exc:
                alert.last_error = str(exc)[:1000]
                if isinstance(exc, UnsafeTarget):  # not worth retrying: no place to send to
                    alert.attempts = MAX_ATTEMPTS
                log.warning(
                    "budget alert %s%% of %s (tenant %s) not delivered: %s", alert.threshold, b.id, b.tenant, exc
                )
        session.add(alert)
        session.commit()
        return delivered


def alert_payload(b: BudgetRow, alert: BudgetAlertRow) -> dict[str, object]:
    return {
        "type": "budget.threshold",
        "budget_id": b.id,
        "tenant": b.tenant,
        "scope": b.scope,
        "name": b.name,
        "period": b.period,
        "period_start": alert.period_start_at.isoformat(),
        "threshold": alert.threshold,
        "amount_usd": str(alert.amount_usd),
        "spent_usd": str(alert.spent_usd.quantize(Decimal("0.01"))),
        "hard": b.hard,
        "fired_at": alert.fired_at.isoformat(),
    }


def _send(rt: Runtime, b: BudgetRow, alert: BudgetAlertRow, now: datetime) -> None:
    payload = alert_payload(b, alert)
    if b.webhook_url:
        post_webhook(rt.settings, b.webhook_url, payload)
    if b.email_to:
        subject = f"[overspill] {b.scope} {b.name}: {alert.threshold}% of its {b.period} budget reached"
        body = (
            f"The {b.scope} {b.name!r} (tenant {b.tenant}) has spent ${payload['spent_usd']} of its "
            f"${b.amount_usd} {b.period} budget ({alert.threshold}% threshold), period starting "
            f"{alert.period_start_at:%Y-%m-%d}.\n"
            + ("This is a hard budget: at 100% new cloud placements wait on-prem.\n" if b.hard else "")
        )
        send_email(rt.settings, list(b.email_to), subject, body)
