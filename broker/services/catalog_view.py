"""Read models over the catalog: pools with freshness, quotes for a job spec, on-prem pressure."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlmodel import Session, select

from broker.api.schemas import (
    JobCreate,
    OfferingPublic,
    PressurePublic,
    PricePoint,
    QuoteCandidate,
    QuoteRejection,
    QuoteResponse,
)
from broker.loop.common import active_blocklist
from broker.loop.place import extra_hourly, launchable_providers, storeless_providers
from broker.runtime import Runtime
from broker.services.accelerator_names import check_accelerators
from broker.services.jobs import check_checkpoint_uri, check_secret_refs, new_id, spec_of
from broker.store.db import plain
from broker.store.tables import FeedStatus, Job, PressureRow, PriceChange
from federation.placement import PlacementContext, quote
from providers.model import Offering


def feed_health(rt: Runtime, now: datetime) -> dict[str, bool]:
    """Per feed: True when its last refresh succeeded within the staleness limit and no failure came since.

    Imported catalogs (`catalog:*`) are static snapshots; they are fresh as long as they are loaded.
    """
    limit = rt.settings.price_stale_after_seconds
    with Session(rt.engine) as session:
        statuses = session.exec(select(FeedStatus)).all()
    health = {}
    for f in statuses:
        ok = f.last_success_at is not None and (now - f.last_success_at).total_seconds() <= limit
        failed_since = f.last_error_at is not None and (
            f.last_success_at is None or f.last_error_at > f.last_success_at
        )
        health[f.name] = f.name.startswith("catalog:") or (ok and not failed_since)
    return health


def offering_public(off: Offering, now: datetime, feed: str, feed_fresh: bool) -> OfferingPublic:
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
        usd_per_gpu_hour=plain(off.usd_per_gpu_hour.quantize(Decimal("0.000001"))),
        price_source=off.price.source,
        feed=feed,
        observed_at=off.price.observed_at,
        age_seconds=round(age, 1),
        stale=not feed_fresh,
        estimated=off.price.estimated,
        interruption_rate_per_hour=off.interruption_rate_per_hour,
        interruption_basis=off.interruption_basis,
        egress_usd_per_gb=off.egress_usd_per_gb,
        expected_wait_hours=round(off.expected_wait_hours, 3),
        available=off.available,
        simulated=off.simulated,
    )


def _public(rt: Runtime, off: Offering, now: datetime, health: dict[str, bool]) -> OfferingPublic:
    feed = rt.catalog.feed_of(off.key)
    return offering_public(off, now, feed, health.get(feed, False))


def list_pools(
    rt: Runtime, *, accelerator: str | None, provider: str | None, capacity_type: str | None, limit: int
) -> list[OfferingPublic]:
    now = rt.clock()
    book = rt.catalog.book(now)
    offs = sorted(book, key=lambda o: (o.accelerator, o.price.hourly_usd, o.key))
    health = feed_health(rt, now)
    out = []
    for off in offs:
        if accelerator and off.accelerator != accelerator:
            continue
        if provider and off.provider != provider:
            continue
        if capacity_type and off.capacity_type.value != capacity_type:
            continue
        out.append(_public(rt, off, now, health))
        if len(out) >= limit:
            break
    return out


def quote_job(rt: Runtime, tenant: str, create: JobCreate, limit: int) -> QuoteResponse:
    """Rank every pool for the spec without submitting it; every rejected pool carries its reason. A
    `checkpoint_uri` outside the tenant's checkpoint prefixes is refused as at submission."""
    check_checkpoint_uri(rt.checkpoint_stores, tenant, create.checkpoint_uri)
    check_secret_refs(rt.settings, tenant, create)
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
    check_accelerators(spec.accelerators, book)
    with Session(rt.engine) as session:
        blocklist = active_blocklist(session, now)
    ctx = PlacementContext(
        now=now,
        remaining_work_hours=spec.work_hours,
        blocklist=blocklist,
        params=rt.params,
        launchable=launchable_providers(rt),  # priced pools nothing here launches on: rejected no_launch_adapter
        extra_hourly_usd=extra_hourly(rt),
        no_checkpoint_store=storeless_providers(rt),
    )
    q = quote(spec, book, ctx)
    health = feed_health(rt, now)
    return QuoteResponse(
        feasible=q.ever_feasible,
        placeable_now=q.best is not None,
        wait_reason=q.wait_reason(),
        candidates=[
            QuoteCandidate(
                rank=i + 1,
                offering=_public(rt, c.offering, now, health),
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


def price_history(
    rt: Runtime, offering_key: str, start: datetime | None, end: datetime | None, limit: int
) -> list[PricePoint]:
    """Every recorded change of one pool's price in `[start, end)`, oldest first."""
    query = select(PriceChange).where(PriceChange.offering_key == offering_key)
    if start is not None:
        query = query.where(PriceChange.observed_at >= start)
    if end is not None:
        query = query.where(PriceChange.observed_at < end)
    with Session(rt.engine) as session:
        rows = session.exec(query.order_by(PriceChange.observed_at, PriceChange.id).limit(limit)).all()
    return [
        PricePoint(
            offering_key=r.offering_key,
            hourly_usd=r.hourly_usd,
            price_source=r.price_source,
            estimated=r.estimated,
            feed=r.feed,
            observed_at=r.observed_at,
        )
        for r in rows
    ]
