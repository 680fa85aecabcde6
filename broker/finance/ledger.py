"""Writing the cost ledger: every append goes through here, so attribution and the job's total stay consistent.

Contract, for every function: the caller holds the job's row (`SELECT ... FOR UPDATE` on PostgreSQL) in the
session it passes, and commits. A function adds `cost_entry` rows and moves `job.spent_usd` by exactly the sum
it added, in that session, so the entry and the job total commit or roll back together. Rows are never updated
or deleted: a mistake is fixed by a `correction` row that names the row it corrects.

Kinds (`providers.model.CostKind`): `compute` (the tick's accrual, `broker.loop.accrue`), `wasted` (the part of
a preempted placement's compute whose work was lost and redone elsewhere: written as the pair compute -X /
wasted +X, so totals are unchanged and the split shows the overhead), `egress` (checkpoint copies between
clouds), `storage` (checkpoint storage) and `correction`.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from decimal import Decimal

from sqlmodel import Session, col, select

from broker.tables import CostEntryRow, Job, Placement
from providers.model import CostKind, hours_between

LEDGER_QUANTUM = Decimal("0.0000000001")


class LedgerError(ValueError):
    """A ledger write that would make the books wrong (unknown entry, mismatched job)."""


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
    if end < start:
        raise LedgerError(f"entry period ends ({end}) before it starts ({start})")
    if placement is not None and placement.job_id != job.id:
        raise LedgerError(f"placement {placement.id} belongs to job {placement.job_id}, not {job.id}")
    usd = usd.quantize(LEDGER_QUANTUM)
    entry = CostEntryRow(
        job_id=job.id,
        placement_id=placement.id if placement else None,
        tenant=job.tenant,
        team=job.team,
        project=job.project,
        provider=provider or (placement.provider if placement else ""),
        region=region if region is not None else (placement.region if placement else ""),
        zone=placement.zone if placement else "",
        instance_type=placement.instance_type if placement else "",
        resource_id=resource_id if resource_id is not None else ((placement.instance_id or "") if placement else ""),
        capacity_type=capacity_type or (placement.capacity_type if placement else ""),
        kind=kind.value,
        period_start_at=start,
        period_end_at=end,
        hourly_usd=hourly_usd,
        usd=usd,
        on_demand_usd=(on_demand_usd if on_demand_usd is not None else usd).quantize(LEDGER_QUANTUM),
        quantity=quantity,
        unit=unit,
        corrects_id=corrects_id,
        note=note[:500],
        created_at=now,
    )
    session.add(entry)
    job.spent_usd = job.spent_usd + usd
    session.add(job)
    return entry


def record_correction(
    session: Session, job: Job, entry_id: int, usd: Decimal, note: str, now: datetime
) -> CostEntryRow:
    """Append a correction of `usd` (negative to refund) to entry `entry_id`, attributed like it."""
    original = session.get(CostEntryRow, entry_id)
    if original is None or original.job_id != job.id:
        raise LedgerError(f"entry {entry_id} is not a ledger entry of job {job.id}")
    return record_entry(
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
