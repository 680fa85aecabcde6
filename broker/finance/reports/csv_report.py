"""CSV report: one row per UTC day, team, project, job, where it ran (provider, region, zone, instance type,
resource id, capacity type) and kind, with quantity, cost, on-demand counterfactual and savings.

Rows are sorted by those keys; money is exact decimal text. No generation time inside: same period, same bytes.
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

from broker.finance.costs import Sums, day_of, money
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
    for key, sums, quantity in detail_rows(data):
        *where, unit = key
        writer.writerow(
            [
                *where,
                money(quantity),
                unit,
                money(sums.cost_usd),
                money(sums.on_demand_usd),
                money(sums.savings_usd),
                sums.entries,
            ]
        )
    return out.getvalue().encode()
