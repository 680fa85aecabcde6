"""Provider bills: import a billing export in FOCUS columns (AWS Data Exports "FOCUS 1.0 with AWS columns", or
any FOCUS 1.x export; CSV, CSV.gz or Parquet) and reconcile it with the ledger per resource.

Import keeps, per resource id and UTC charge day, the sums of BilledCost, EffectiveCost and ListCost (rows
without a ResourceId, such as taxes or support, are counted but not kept). Resource ids are normalised so an
ARN (`arn:aws:ec2:us-east-1:123:instance/i-0abc`) matches the instance id the broker launched (`i-0abc`).

Reconciliation compares, for the bill's provider and its billing period (BillingPeriodStart/End, or the days
of its charges when absent), the ledger's cost per resource id with
the bill's BilledCost: `difference = billed - ledger`, status `match` within `TOLERANCE_USD`, else `differs`,
or `only_in_bill` / `only_in_ledger`.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from broker.finance.costs import money
from broker.runtime import Runtime
from broker.services.jobs import new_id
from broker.tables import BillImportRow, BillLineRow, CostEntryRow

TOLERANCE_USD = Decimal("0.01")
REQUIRED = ("ResourceId", "BilledCost", "ChargePeriodStart")
_PROVIDERS = {
    "aws": "aws",
    "amazon web services": "aws",
    "google cloud": "gcp",
    "google": "gcp",
    "microsoft": "azure",
    "azure": "azure",
}


class BillError(ValueError):
    """The file is not a FOCUS-form billing export the broker can read (names the column or row)."""


def normalise_resource_id(value: str) -> str:
    value = value.strip()
    if value.startswith("arn:") and "/" in value:
        return value.rsplit("/", 1)[1]
    return value


def _dec(value: Any, column: str, line: int) -> Decimal:
    if value is None or value == "":
        return Decimal("0")
    try:
        return Decimal(str(value))
    except InvalidOperation as exc:
        raise BillError(f"row {line}: {column} {value!r} is not a number") from exc


def _time(value: Any, column: str, line: int) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        parsed = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise BillError(f"row {line}: {column} {value!r} is not an ISO 8601 time") from exc
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a FOCUS export as dicts (CSV, CSV.gz or Parquet by file name)."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise BillError("reading Parquet needs pyarrow (pip install 'overspill[parquet]')") from exc
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
            raise BillError(f"{path.name} is not a readable Parquet file ({exc})") from exc
        missing = [c for c in REQUIRED if c not in table.column_names]
        if missing:
            raise BillError(f"column {missing[0]} is missing (a FOCUS export has {', '.join(REQUIRED)})")
        extra = ("EffectiveCost", "ListCost", "ProviderName", "BillingPeriodStart", "BillingPeriodEnd")
        wanted = [c for c in (*REQUIRED, *extra) if c in table.column_names]
        yield from table.select(wanted).to_pylist()
        return
    raw = path.read_bytes()
    try:
        if name.endswith(".gz"):
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8-sig")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise BillError(
            f"{path.name} is not a readable {'gzip-compressed ' if name.endswith('.gz') else ''}UTF-8 CSV file ({exc})"
        ) from exc
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise BillError(f"column {missing[0]} is missing (a FOCUS export has {', '.join(REQUIRED)})")
    yield from reader


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
    for n, row in enumerate(read_rows(path), start=2):
        rows += 1
        cost = _dec(row.get("BilledCost"), "BilledCost", n)
        billed += cost
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
        slot[0] += cost
        slot[1] += _dec(row.get("EffectiveCost"), "EffectiveCost", n)
        slot[2] += _dec(row.get("ListCost"), "ListCost", n)
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
