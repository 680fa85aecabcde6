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
Placements are accrued `loop_batch_size` (a setting) to a transaction (one commit and a few statements per
batch rather than per placement: with thousands of running jobs the step would otherwise dominate the tick).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from sqlmodel import Session, col, or_, select

from broker.crashpoints import crashpoint
from broker.finance.ledger import LEDGER_QUANTUM, day_cuts, record_entry, record_wasted
from broker.loop.common import lock_batch
from broker.runtime import Runtime
from broker.services.jobs import add_event
from broker.tables import Job, Placement
from pricing.book import PriceBook
from pricing.extras import ExtraCharge
from providers.model import CostKind, PlacementState, hours_between


def _telescoped(hourly: Decimal, seg_start: datetime, start: datetime, end: datetime) -> Decimal:
    before = (hourly * hours_between(seg_start, start)).quantize(LEDGER_QUANTUM)
    return (hourly * hours_between(seg_start, end)).quantize(LEDGER_QUANTUM) - before


def accrue_costs(rt: Runtime, now: datetime) -> int:
    """Returns the number of ledger entries written."""
    book = rt.catalog.book(now)
    with Session(rt.engine) as session:
        ids = session.exec(
            select(Placement.id)
            .where(
                col(Placement.started_at).is_not(None),
                or_(
                    Placement.state == PlacementState.RUNNING.value,
                    col(Placement.accrued_until) < col(Placement.ended_at),
                ),
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


def _accrue_batch(rt: Runtime, ids: Sequence[str], book: PriceBook, now: datetime, extras: Extras) -> int:
    """Accrue a batch of placements in one transaction: the placements row-locked (skipping those another replica
    holds), then their jobs locked in id order, so two replicas' batches never wait on each other in a cycle."""
    with Session(rt.engine) as session:
        placements, jobs = lock_batch(session, ids, lambda p: _unaccrued(p, now))
        if not placements:
            return 0
        written = 0
        for p in placements:
            written += _accrue_one(session, p, jobs[p.job_id], book, now, extras.get((p.provider, p.capacity_type), ()))
            crashpoint("accrue.before_commit")  # each placement's entries written, the batch not committed yet
        session.commit()
        crashpoint("accrue.after_commit")
    return written


def _accrual_end(p: Placement, now: datetime) -> datetime:
    return min(now, p.ended_at) if p.ended_at else now


def _unaccrued(p: Placement, now: datetime) -> bool:
    """`p` started and has run past what is accrued (up to now, or its end)."""
    return p.started_at is not None and _accrual_end(p, now) > (p.accrued_until or p.started_at)


def _accrue_one(
    session: Session,
    p: Placement,
    job: Job,
    book: PriceBook,
    now: datetime,
    extras: tuple[ExtraCharge, ...] = (),
) -> int:
    """Write `p`'s entries (compute, then each of `extras`) from `accrued_until` to now (or its end) and move its
    marks; returns entries written."""
    assert p.started_at is not None
    start = p.accrued_until or p.started_at
    end = _accrual_end(p, now)
    current = book.get(p.offering_key)
    hourly = current.price.hourly_usd if current is not None else (p.price_segment_hourly_usd or p.hourly_usd)
    twin = book.on_demand_price(current) if current is not None else None
    # no on-demand twin priced (or the pool is its own twin: on-demand, on-prem): claim no saving
    od_hourly = None if twin is None or twin is current else twin.price.hourly_usd
    seg_start = p.price_segment_started_at
    if seg_start is None or p.price_segment_hourly_usd != hourly:
        seg_start = p.price_segment_started_at = start
        p.price_segment_hourly_usd = hourly
    hours = hours_between(start, end)
    usd = Decimal("0")
    written = 0
    for a, b in day_cuts(start, end):
        part = _telescoped(hourly, seg_start, a, b)
        record_entry(
            session,
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
        usd += part
        written += 1
    extras_usd = Decimal("0")
    for charge in extras:
        for a, b in day_cuts(start, end):
            part = _telescoped(charge.hourly_usd, p.started_at, a, b)  # a constant rate since the start
            record_entry(
                session,
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
            extras_usd += part
            written += 1
    p.accrued_until = end
    p.cost_usd = p.cost_usd + usd + extras_usd
    session.add(p)
    message = f"${usd.quantize(Decimal('0.0001'))} for {hours.quantize(Decimal('0.001'))} h at ${hourly}/h"
    if extras:
        message += f" + ${extras_usd.quantize(Decimal('0.0001'))} " + " and ".join(c.description for c in extras)
    add_event(
        session,
        job,
        end,
        "cost_accrued",
        message,
        placement_id=p.id,
        usd=str(usd + extras_usd),
        compute_usd=str(usd),
        extras_usd=str(extras_usd),
        spent_usd=str(job.spent_usd),
    )
    if p.state == PlacementState.PREEMPTED.value and p.ended_at is not None and end >= p.ended_at:
        session.flush()
        record_wasted(session, job, p, now)
    return written
