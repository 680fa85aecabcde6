"""Writing the cost ledger: every append goes through here, so attribution and the job's total stay consistent.

Contract, for every function: the caller holds the job's row (`SELECT ... FOR UPDATE` on PostgreSQL) in the
session it passes, and commits. A function adds `cost_entry` rows and moves `job.spent_usd` by exactly the sum
it added, in that session, so the entry and the job total commit or roll back together. Rows are never updated
or deleted: a mistake is fixed by a `correction` row that names the row it corrects. The one exception to
"exactly the sum": `job.spent_usd` counts an entry's corrections only while their sum is positive, so a credit
never lowers it below what the broker accrued (the ceiling guard reads it); corrections are bounded too (see
`record_correction`).

Kinds (`providers.model.CostKind`): `compute` (the tick's accrual, `broker.loop.accrue`), `wasted` (the part of
a preempted placement's compute whose work was lost and redone elsewhere: written as the pair compute -X /
wasted +X, so totals are unchanged and the split shows the overhead), `egress` (checkpoint copies between
clouds), `storage` (checkpoint storage) and `correction`.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sqlmodel import Session, col, select

from broker.store.tables import CostEntryRow, Job, Placement
from providers.model import CostKind, hours_between

LEDGER_QUANTUM = Decimal("0.0000000001")
CORRECTION_MAX_FACTOR = Decimal("2")


class LedgerError(ValueError):
    """A ledger write that would make the books wrong (unknown entry, mismatched job)."""


def entry_values(
    job: Job,
    *,
    kind: CostKind,
    usd: Decimal,
    start: datetime,
    end: datetime,
    now: datetime,
    placement: Placement | None = None,
    provider: str | None = None,
    region: str | None = None,
    capacity_type: str | None = None,
    on_demand_usd: Decimal | None = None,
    hourly_usd: Decimal = Decimal("0"),
    quantity: Decimal = Decimal("0"),
    unit: str = "Hours",
    resource_id: str | None = None,
    corrects_id: int | None = None,
    note: str = "",
) -> dict[str, Any]:
    """The `cost_entry` columns of one entry, checked and rounded as `record_entry` writes them, as a plain dict
    for a bulk insert (a caller writing many entries at once adds their `usd` to the job's spend itself)."""
    if end < start:
        raise LedgerError(f"entry period ends ({end}) before it starts ({start})")
    if placement is not None and placement.job_id != job.id:
        raise LedgerError(f"placement {placement.id} belongs to job {placement.job_id}, not {job.id}")
    usd = usd.quantize(LEDGER_QUANTUM)
    return {
        "job_id": job.id,
        "placement_id": placement.id if placement else None,
        "tenant": job.tenant,
        "team": job.team,
        "project": job.project,
        "provider": provider or (placement.provider if placement else ""),
        "region": region if region is not None else (placement.region if placement else ""),
        "zone": placement.zone if placement else "",
        "instance_type": placement.instance_type if placement else "",
        "resource_id": resource_id if resource_id is not None else ((placement.instance_id or "") if placement else ""),
        "capacity_type": capacity_type or (placement.capacity_type if placement else ""),
        "kind": kind.value,
        "period_start_at": start,
        "period_end_at": end,
        "hourly_usd": hourly_usd,
        "usd": usd,
        "on_demand_usd": (on_demand_usd if on_demand_usd is not None else usd).quantize(LEDGER_QUANTUM),
        "quantity": quantity,
        "unit": unit,
        "corrects_id": corrects_id,
        "note": note[:500],
        "created_at": now,
    }


def record_entry(
    session: Session,
    job: Job,
    *,
    kind: CostKind,
    usd: Decimal,
    start: datetime,
    end: datetime,
    now: datetime,
    placement: Placement | None = None,
    provider: str | None = None,
    region: str | None = None,
    capacity_type: str | None = None,
    on_demand_usd: Decimal | None = None,
    hourly_usd: Decimal = Decimal("0"),
    quantity: Decimal = Decimal("0"),
    unit: str = "Hours",
    resource_id: str | None = None,
    corrects_id: int | None = None,
    note: str = "",
) -> CostEntryRow:
    """Append one entry for `job` and add `usd` to its spend. Attribution (tenant, team, project) comes from the
    job; where it ran comes from `placement` unless given. `on_demand_usd` defaults to `usd` (no saving).

    For egress use `kind=CostKind.EGRESS, quantity=<GB>, unit="GB"`; for storage `unit="GB-Month"`."""
    values = entry_values(
        job,
        kind=kind,
        usd=usd,
        start=start,
        end=end,
        now=now,
        placement=placement,
        provider=provider,
        region=region,
        capacity_type=capacity_type,
        on_demand_usd=on_demand_usd,
        hourly_usd=hourly_usd,
        quantity=quantity,
        unit=unit,
        resource_id=resource_id,
        corrects_id=corrects_id,
        note=note,
    )
    entry = CostEntryRow(**values)
    session.add(entry)
    job.spent_usd = job.spent_usd + values["usd"]
    session.add(job)
    return entry


def record_correction(
    session: Session, job: Job, entry_id: int, usd: Decimal, note: str, now: datetime
) -> CostEntryRow:
    """Append a correction of `usd` (negative to refund) to entry `entry_id`, attributed like it.

    Bounds (LedgerError otherwise): the entry is not itself a correction and has a cost; after this correction
    the entry's net value (its `usd` plus all its corrections) lies between 0 and `CORRECTION_MAX_FACTOR` times
    its `usd` (on the same side of zero). A correction fixes a price or a quantity the broker accrued: it can
    take the entry down to nothing (a full credit) but not below, and up to twice what the broker priced it at
    (spot prices move by tens of percent between two accruals, so an honest correction stays well inside),
    which keeps a typo or a hostile finance key from adding millions to a team's spend (a hard budget) or a job's.

    The job's ceiling: `job.spent_usd` counts an entry's corrections only while their sum is positive, i.e. each
    entry weighs max(what the broker accrued, its corrected value). A charge adds to the job's spend (less room
    under `max_total_usd`); a credit changes the books (costs, reports, budgets, reconciliation) but never the
    job's remaining ceiling, which stays what the broker's own accrual left it; undoing a charge gives back what
    it took, no more. Finance cannot edit jobs; the job's owner raises `max_total_usd` if a refund should buy
    more compute."""
    original = session.get(CostEntryRow, entry_id)
    if original is None or original.job_id != job.id:
        raise LedgerError(f"entry {entry_id} is not a ledger entry of job {job.id}")
    if original.kind == CostKind.CORRECTION.value:
        raise LedgerError(f"entry {entry_id} is a correction: correct the entry it corrects ({original.corrects_id})")
    usd = usd.quantize(LEDGER_QUANTUM)
    if original.usd == 0:
        raise LedgerError(f"entry {entry_id} has no cost to correct")
    if usd == 0:
        raise LedgerError("a correction of 0 USD changes nothing")
    earlier = list(session.exec(select(CostEntryRow.usd).where(CostEntryRow.corrects_id == entry_id)).all())
    net = original.usd + sum(earlier, Decimal("0")) + usd
    low, high = sorted((Decimal("0"), original.usd * CORRECTION_MAX_FACTOR))
    if not low <= net <= high:
        raise LedgerError(
            f"entry {entry_id} is {original.usd} USD; with its corrections it must stay between {low} and {high} USD "
            f"(0 to {CORRECTION_MAX_FACTOR}x), and this correction would make it {net} USD"
        )
    entry = record_entry(
        session,
        job,
        kind=CostKind.CORRECTION,
        usd=usd,
        start=original.period_start_at,
        end=original.period_end_at,
        now=now,
        provider=original.provider,
        region=original.region,
        capacity_type=original.capacity_type,
        on_demand_usd=usd,
        resource_id=original.resource_id,
        corrects_id=entry_id,
        note=note or f"correction of entry {entry_id}",
    )
    before = sum(earlier, Decimal("0"))
    counted = max(Decimal("0"), before + usd) - max(Decimal("0"), before)  # what the ceiling guard sees of it
    job.spent_usd = job.spent_usd - usd + counted  # record_entry added all of `usd`
    return entry


def wasted_hours(p: Placement) -> Decimal:
    """Hours a preempted placement ran beyond what its last checkpoint saved (0 before it has ended)."""
    if p.started_at is None or p.ended_at is None or p.saved_work_hours is None:
        return Decimal("0")
    ran = hours_between(p.started_at, p.ended_at)
    return min(ran, max(Decimal("0"), ran - p.saved_work_hours))


def day_cuts(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """`[start, end)` split at every UTC midnight inside it (entries never straddle a day)."""
    cuts: list[tuple[datetime, datetime]] = []
    while True:
        midnight = datetime.combine(start.date() + timedelta(days=1), time(0), tzinfo=start.tzinfo)
        if midnight >= end:
            cuts.append((start, end))
            return cuts
        cuts.append((start, midnight))
        start = midnight


def record_wasted(session: Session, job: Job, p: Placement, now: datetime) -> Decimal:
    """Reclassify the compute of a preempted placement's lost work (its last `wasted_hours`) as `wasted`, priced
    at what those hours cost (the compute entries covering them, pro rata), one pair per UTC day. Call once,
    after its compute is fully accrued (accrued_until == ended_at). Returns the amount moved; the job's total
    does not change."""
    hours = wasted_hours(p)
    if hours <= 0 or p.ended_at is None:
        return Decimal("0")
    window_start = p.ended_at - timedelta(microseconds=int(hours * Decimal(3_600_000_000)))
    rows = session.exec(
        select(CostEntryRow).where(
            CostEntryRow.placement_id == p.id,
            CostEntryRow.kind == CostKind.COMPUTE.value,
            col(CostEntryRow.period_end_at) > window_start,
        )
    ).all()
    moved = Decimal("0")
    for a, b in day_cuts(window_start, p.ended_at):
        usd = od = Decimal("0")
        for r in rows:
            span = hours_between(r.period_start_at, r.period_end_at)
            overlap = hours_between(max(r.period_start_at, a), min(r.period_end_at, b))
            if r.usd < 0 or span <= 0 or overlap <= 0:
                continue
            usd += r.usd * overlap / span
            od += r.on_demand_usd * overlap / span
        usd, od = usd.quantize(LEDGER_QUANTUM), od.quantize(LEDGER_QUANTUM)
        if usd == 0:
            continue
        part = hours_between(a, b)
        note = f"{part.quantize(Decimal('0.0001'))} h since the last checkpoint lost to a preemption"
        record_entry(
            session,
            job,
            kind=CostKind.COMPUTE,
            usd=-usd,
            on_demand_usd=-od,
            start=a,
            end=b,
            now=now,
            placement=p,
            quantity=-part,
            note=note,
        )
        record_entry(
            session,
            job,
            kind=CostKind.WASTED,
            usd=usd,
            on_demand_usd=od,
            start=a,
            end=b,
            now=now,
            placement=p,
            quantity=part,
            note=note,
        )
        moved += usd
    return moved
