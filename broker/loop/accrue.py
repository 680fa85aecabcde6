"""Tick step: accrue cost for every started placement up to now (or its end), as append-only ledger entries.

Each entry covers `[accrued_until, end)` at the pool's price in effect when accrued (spot prices move mid-run)
and records the on-demand counterfactual for savings. Amounts telescope within a stretch at one price: an
entry is `Q(price x hours since the stretch began) - Q(price x hours already accrued in it)`, with Q rounding to
1e-10 USD, so the entries of a stretch sum to exactly `Q(price x its duration)`, however many ticks cut it.
The placement's `accrued_until`, its `cost_usd`, the job's `spent_usd` and the entry are written in one
transaction under row locks, so a crash or a second replica can neither skip nor double-count a second.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlmodel import Session, col, or_, select

from broker.crashpoints import crashpoint
from broker.loop.common import locked
from broker.runtime import Runtime
from broker.services.jobs import add_event
from broker.tables import CostEntryRow, Job, Placement
from providers.model import CostKind, PlacementState, hours_between

LEDGER_QUANTUM = Decimal("0.0000000001")


def _telescoped(hourly: Decimal, seg_start: datetime, start: datetime, end: datetime) -> Decimal:
    before = (hourly * hours_between(seg_start, start)).quantize(LEDGER_QUANTUM)
    return (hourly * hours_between(seg_start, end)).quantize(LEDGER_QUANTUM) - before


def accrue_costs(rt: Runtime, now: datetime) -> int:
    """Returns the number of ledger entries written."""
    book = rt.catalog.book(now)
    with Session(rt.engine) as session:
        ids = session.exec(
            select(Placement.id).where(
                col(Placement.started_at).is_not(None),
                or_(
                    Placement.state == PlacementState.RUNNING.value,
                    col(Placement.accrued_until) < col(Placement.ended_at),
                ),
            )
        ).all()
    written = 0
    for pid in ids:
        with Session(rt.engine) as session:
            p = session.exec(locked(select(Placement).where(Placement.id == pid))).first()
            if p is None or p.started_at is None:
                continue
            start = p.accrued_until or p.started_at
            end = min(now, p.ended_at) if p.ended_at else now
            if end <= start:
                continue
            job = session.exec(select(Job).where(Job.id == p.job_id).with_for_update()).one()
            current = book.get(p.offering_key)
            hourly = current.price.hourly_usd if current is not None else (p.price_segment_hourly_usd or p.hourly_usd)
            twin = book.on_demand_price(current) if current is not None else None
            od_hourly = twin.price.hourly_usd if twin is not None else p.on_demand_hourly_usd
            seg_start = p.price_segment_started_at
            if seg_start is None or p.price_segment_hourly_usd != hourly:
                seg_start = p.price_segment_started_at = start
                p.price_segment_hourly_usd = hourly
            hours = hours_between(start, end)
            usd = _telescoped(hourly, seg_start, start, end)
            od_usd = (od_hourly * hours).quantize(LEDGER_QUANTUM)
            session.add(
                CostEntryRow(
                    job_id=job.id,
                    placement_id=p.id,
                    tenant=job.tenant,
                    team=job.team,
                    project=job.project,
                    provider=p.provider,
                    capacity_type=p.capacity_type,
                    kind=CostKind.COMPUTE.value,
                    period_start_at=start,
                    period_end_at=end,
                    hourly_usd=hourly,
                    usd=usd,
                    on_demand_usd=od_usd,
                    created_at=now,
                )
            )
            p.accrued_until = end
            p.cost_usd = p.cost_usd + usd
            job.spent_usd = job.spent_usd + usd
            session.add(p)
            session.add(job)
            add_event(
                session,
                job,
                end,
                "cost_accrued",
                f"${usd.quantize(Decimal('0.0001'))} for {hours.quantize(Decimal('0.001'))} h at ${hourly}/h",
                placement_id=p.id,
                usd=str(usd),
                spent_usd=str(job.spent_usd),
            )
            crashpoint("accrue.before_commit")
            session.commit()
            crashpoint("accrue.after_commit")
            written += 1
    return written
