"""Tick step: accrue cost for every started placement up to now (or its end), as append-only ledger entries.

Each entry covers `[accrued_until, end)` at the pool's price in effect when accrued (spot prices move mid-run)
and records the on-demand counterfactual for savings. Amounts telescope within a stretch at one price: an
entry is `Q(price x hours since the stretch began) - Q(price x hours already accrued in it)`, with Q rounding to
1e-10 USD, so the entries of a stretch sum to exactly `Q(price x its duration)`, however many ticks cut it.
Entries are also cut at UTC midnight, so every day and month holds exactly its own cost (reports never
prorate). On-prem placements accrue the same way at their pool's internal rate (`onprem_rate_usd_per_gpu_hour`
or a Slurm partition's `rate_usd_per_gpu_hour`).
When a preempted placement's last second is accrued, the compute since its last checkpoint is reclassified as
`wasted` (`broker.finance.ledger.record_wasted`).
Beside compute, a cloud instance bills its boot disk and its public IPv4 address (`rt.extras`, list prices from
`pricing.extras`, settings `OVERSPILL_DISK_USD_PER_GB_MONTH` / `OVERSPILL_PUBLIC_IPV4_USD_PER_HOUR`): each is its
own ledger entry over the same stretch as the compute, kind `disk` (unit GB-Hours, the billed size) or `public_ip`
(unit Hours), at a constant rate telescoped from the placement's start (so its entries also sum exactly), with no
spot saving (`on_demand_usd` = cost). They count in the placement's `cost_usd` and the job's `spent_usd`, so
budgets and ceilings see them; FOCUS reports them as Storage / Block Storage and Networking / Network
Infrastructure. The compute of lost work is reclassified as wasted; the disk and address are not (they are billed
whatever the work).
The placement's `accrued_until`, its `cost_usd`, the job's `spent_usd` and the entries are written in one
transaction under row locks, so a crash or a second replica can neither skip nor double-count a second.
Placements are accrued `loop_batch_size` (a setting) to a transaction, set-based: the batch's rows are locked and
read in two Core statements (plain rows: no ORM object per placement or job; of a job only the columns an entry
needs), every entry, event and new mark is computed in memory, and each kind of write is one statement for the
whole batch (`broker.bulk`: on PostgreSQL one statement per table for the whole batch, the columns sent as
arrays and unnested by the server, for the ledger entries, the events, the placements' marks and the jobs'
totals). Only a preempted placement's final accrual goes on through the ORM and `record_wasted` (rare: once per
preemption).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlmodel import Session, col, or_
from sqlmodel import select as orm_select

from broker.bulk import bulk_insert, bulk_update
from broker.crashpoints import crashpoint
from broker.finance.ledger import LEDGER_QUANTUM, day_cuts, entry_values, record_wasted
from broker.loop.common import in_scope
from broker.runtime import Runtime
from broker.tables import CostEntryRow, Job, JobEvent, Placement
from pricing.book import PriceBook
from pricing.extras import ExtraCharge
from providers.model import CostKind, PlacementState, hours_between

_P = Placement.__table__  # type: ignore[attr-defined]
_J = Job.__table__  # type: ignore[attr-defined]
# the placement columns accrual reads (its marks, its price, its entries' labels), not the whole row
_READ = tuple(
    _P.c[name]
    for name in (
        "id", "job_id", "state", "provider", "region", "zone", "instance_type", "instance_id", "capacity_type",
        "offering_key", "hourly_usd", "started_at", "ended_at", "accrued_until", "cost_usd",
        "price_segment_started_at", "price_segment_hourly_usd",
    )
)  # fmt: skip
_E = CostEntryRow.__table__  # type: ignore[attr-defined]
_V = JobEvent.__table__  # type: ignore[attr-defined]


def _telescoped(hourly: Decimal, seg_start: datetime, start: datetime, end: datetime) -> Decimal:
    before = (hourly * hours_between(seg_start, start)).quantize(LEDGER_QUANTUM)
    return (hourly * hours_between(seg_start, end)).quantize(LEDGER_QUANTUM) - before


def accrue_costs(rt: Runtime, now: datetime) -> int:
    """Returns the number of ledger entries written (for the placements of this replica's shards)."""
    book = rt.catalog.book(now)
    with Session(rt.engine) as session:
        ids = session.exec(
            orm_select(Placement.id)
            .where(
                col(Placement.started_at).is_not(None),
                or_(
                    Placement.state == PlacementState.RUNNING.value,
                    col(Placement.accrued_until) < col(Placement.ended_at),
                ),
                in_scope(rt, Placement.id),
            )
            .order_by(col(Placement.id))
        ).all()
    written = 0
    size = rt.settings.loop_batch_size
    extras = {
        (provider, capacity): ex.charges(capacity)
        for provider, ex in rt.extras.items()
        for capacity in ("spot", "on_demand", "reserved")
    }
    for start in range(0, len(ids), size):
        written += _accrue_batch(rt, ids[start : start + size], book, now, extras)
    return written


Extras = dict[tuple[str, str], tuple[ExtraCharge, ...]]


@dataclass
class _Writes:
    """What one batch writes, gathered in memory and sent as one statement per kind."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    marks: list[dict[str, Any]] = field(default_factory=list)
    spent: dict[str, Decimal] = field(default_factory=dict)  # job id -> its new spent_usd

    def send(self, session: Session) -> None:
        conn = session.connection()
        bulk_insert(conn, _E, self.entries)
        bulk_insert(conn, _V, self.events)
        bulk_update(conn, _P, "id", self.marks)
        bulk_update(conn, _J, "id", [{"id": job_id, "spent_usd": usd} for job_id, usd in self.spent.items()])


def _accrue_batch(rt: Runtime, ids: Sequence[str], book: PriceBook, now: datetime, extras: Extras) -> int:
    """Accrue a batch of placements in one transaction: the placements row-locked (skipping those another replica
    holds), then their jobs locked in id order, so two replicas' batches never wait on each other in a cycle."""
    with Session(rt.engine) as session:
        placements, jobs = _lock_rows(session, ids, now)
        if not placements:
            return 0
        writes = _Writes()
        for p in placements:
            _accrue_one(p, jobs[p.job_id], book, now, extras.get((p.provider, p.capacity_type), ()), writes)
        writes.send(session)
        for p, mark in zip(placements, writes.marks, strict=True):
            crashpoint("accrue.before_commit")  # each placement's entries written, the batch not committed yet
            if (
                p.state == PlacementState.PREEMPTED.value
                and p.ended_at is not None
                and mark["accrued_until"] == p.ended_at
            ):
                # the objects read after the batch's writes (its rows are locked by this transaction)
                placement = session.get(Placement, p.id, populate_existing=True)
                job = session.get(Job, p.job_id, populate_existing=True)
                assert placement is not None and job is not None
                record_wasted(session, job, placement, now)
        session.commit()
        crashpoint("accrue.after_commit")
    return len(writes.entries)


def _lock_rows(session: Session, ids: Sequence[str], now: datetime) -> tuple[list[Any], dict[str, Any]]:
    """`broker.loop.common.lock_batch` in plain rows: the placements still to accrue (row-locked in id order,
    skipping those another replica holds), then their jobs' entry columns (locked in id order)."""
    conn = session.connection()
    placements = [
        p
        for p in conn.execute(
            select(*_READ).where(_P.c.id.in_(ids)).order_by(_P.c.id).with_for_update(skip_locked=True, of=_P)
        )
        if _unaccrued(p, now)
    ]
    if not placements:
        return [], {}
    job_ids = sorted({p.job_id for p in placements})
    jobs = conn.execute(
        select(_J.c.id, _J.c.tenant, _J.c.team, _J.c.project, _J.c.spent_usd)
        .where(_J.c.id.in_(job_ids))
        .order_by(_J.c.id)
        .with_for_update()
    )
    return placements, {j.id: j for j in jobs}


def _accrual_end(p: Any, now: datetime) -> datetime:
    return min(now, p.ended_at) if p.ended_at else now


def _unaccrued(p: Any, now: datetime) -> bool:
    """`p` started and has run past what is accrued (up to now, or its end)."""
    return p.started_at is not None and _accrual_end(p, now) > (p.accrued_until or p.started_at)


def _accrue_one(
    p: Any,
    job: Any,
    book: PriceBook,
    now: datetime,
    extras: tuple[ExtraCharge, ...],
    writes: _Writes,
) -> None:
    """Add to `writes` `p`'s entries (compute, then each of `extras`) from `accrued_until` to now (or its end), its
    `cost_accrued` event, its new marks and its job's new total. Reads `p` and `job` (a placement and a job, as
    objects or rows), changes neither."""
    assert p.started_at is not None
    start = p.accrued_until or p.started_at
    end = _accrual_end(p, now)
    current = book.get(p.offering_key)
    hourly = current.price.hourly_usd if current is not None else (p.price_segment_hourly_usd or p.hourly_usd)
    twin = book.on_demand_price(current) if current is not None else None
    # no on-demand twin priced (or the pool is its own twin: on-demand, on-prem): claim no saving
    od_hourly = None if twin is None or twin is current else twin.price.hourly_usd
    seg_start, seg_hourly = p.price_segment_started_at, p.price_segment_hourly_usd
    if seg_start is None or seg_hourly != hourly:
        seg_start, seg_hourly = start, hourly
    hours = hours_between(start, end)
    spent = writes.spent.get(job.id, job.spent_usd)
    usd = Decimal("0")
    for a, b in day_cuts(start, end):
        part = _telescoped(hourly, seg_start, a, b)
        entry = entry_values(
            job,
            kind=CostKind.COMPUTE,
            usd=part,
            start=a,
            end=b,
            now=now,
            placement=p,
            hourly_usd=hourly,
            on_demand_usd=part if od_hourly is None else od_hourly * hours_between(a, b),
            quantity=hours_between(a, b),
        )
        writes.entries.append(entry)
        usd += part
        spent += entry["usd"]
    extras_usd = Decimal("0")
    for charge in extras:
        for a, b in day_cuts(start, end):
            part = _telescoped(charge.hourly_usd, p.started_at, a, b)  # a constant rate since the start
            entry = entry_values(
                job,
                kind=charge.kind,
                usd=part,
                start=a,
                end=b,
                now=now,
                placement=p,
                hourly_usd=charge.hourly_usd,
                on_demand_usd=part,
                quantity=charge.quantity_per_hour * hours_between(a, b),
                unit=charge.unit,
                note=charge.description,
            )
            writes.entries.append(entry)
            extras_usd += part
            spent += entry["usd"]
    writes.spent[job.id] = spent
    writes.marks.append(
        {
            "id": p.id,
            "accrued_until": end,
            "cost_usd": p.cost_usd + usd + extras_usd,
            "price_segment_started_at": seg_start,
            "price_segment_hourly_usd": seg_hourly,
        }
    )
    message = f"${usd.quantize(Decimal('0.0001'))} for {hours.quantize(Decimal('0.001'))} h at ${hourly}/h"
    if extras:
        message += f" + ${extras_usd.quantize(Decimal('0.0001'))} " + " and ".join(c.description for c in extras)
    writes.events.append(
        {
            "job_id": job.id,
            "tenant": job.tenant,
            "at": end,
            "kind": "cost_accrued",
            "message": message[:1000],
            "data": {
                "placement_id": p.id,
                "usd": str(usd + extras_usd),
                "compute_usd": str(usd),
                "extras_usd": str(extras_usd),
                "spent_usd": str(spent),
            },
        }
    )
