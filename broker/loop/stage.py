"""Pre-stage a job's latest checkpoint next to where it is about to launch, and book the transfer.

Called by `launch_placement` before the cloud launch. When the job's checkpoint lives at another location than
the placement's `(provider, region)` and a store is configured there (`broker.checkpoint_stores`), the checkpoint
(one object, or every object under a URI ending in `/`) is copied into `<store prefix><job id>/` with
`providers.storage.copy_checkpoint`: streamed, verified, and resumable across crashes and replicas through the
database-backed copy state. The job then resumes from the local copy, which becomes its checkpoint URI.

The transfer is paid by the sender: each copy's bytes read from the source (resumed prefixes included) times the
source's rate (`pricing.transfer`) is appended to the ledger as one `egress` entry and added to the job's spend in
the same transaction that repoints the job, and only if the job still points at the source, so a second replica
or a re-run never books it twice. Before copying, the transfer is priced from the objects' sizes: when what it
costs beyond the transfer the placement was admitted with (priced at the declared `checkpoint_size_gb`) no longer
fits beside the placement's expected cost under the job's ceiling, it is not started (`Staging.OVER_CEILING`).

Only one replica stages a placement at a time (a lease in the database); the others see `Staging.BUSY` and leave
the placement for a later tick, as they do after a storage failure (`Staging.FAILED`, retried next tick).
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum

from sqlmodel import Session, select

from broker.checkpoint_stores import CheckpointStores
from broker.copystate import DbCopyStateStore, claim_lease, release_lease
from broker.finance.ledger import record_entry
from broker.loop.accrue import LEDGER_QUANTUM
from broker.runtime import Runtime
from broker.services.jobs import add_event, spec_of
from broker.tables import Job, Placement
from pricing.transfer import transfer_usd_per_gb
from providers.model import CostKind, PlacementState
from providers.storage import ObjectStore, StorageError, copy_checkpoint, parse_uri, resolve
from providers.storage.copy import BYTES_PER_GB

log = logging.getLogger(__name__)

_OWNER = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # this process, as a lease holder


class Staging(StrEnum):
    NOT_NEEDED = "not_needed"  # no checkpoint, already local, or no store near the target
    STAGED = "staged"
    BUSY = "busy"  # another replica is copying it
    FAILED = "failed"  # a storage error: try again next tick
    OVER_CEILING = "over_ceiling"  # the transfer alone would break the job's ceiling


@dataclass(frozen=True, slots=True)
class StagePlan:
    """Copy `source_uri` (at `source`) into `target_prefix` (at `target`)."""

    source_uri: str
    source: tuple[str, str]
    target: tuple[str, str]
    target_prefix: str

    @property
    def target_uri(self) -> str:
        if self.source_uri.endswith("/"):
            return self.target_prefix
        return self.target_prefix + self.source_uri.rstrip("/").rsplit("/", 1)[-1]


def checkpoint_location(stores: CheckpointStores, job: Job) -> tuple[str, str] | None:
    """Where the job's checkpoint is: the configured store holding its URI, else where it last ran."""
    if job.checkpoint_uri:
        found = stores.locate(job.checkpoint_uri)
        if found is not None:
            return found
    if job.checkpoint_provider and job.checkpoint_region:
        return job.checkpoint_provider, job.checkpoint_region
    return None


def plan_staging(stores: CheckpointStores, job: Job, target: tuple[str, str]) -> StagePlan | None:
    """The copy a launch at `target` needs, or None (no checkpoint, already there, or no store near it)."""
    if not job.checkpoint_uri:
        return None
    source = checkpoint_location(stores, job)
    prefix = stores.near(*target)
    if source is None or source == target or prefix is None:
        return None
    return StagePlan(job.checkpoint_uri, source, target, f"{prefix}{job.id}/")


def transfer_rate(rt: Runtime, source: tuple[str, str], target: tuple[str, str]) -> Decimal:
    """USD per GiB from `source` to `target` for this broker (on-prem sites at the operator's rate)."""
    return transfer_usd_per_gb(
        source,
        target,
        onprem_usd_per_gb=rt.settings.onprem_egress_usd_per_gb,
        onprem_providers=frozenset(s.name for s in rt.pressure_sources),
    )


def stage_checkpoint(rt: Runtime, placement_id: str, now: datetime) -> Staging:
    """Bring the checkpoint of the job behind `placement_id` next to it; see the module docstring."""
    with Session(rt.engine) as session:
        p = session.get(Placement, placement_id)
        job = session.get(Job, p.job_id) if p is not None else None
    if p is None or job is None or p.state != PlacementState.LAUNCHING.value or p.instance_id is not None:
        return Staging.NOT_NEEDED
    plan = plan_staging(rt.checkpoint_stores, job, (p.provider, p.region))
    if plan is None:
        return Staging.NOT_NEEDED
    lease = f"stage:{p.id}"
    until = now + timedelta(seconds=rt.settings.checkpoint_stage_lease_seconds)
    if not claim_lease(rt.engine, lease, _OWNER, until, now):
        return Staging.BUSY
    try:
        return _copy_and_book(rt, p, job, plan, now)
    except (StorageError, ValueError) as exc:
        log.warning("staging the checkpoint of %s for %s failed: %s", job.id, p.id, exc)
        _note(rt, job.id, now, "checkpoint_stage_failed", f"{exc}; retrying next tick", placement_id=p.id)
        return Staging.FAILED
    finally:
        release_lease(rt.engine, lease, _OWNER)


def _objects(store: ObjectStore, key: str, uri: str) -> list[tuple[str, int]]:
    """`(key, size)` of the checkpoint: every object under a prefix URI, else the one object."""
    if uri.endswith("/"):
        return sorted((info.key, info.size) for info in store.list(key))
    info = store.stat(key)
    return [(key, info.size)] if info is not None else []


def _copy_and_book(rt: Runtime, p: Placement, job: Job, plan: StagePlan, now: datetime) -> Staging:
    clients = rt.checkpoint_stores.clients()
    src, src_key = resolve(plan.source_uri, clients)
    dst, dst_prefix_key = resolve(plan.target_prefix + "x", clients)
    dst_prefix_key = dst_prefix_key[:-1]
    objects = _objects(src, src_key, plan.source_uri)
    if not objects:
        log.info("job %s has no checkpoint at %s yet: nothing to stage", job.id, plan.source_uri)
        return Staging.NOT_NEEDED
    rate = transfer_rate(rt, plan.source, plan.target)
    size = sum(n for _, n in objects)
    estimate = (Decimal(size) / BYTES_PER_GB * rate).quantize(LEDGER_QUANTUM)
    # the placement was admitted with the transfer priced at the declared checkpoint size; what the real size
    # adds must still fit beside the placement's expected cost
    modelled = rate * spec_of(job).checkpoint_size_gb
    if job.spent_usd + p.expected_cost_usd + max(Decimal(0), estimate - modelled) > job.max_total_usd:
        _over_ceiling(rt, p, job, plan, size, estimate, now)
        return Staging.OVER_CEILING
    state = DbCopyStateStore(rt.engine)
    egress_gb = Decimal("0")
    for key, _ in objects:
        relative = key[len(src_key) :] if plan.source_uri.endswith("/") else key.rsplit("/", 1)[-1]
        result = copy_checkpoint(src, key, dst, dst_prefix_key + relative, state=state)
        egress_gb += result.egress_gb
    usd = (egress_gb * rate).quantize(LEDGER_QUANTUM)
    with Session(rt.engine) as session:
        locked_job = session.exec(select(Job).where(Job.id == job.id).with_for_update()).one()
        if locked_job.checkpoint_uri != plan.source_uri:
            return Staging.STAGED  # another replica booked this copy already
        placement = session.get(Placement, p.id)
        record_entry(
            session,
            locked_job,
            kind=CostKind.EGRESS,
            usd=usd,
            start=now,
            end=now,
            now=now,
            placement=placement,
            provider=plan.source[0],  # the sender pays
            region=plan.source[1],
            resource_id=parse_uri(plan.source_uri).container[:128],  # the bucket the bytes left
            quantity=egress_gb.quantize(LEDGER_QUANTUM),
            unit="GB",
            note=f"checkpoint {plan.source_uri} -> {plan.target_uri}",
        )
        locked_job.checkpoint_uri = plan.target_uri
        locked_job.checkpoint_provider, locked_job.checkpoint_region = plan.target
        locked_job.updated_at = now
        session.add(locked_job)
        add_event(
            session,
            locked_job,
            now,
            "checkpoint_staged",
            f"checkpoint copied from {'/'.join(plan.source)} to {'/'.join(plan.target)}: {len(objects)} object(s), "
            f"{size} bytes; {egress_gb:.6f} GiB read at ${rate}/GiB = ${usd:.2f}",
            placement_id=p.id,
            source_uri=plan.source_uri,
            target_uri=plan.target_uri,
            bytes=size,
            egress_usd=str(usd),
        )
        session.commit()
    log.info("staged checkpoint of %s at %s (%d bytes, $%s)", job.id, plan.target_uri, size, usd)
    return Staging.STAGED


def _over_ceiling(
    rt: Runtime, p: Placement, job: Job, plan: StagePlan, size: int, estimate: Decimal, now: datetime
) -> None:
    left = job.max_total_usd - job.spent_usd
    _note(
        rt,
        job.id,
        now,
        "checkpoint_stage_refused",
        f"moving the {size} byte checkpoint from {'/'.join(plan.source)} to {'/'.join(plan.target)} costs "
        f"${estimate.quantize(Decimal('0.01'))}, more than the ${left.quantize(Decimal('0.01'))} left of the "
        f"${job.max_total_usd} ceiling",
        placement_id=p.id,
    )


def _note(rt: Runtime, job_id: str, now: datetime, kind: str, message: str, **data: object) -> None:
    with Session(rt.engine) as session:
        job = session.get(Job, job_id)
        if job is not None:
            add_event(session, job, now, kind, message, **data)
            session.commit()
