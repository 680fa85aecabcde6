"""Budgets' spend read for many budgets at once (`broker.finance.budgets.spent_many`, `statuses`): the same exact
Decimal sums as the ledger's entries one budget at a time, whatever the mix of scopes, tenants and windows, with
a number of statements per tick that does not grow with the number of budgets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import event, select
from sqlmodel import Session

from broker.finance.budgets import check_budgets, month_window, spent, spent_many, statuses
from broker.runtime import Runtime
from broker.store.tables import BudgetAlertRow, BudgetRow, CostEntryRow
from tests.finance_data import PROJECTS, TEAMS, seed_ledger

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def _budgets() -> list[BudgetRow]:
    out = []
    for tenant in ("acme", "beta", "nobody"):
        for scope, names in (("team", (*TEAMS, "absent")), ("project", PROJECTS)):
            for name in names:
                out.append(_budget(f"b-{tenant}-{scope}-{name}", tenant, scope, name, "monthly"))
    custom = (NOW - timedelta(days=25), NOW - timedelta(days=3))  # ended: the ledger alone
    out.append(_budget("b-custom-nlp", "acme", "team", "nlp", "custom", *custom))
    out.append(_budget("b-custom-atlas", "acme", "project", "atlas", "custom", NOW - timedelta(days=2), NOW))
    return out


def _budget(
    bid: str,
    tenant: str,
    scope: str,
    name: str,
    period: str,
    start: datetime | None = None,
    end: datetime | None = None,
) -> BudgetRow:
    return BudgetRow(
        id=bid, tenant=tenant, scope=scope, name=name, period=period, starts_at=start, ends_at=end,
        amount_usd=Decimal("50"), thresholds=[50, 100], created_at=NOW, updated_at=NOW,
    )  # fmt: skip


def _by_hand(rt: Runtime, b: BudgetRow) -> Decimal:
    """The budget's ledger sum, entry by entry in Decimal."""
    start, end = (b.starts_at, b.ends_at) if b.period == "custom" else month_window(NOW)
    assert start is not None and end is not None
    field = CostEntryRow.team if b.scope == "team" else CostEntryRow.project
    with Session(rt.engine) as session:
        rows = session.exec(
            select(CostEntryRow.usd).where(  # type: ignore[call-overload]
                CostEntryRow.tenant == b.tenant,
                field == b.name,
                CostEntryRow.period_start_at >= start,
                CostEntryRow.period_start_at < end,
            )
        ).all()
    return sum((r[0] for r in rows), Decimal("0"))


def test_spend_of_many_budgets_is_each_ledger_sum_exactly(rt: Runtime) -> None:
    month_start = month_window(NOW)[0]
    seed_ledger(rt.engine, "acme", month_start - timedelta(days=10), 40, 3000, seed=3)
    seed_ledger(rt.engine, "beta", month_start - timedelta(days=5), 30, 1000, seed=4)
    budgets = _budgets()
    with Session(rt.engine) as session:
        windows = [(b, b.starts_at or month_window(NOW)[0], b.ends_at or month_window(NOW)[1]) for b in budgets]
        together = spent_many(session, windows, NOW)
        one_by_one = [spent(session, b, start, end, NOW) for b, start, end in windows]
    expected = [_by_hand(rt, b) for b in budgets]
    assert together == expected == one_by_one
    assert sum(1 for x in expected if x > 0) >= 14  # the mix is not all empty
    assert all(x == 0 for b, x in zip(budgets, expected, strict=True) if b.tenant == "nobody" or b.name == "absent")


def test_checking_many_budgets_takes_a_few_statements_and_fires_each_threshold_once(rt: Runtime) -> None:
    seed_ledger(rt.engine, "acme", month_window(NOW)[0], 19, 3000, seed=5)
    budgets = _budgets()
    with Session(rt.engine, expire_on_commit=False) as session:
        session.add_all(budgets)
        session.commit()
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(rt.engine, "before_cursor_execute", count)
    try:
        check_budgets(rt, NOW)
    finally:
        event.remove(rt.engine, "before_cursor_execute", count)
    spend_reads = [s for s in statements if "FROM cost_entry" in s or "FROM placement" in s]
    # one ledger sum per (window, scope), one unaccrued stretch per such window that runs now (the two monthly
    # ones; both custom windows are over): 4 + 2 for these 38 budgets (it was two per budget)
    assert len(spend_reads) == 6, spend_reads
    with Session(rt.engine) as session:
        alerts = session.exec(select(BudgetAlertRow.budget_id, BudgetAlertRow.threshold)).all()  # type: ignore[call-overload]
        states = statuses(session, budgets, NOW)
    over = {
        (st.budget.id, t)
        for st in states
        for t in (50, 100)
        if st.start <= NOW < st.end and st.spent_usd * 100 >= 50 * t
    }
    assert over and set(map(tuple, alerts)) == over
    assert all(st.fired == sorted(t for b, t in over if b == st.budget.id) for st in states)
    check_budgets(rt, NOW + timedelta(minutes=1))  # nothing fires twice
    with Session(rt.engine) as session:
        assert len(session.exec(select(BudgetAlertRow.id)).all()) == len(over)  # type: ignore[call-overload]
