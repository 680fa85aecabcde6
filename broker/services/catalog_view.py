"""Read models over the catalog: pools with freshness, quotes for a job spec, on-prem pressure."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, select

from broker.loop.common import active_blocklist
from broker.runtime import Runtime
from broker.schemas import (
    JobCreate,
    OfferingPublic,
    PressurePublic,
    QuoteCandidate,
    QuoteRejection,
    QuoteResponse,
)
from broker.services.jobs import new_id, spec_of
from broker.tables import Job, PressureRow
from federation.placement import PlacementContext, quote
from providers.model import Offering


def offering_public(off: Offering, now: datetime, stale_after_seconds: float) -> OfferingPublic:
    age = max(0.0, (now - off.price.observed_at).total_seconds())
    return OfferingPublic(
        key=off.key,
        provider=off.provider,
        region=off.region,
        zone=off.zone,
        instance_type=off.instance_type,
        accelerator=off.accelerator,
        accelerator_count=off.accelerator_count,
        gpu_memory_gib=off.gpu_memory_gib,
        vcpus=off.vcpus,
        memory_gib=off.memory_gib,
        capacity_type=off.capacity_type.value,
        hourly_usd=off.price.hourly_usd,
        price_source=off.price.source,
        observed_at=off.price.observed_at,
        age_seconds=round(age, 1),
        stale=age > stale_after_seconds,
        estimated=off.price.estimated,
        interruption_rate_per_hour=off.interruption_rate_per_hour,
        egress_usd_per_gb=off.egress_usd_per_gb,
        expected_wait_hours=round(off.expected_wait_hours, 3),
        available=off.available,
        simulated=off.simulated,
    )


def list_pools(
    rt: Runtime, *, accelerator: str | None, provider: str | None, capacity_type: str | None, limit: int
) -> list[OfferingPublic]:
    now = rt.clock()
    book = rt.catalog.book(now)
    offs = sorted(book, key=lambda o: (o.accelerator, o.price.hourly_usd, o.key))
    out = []
    for off in offs:
        if accelerator and off.accelerator != accelerator:
            continue
        if provider and off.provider != provider:
            continue
        if capacity_type and off.capacity_type.value != capacity_type:
            continue
        out.append(offering_public(off, now, rt.settings.price_stale_after_seconds))
        if len(out) >= limit:
            break
    return out


def quote_job(rt: Runtime, tenant: str, create: JobCreate, limit: int) -> QuoteResponse:
    """Rank every pool for the spec without submitting it; every rejected pool carries its reason."""
    now = rt.clock()
    probe = Job(
        id=new_id("quote"),
        tenant=tenant,
        team=create.team,
        project=create.project,
        name=create.name,
        spec=create.model_dump(mode="json"),
        state="pending",
        created_at=now,
        updated_at=now,
    )
    spec = spec_of(probe)
    book = rt.catalog.book(now)
    with Session(rt.engine) as session:
        blocklist = active_blocklist(session, now)
    ctx = PlacementContext(now=now, remaining_work_hours=spec.work_hours, blocklist=blocklist, params=rt.params)
    q = quote(spec, book, ctx)
    stale = rt.settings.price_stale_after_seconds
    return QuoteResponse(
        feasible=q.ever_feasible,
        placeable_now=q.best is not None,
        wait_reason=q.wait_reason(),
        candidates=[
            QuoteCandidate(
                rank=i + 1,
                offering=offering_public(c.offering, now, stale),
                expected_cost_usd=c.expected_cost_usd,
                expected_run_hours=round(c.expected_run_hours, 4),
                expected_wait_hours=round(c.expected_wait_hours, 4),
                expected_finish_at=c.expected_finish_at,
                checkpoint_transfer_usd=c.transfer_usd,
            )
            for i, c in enumerate(q.candidates[:limit])
        ],
        candidates_total=len(q.candidates),
        rejections=[
            QuoteRejection(
                offering_key=r.offering.key,
                provider=r.offering.provider,
                capacity_type=r.offering.capacity_type.value,
                hourly_usd=r.offering.price.hourly_usd,
                reason=r.reason.value,
                message=r.message,
            )
            for r in q.rejections[:limit]
        ],
        rejections_total=len(q.rejections),
        other_accelerator_pools=q.other_accelerator_pools,
    )


def list_pressure(rt: Runtime) -> list[PressurePublic]:
    with Session(rt.engine) as session:
        rows = session.exec(select(PressureRow).order_by(PressureRow.source, PressureRow.accelerator)).all()
    return [PressurePublic(**r.model_dump()) for r in rows]
