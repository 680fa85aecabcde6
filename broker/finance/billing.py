"""Provider bills: import a billing export in FOCUS columns (AWS Data Exports "FOCUS 1.0 with AWS columns", or
any FOCUS 1.x export; CSV, CSV.gz or Parquet) and reconcile it with the ledger per resource.

Import keeps, per resource id and UTC charge day, the sums of BilledCost, EffectiveCost and ListCost (rows
without a ResourceId, such as taxes or support, are counted but not kept). Resource ids are normalised so an
ARN (`arn:aws:ec2:us-east-1:123:instance/i-0abc`) matches the instance id the broker launched (`i-0abc`).

Reading the file is bounded (`broker.finance.bill_files`: decompressed size, rows, columns; 413 beyond); every
amount must be a finite number under `MAX_AMOUNT_USD` and every sum under `MAX_TOTAL_USD` (422 naming the row and
column otherwise), so whatever is stored reconciles.

Reconciliation compares, for the bill's provider and its billing period (BillingPeriodStart/End, or the days
of its charges when absent), the ledger's cost per resource id with
the bill's BilledCost: `difference = billed - ledger`, status `match` within `TOLERANCE_USD`, else `differs`,
or `only_in_bill` / `only_in_ledger`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from broker.finance.bill_files import BillError, BillLimits, read_rows
from broker.finance.costs import money
from broker.runtime import Runtime
from broker.services.jobs import new_id
from broker.store.tables import BillImportRow, BillLineRow, CostEntryRow

TOLERANCE_USD = Decimal("0.01")
MAX_AMOUNT_USD = Decimal(10) ** 9  # one line of a bill; the ledger's NUMERIC(24, 10) holds 10^14
MAX_TOTAL_USD = Decimal(10) ** 12
_PROVIDERS = {
    "aws": "aws",
    "amazon web services": "aws",
    "google cloud": "gcp",
    "google": "gcp",
    "microsoft": "azure",
    "azure": "azure",
}


def normalise_resource_id(value: str) -> str:
    value = value.strip()
    if value.startswith("arn:") and "/" in value:
        return value.rsplit("/", 1)[1]
    return value


def _dec(value: Any, column: str, line: int) -> Decimal:
    """An amount of the bill: a finite number below MAX_AMOUNT_USD in size (NaN, Infinity and 1e999999 are
    refused here, naming the row and column, rather than stored and failing every reconciliation later)."""
    if value is None or value == "":
        return Decimal("0")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation as exc:
        raise BillError(f"row {line}: {column} {str(value)[:40]!r} is not a number") from exc
    if not amount.is_finite() or abs(amount) >= MAX_AMOUNT_USD:
        raise BillError(
            f"row {line}: {column} {str(value)[:40]!r} is not an amount (finite, under {MAX_AMOUNT_USD:,} USD)"
        )
    return amount


def _add(total: Decimal, amount: Decimal, what: str, line: int) -> Decimal:
    total += amount
    if abs(total) >= MAX_TOTAL_USD:
        raise BillError(f"row {line}: the sum of {what} passes {MAX_TOTAL_USD:,} USD, which no bill does")
    return total


def _time(value: Any, column: str, line: int) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        parsed = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise BillError(f"row {line}: {column} {value!r} is not an ISO 8601 time") from exc
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass
class ImportSummary:
    id: str
    provider: str
    rows: int
    resources: int
    skipped_without_resource: int
    billed_usd: Decimal
    period_start: datetime
    period_end: datetime


def import_bill(rt: Runtime, tenant: str, path: Path, now: datetime, *, provider: str | None = None) -> ImportSummary:
    lines: dict[tuple[str, datetime], list[Decimal]] = {}
    counts: dict[tuple[str, datetime], int] = {}
    names: set[str] = set()
    rows = skipped = 0
    billed = Decimal("0")
    first: datetime | None = None
    last: datetime | None = None
    period: list[datetime] = []
    for n, row in enumerate(read_rows(path, BillLimits.from_settings(rt.settings)), start=2):
        rows += 1
        cost = _dec(row.get("BilledCost"), "BilledCost", n)
        billed = _add(billed, cost, "BilledCost", n)
        start = _time(row.get("ChargePeriodStart"), "ChargePeriodStart", n)
        first = start if first is None or start < first else first
        last = start if last is None or start > last else last
        for column in ("BillingPeriodStart", "BillingPeriodEnd"):
            if row.get(column):
                period.append(_time(row[column], column, n))
        if row.get("ProviderName"):
            names.add(str(row["ProviderName"]).strip().lower())
        resource = normalise_resource_id(str(row.get("ResourceId") or ""))
        if not resource:
            skipped += 1
            continue
        day = datetime(start.year, start.month, start.day, tzinfo=UTC)
        slot = lines.setdefault((resource, day), [Decimal("0"), Decimal("0"), Decimal("0")])
        slot[0] = _add(slot[0], cost, "BilledCost", n)
        slot[1] = _add(slot[1], _dec(row.get("EffectiveCost"), "EffectiveCost", n), "EffectiveCost", n)
        slot[2] = _add(slot[2], _dec(row.get("ListCost"), "ListCost", n), "ListCost", n)
        counts[(resource, day)] = counts.get((resource, day), 0) + 1
    if first is None or last is None:
        raise BillError(f"{path.name} has no rows")
    if provider is None:
        known = {_PROVIDERS.get(n) for n in names} - {None}
        if len(known) != 1:
            raise BillError(f"cannot tell the provider from ProviderName {sorted(names)}; pass provider explicitly")
        provider = str(known.pop())
    start_day = datetime(first.year, first.month, first.day, tzinfo=UTC)
    end_day = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
    if period:  # the billing period the export covers: ledger resources in it but not billed show up
        start_day, end_day = min(min(period), start_day), max(max(period), end_day)
    imp = BillImportRow(
        id=new_id("bil"),
        tenant=tenant,
        provider=provider,
        filename=path.name[:200],
        rows=rows,
        period_start_at=start_day,
        period_end_at=end_day,
        billed_usd=billed,
        created_at=now,
    )
    with Session(rt.engine, expire_on_commit=False) as session:
        session.add(imp)
        session.flush()
        for (resource, day), (b, e, lst) in sorted(lines.items()):
            session.add(
                BillLineRow(
                    import_id=imp.id,
                    resource_id=resource[:200],
                    charge_day=day,
                    billed_usd=b,
                    effective_usd=e,
                    list_usd=lst,
                    rows=counts[(resource, day)],
                )
            )
        session.commit()
    return ImportSummary(imp.id, provider, rows, len({r for r, _ in lines}), skipped, billed, start_day, end_day)


def reconcile(rt: Runtime, tenant: str, import_id: str) -> dict[str, Any] | None:
    """Ledger vs bill per resource for one import of `tenant` (None when there is no such import)."""
    with Session(rt.engine) as session:
        imp = session.get(BillImportRow, import_id)
        if imp is None or imp.tenant != tenant:
            return None
        bill: dict[str, Decimal] = {}
        for line in session.exec(select(BillLineRow).where(BillLineRow.import_id == import_id)).all():
            bill[line.resource_id] = bill.get(line.resource_id, Decimal("0")) + line.billed_usd
        ledger: dict[str, Decimal] = {}
        for resource, usd in session.exec(
            select(CostEntryRow.resource_id, CostEntryRow.usd).where(
                CostEntryRow.tenant == tenant,
                CostEntryRow.provider == imp.provider,
                CostEntryRow.resource_id != "",
                col(CostEntryRow.period_start_at) >= imp.period_start_at,
                col(CostEntryRow.period_start_at) < imp.period_end_at,
            )
        ).all():
            ledger[resource] = ledger.get(resource, Decimal("0")) + usd
    rows = list(_compare(bill, ledger))
    rows.sort(key=lambda r: (-abs(Decimal(r["difference_usd"])), r["resource_id"]))
    total_bill = sum(bill.values(), Decimal("0"))
    total_ledger = sum(ledger.values(), Decimal("0"))
    return {
        "import_id": imp.id,
        "provider": imp.provider,
        "filename": imp.filename,
        "from": imp.period_start_at.isoformat(),
        "to": imp.period_end_at.isoformat(),
        "billed_usd": money(total_bill),
        "ledger_usd": money(total_ledger),
        "difference_usd": money(total_bill - total_ledger),
        "bill_total_usd": money(imp.billed_usd),  # includes rows without a resource (tax, support...)
        "rows": rows,
    }


def _compare(bill: dict[str, Decimal], ledger: dict[str, Decimal]) -> Iterable[dict[str, str]]:
    for resource in sorted(bill.keys() | ledger.keys()):
        b, lg = bill.get(resource), ledger.get(resource)
        if b is None:
            status = "only_in_ledger"
        elif lg is None:
            status = "only_in_bill"
        else:
            status = "match" if abs(b - lg) <= TOLERANCE_USD else "differs"
        b0, l0 = b or Decimal("0"), lg or Decimal("0")
        yield {
            "resource_id": resource,
            "ledger_usd": money(l0),
            "billed_usd": money(b0),
            "difference_usd": money(b0 - l0),
            "status": status,
        }
