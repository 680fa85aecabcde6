"""CSV report: one row per UTC day, team, project, job, where it ran (provider, region, zone, instance type,
resource id, capacity type) and kind, with quantity, cost, on-demand equivalent and what spot saved.

Rounded for people and spreadsheets (`broker.finance.money`): money in cents, `cost_usd` and `savings_usd` each
allocated so that the rows add up exactly to the period's rounded total, and `on_demand_usd` = `cost_usd` +
`savings_usd` on every row; quantities to 4 decimals. `on_demand_usd` is the
on-demand equivalent of the row's useful work (0 on a `wasted` row: lost work is a loss, and on-demand capacity
would not have lost it), `savings_usd` what spot saved on it (0 on a `wasted` row). `data_as_of` (every row: a
CSV has no header block) is the ledger's latest accrued time in the period. The exact amounts are in the FOCUS
export. Rows are sorted by their keys; no generation time inside: same period, same ledger, same bytes.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC
from decimal import Decimal

from broker.finance.costs import WASTED, ZERO, Sums, day_of, shown
from broker.finance.money import plain, quantity
from broker.finance.reports.data import ReportData

HEADER = (
    "date",
    "team",
    "project",
    "job_id",
    "provider",
    "region",
    "zone",
    "instance_type",
    "resource_id",
    "capacity_type",
    "kind",
    "quantity",
    "unit",
    "cost_usd",
    "on_demand_usd",
    "savings_usd",
    "entries",
    "data_as_of",
)


def detail_rows(data: ReportData) -> list[tuple[tuple[str, ...], Sums, Decimal]]:
    """(keys, sums, quantity) per CSV row, sorted."""
    rows: dict[tuple[str, ...], tuple[Sums, list[Decimal]]] = {}
    for e in data.entries:
        key = (
            day_of(e),
            e.team,
            e.project,
            e.job_id,
            e.provider,
            e.region,
            e.zone,
            e.instance_type,
            e.resource_id,
            e.capacity_type,
            e.kind,
            e.unit,
        )
        slot = rows.get(key)
        if slot is None:
            slot = rows[key] = (Sums(), [Decimal("0")])
        slot[0].add(e)
        slot[1][0] += e.quantity
    return [(k, s, q[0]) for k, (s, q) in sorted(rows.items())]


def render_csv(data: ReportData) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    rows = detail_rows(data)
    lines, _ = shown([sums for _, sums, _ in rows])
    as_of = data.as_of.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if data.as_of else ""
    for (key, sums, qty), line in zip(rows, lines, strict=True):
        *where, unit = key
        writer.writerow(
            [
                *where,
                quantity(qty),
                unit,
                plain(line.cost_usd),
                plain(line.on_demand_usd if key[10] != WASTED else ZERO),
                plain(line.savings_usd),
                sums.entries,
                as_of,
            ]
        )
    return out.getvalue().encode()
