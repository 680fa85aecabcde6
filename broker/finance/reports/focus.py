"""FOCUS 1.2 export (FinOps Open Cost and Usage Specification, CostAndUsage dataset) of a period's ledger.

One row per UTC day, job, resource and kind. Mapping:
- BilledCost = EffectiveCost = ContractedCost = what the ledger accrued; ListCost = what the row's hours cost at
  the on-demand (list) price, as accrued (for compute lost to preemptions too: those hours were consumed).
- PricingCategory: spot is `Dynamic` (a price the provider changes without notice), on-demand and on-prem
  `Standard`; ChargeClass `Correction` for correction entries; wasted work stays Usage, marked in x_CostKind.
- What an instance bills beside compute (kinds `disk` and `public_ip`, at list price) is its own row: Storage /
  Block Storage ("<provider> Boot Disks") and Networking / Network Infrastructure ("<provider> Public IPv4
  Addresses"), `Standard` pricing even on a spot instance.
- ChargePeriodStart/End: the UTC day (end exclusive), clipped to the report period. BillingPeriodStart/End: the
  UTC calendar month of the charge (the showback statement, InvoiceId `<tenant>-<YYYY-MM>`), also for a
  month-to-date report: the billing period is the month, the charges are what has accrued so far.
- Billing account = the tenant; sub account = the team. ResourceId = the instance id the broker launched.
- Custom columns come after the FOCUS ones and are prefixed `x_`: x_Team, x_Project, x_JobId, x_PlacementId,
  x_CapacityType, x_CostKind, x_OnDemandCost (the on-demand equivalent of the row's useful work: 0 on a `wasted`
  row, on-demand capacity would not have lost it), x_Savings (what spot saved on it: x_OnDemandCost - BilledCost,
  but 0 on a `wasted` row, whose cost is a loss), x_DataAsOf (the ledger's latest accrued time in the report).
Exact values: every amount and quantity is written at the ledger's precision, 10 fractional digits (money is
kept to 1e-10 USD, so it is exact), and always with its decimals so every value parses as a decimal, never an
integer. Nothing here is rounded to cents: that is for people (`broker.finance.money`; the CSV, HTML and PDF).
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta
from decimal import Decimal

from broker.finance.costs import Entry, Sums, day_of
from broker.finance.reports.data import ReportData
from broker.finance.reports.period import parse_period

FOCUS_COLUMNS = (
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)
CUSTOM_COLUMNS = (
    "x_Team",
    "x_Project",
    "x_JobId",
    "x_PlacementId",
    "x_CapacityType",
    "x_CostKind",
    "x_OnDemandCost",
    "x_Savings",
    "x_DataAsOf",
)
COLUMNS = FOCUS_COLUMNS + CUSTOM_COLUMNS

_CLOUDS = {
    "aws": ("AWS", "Amazon Elastic Compute Cloud"),
    "gcp": ("Google Cloud", "Compute Engine"),
    "azure": ("Microsoft", "Azure Virtual Machines"),
}
# (ServiceCategory, ServiceSubcategory, service name suffix, pricing/consumed unit) per ledger kind
_SERVICE = {
    "egress": ("Networking", "Network Connectivity", "Data Transfer"),
    "storage": ("Storage", "Object Storage", "Checkpoint Storage"),
    "disk": ("Storage", "Block Storage", "Boot Disks"),  # a cloud instance's boot disk (broker.loop.accrue)
    "public_ip": ("Networking", "Network Infrastructure", "Public IPv4 Addresses"),
}


_STANDARD_PRICED = frozenset({"disk", "public_ip"})  # list prices, whatever the instance's capacity type


def _dec(d: Decimal) -> str:
    return f"{d:.10f}"


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _provider_names(provider: str, capacity_type: str, tenant: str) -> tuple[str, str]:
    """(ProviderName, compute ServiceName) of a broker provider."""
    if capacity_type == "on_prem":
        return f"{tenant} on-prem ({provider})", f"{provider} GPU cluster"
    base = provider.removeprefix("sim-")
    if base in _CLOUDS:
        name, service = _CLOUDS[base]
        if provider.startswith("sim-"):
            return f"{name} (simulated)", f"{service} (simulated)"
        return name, service
    return provider, f"{provider} compute"


def _service(provider_service: str, provider_name: str, kind: str, capacity_type: str) -> tuple[str, str, str]:
    """(ServiceCategory, ServiceSubcategory, ServiceName): one subcategory per service name, as FOCUS asks."""
    if kind in _SERVICE:
        category, sub, suffix = _SERVICE[kind]
        return category, sub, f"{provider_name} {suffix}"
    sub = "Other (Compute)" if capacity_type == "on_prem" else "Virtual Machines"
    return "Compute", sub, provider_service


def focus_rows(data: ReportData) -> list[dict[str, str]]:
    groups: dict[tuple[str, ...], tuple[Entry, Sums, list[Decimal]]] = {}  # [quantity, list cost]
    for e in data.entries:
        key = (
            day_of(e),
            e.provider,
            e.region,
            e.zone,
            e.resource_id,
            e.job_id,
            e.placement_id or "",
            e.capacity_type,
            e.kind,
            e.unit,
        )
        slot = groups.get(key)
        if slot is None:
            slot = groups[key] = (e, Sums(), [Decimal("0"), Decimal("0")])
        slot[1].add(e)
        slot[2][0] += e.quantity
        slot[2][1] += e.on_demand_usd
    as_of = _ts(data.as_of) if data.as_of else ""
    months: dict[str, tuple[datetime, datetime]] = {}
    rows = []
    for key, (first, sums, qty) in sorted(groups.items()):
        day = datetime.strptime(key[0], "%Y-%m-%d").replace(tzinfo=data.start.tzinfo)
        charge_start, charge_end = max(day, data.start), min(day + timedelta(days=1), data.end)
        provider_name, compute_service = _provider_names(first.provider, first.capacity_type, data.tenant)
        category, subcategory, service = _service(compute_service, provider_name, first.kind, first.capacity_type)
        spot = first.capacity_type == "spot" and first.kind not in _STANDARD_PRICED
        correction = first.kind == "correction"
        unit = first.unit or "Hours"
        quantity, list_cost = qty
        billing = months.get(key[0][:7])
        if billing is None:
            billing = months[key[0][:7]] = parse_period(key[0][:7])  # the calendar month: one statement per month
        billing_start, billing_end = billing
        resource = first.resource_id or first.placement_id or first.job_id
        rows.append(
            {
                "AvailabilityZone": first.zone,
                "BilledCost": _dec(sums.cost_usd),
                "BillingAccountId": data.tenant,
                "BillingAccountName": data.tenant,
                "BillingCurrency": "USD",
                "BillingPeriodEnd": _ts(billing_end),
                "BillingPeriodStart": _ts(billing_start),
                "ChargeCategory": "Usage",
                "ChargeClass": "Correction" if correction else "",
                "ChargeDescription": _description(first, provider_name),
                "ChargeFrequency": "Usage-Based",
                "ChargePeriodEnd": _ts(charge_end),
                "ChargePeriodStart": _ts(charge_start),
                "ConsumedQuantity": _dec(quantity),
                "ConsumedUnit": unit,
                "ContractedCost": _dec(sums.cost_usd),
                "EffectiveCost": _dec(sums.cost_usd),
                "InvoiceId": f"{data.tenant}-{key[0][:7]}",  # the showback statement of the month
                "InvoiceIssuerName": provider_name,
                "ListCost": _dec(list_cost),
                "PricingCategory": "Dynamic" if spot else "Standard",
                "PricingQuantity": _dec(quantity),
                "PricingUnit": unit,
                "ProviderName": provider_name,
                "PublisherName": provider_name,
                "RegionId": first.region,
                "RegionName": first.region,
                "ResourceId": resource,
                "ResourceName": resource,
                "ResourceType": "GPU instance" if category == "Compute" else service,
                "ServiceCategory": category,
                "ServiceName": service,
                "ServiceSubcategory": subcategory,
                "SkuId": first.instance_type or first.kind,
                "SubAccountId": first.team,
                "SubAccountName": first.team,
                "Tags": json.dumps({"team": first.team, "project": first.project, "job": first.job_id}, sort_keys=True),
                "x_Team": first.team,
                "x_Project": first.project,
                "x_JobId": first.job_id,
                "x_PlacementId": first.placement_id or "",
                "x_CapacityType": first.capacity_type,
                "x_CostKind": first.kind,
                "x_OnDemandCost": _dec(sums.on_demand_usd),
                "x_Savings": _dec(sums.savings_usd),
                "x_DataAsOf": as_of,
            }
        )
    return rows


def _description(e: Entry, provider_name: str) -> str:
    what = {
        "compute": "GPU compute",
        "wasted": "GPU compute lost to a preemption (work since the last checkpoint)",
        "egress": "checkpoint transfer out",
        "storage": "checkpoint storage",
        "disk": "instance boot disk",
        "public_ip": "instance public IPv4 address",
        "correction": "correction",
    }.get(e.kind, e.kind)
    where = " ".join(x for x in (e.instance_type, e.capacity_type.replace("_", "-"), e.zone or e.region) if x)
    return f"{what}, {where} on {provider_name}"


def render_focus(data: ReportData) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(focus_rows(data))
    return out.getvalue().encode()
