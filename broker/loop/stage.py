"""Pre-stage a job's latest checkpoint next to where it is about to launch, and book the transfer.

Called by `launch_placement` before the cloud launch. The store next to the launch is the one at the placement's
`(provider, region)`, else the nearest of that provider (`CheckpointStores.for_launch`). When the job's checkpoint
lives at another location than that store, the checkpoint (one object, or every object under a URI ending in `/`)
is copied into the tenant's job checkpoint prefix in that
store, `<store>tenants/<tenant>/jobs/<job id>/checkpoint/` (`broker.agent_side.checkpoint_layout`), with
`providers.storage.copy_checkpoint`: streamed, verified, and resumable across crashes and replicas through the
database-backed copy state, in key order with the agent's `MANIFEST.json` (a checkpoint's commit mark) last.
The job then resumes from the local copy, which becomes its checkpoint URI. A job with no checkpoint URI is
given that same prefix in the store at its target (when there is one), so its instance always has a location to
write to (`checkpoint_location_assigned`).

Confinement (defense in depth; submission already checked the URI):
- the job's checkpoint URI is checked against its tenant's allowed prefixes every time, so a row stored before
  that check existed, or a location recorded later, is refused (`Staging.REFUSED`, event `checkpoint_refused`;
  `launch_placement` then pauses the job): nothing is read from it and it is not handed to the instance;
- the source is opened confined beneath the tenant's prefix that holds it, the destination beneath the job's
  checkpoint prefix, and every source object's name relative to the checkpoint URI must pass `safe_key`: an
  object whose name would escape (`../x`, `/abs`, a backslash, NUL...) is skipped, named in one
  `checkpoint_objects_skipped` event, and the others are copied (one hostile name does not cost the job its
  checkpoint; what it names is never written anywhere);
- a staging attempt copies for at most `checkpoint_stage_timeout_seconds`, checked between objects and parts
  (each store read is also bounded by its client's timeouts); then it stops and fails like a storage error, to be
  retried next tick: the upload in progress resumes, and objects already copied (marked in the copy state with
  their source version and the bytes they read) are not copied again. A local FIFO, device or symlink is refused
  by the store at once, so one hostile source cannot hold the control loop.

The transfer is paid by the sender: the bytes read from the source (resumed prefixes included) times the source's
rate (`pricing.transfer`) are appended to the ledger as one `egress` entry and added to the job's spend in the same
transaction that repoints the job, and only if the job still points at the source, so a second replica or a re-run
never books it twice. Before copying, the transfer is priced from the objects' sizes: when what it costs beyond
the transfer the placement was admitted with (priced at the declared `checkpoint_size_gb`) no longer fits beside
the placement's expected cost under the job's ceiling, it is not started (`Staging.OVER_CEILING`).

Only one replica stages a placement at a time (a lease in the database); the others see `Staging.BUSY` and leave
the placement for a later tick, as they do after a storage failure (`Staging.FAILED`, retried next tick).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum

from sqlmodel import Session, select

from agent.protocol import MANIFEST_NAME
from broker.agent_side import checkpoint_layout as layout
from broker.config.checkpoint_stores import CheckpointRefused, CheckpointStores, Location
from broker.finance.ledger import record_entry
from broker.loop.accrue import LEDGER_QUANTUM
from broker.runtime import Runtime
from broker.services.jobs import add_event, spec_of
from broker.store.copystate import DbCopyStateStore, claim_lease, release_lease
from broker.store.tables import Job, Placement
from pricing.transfer import transfer_usd_per_gb
from providers.model import CostKind, PlacementState
from providers.storage import ObjectStore, StorageError, UnsafeKey, copy_checkpoint, parse_uri, safe_key
from providers.storage.copy import BYTES_PER_GB
from providers.storage.state import CopyState, copy_id_for

log = logging.getLogger(__name__)

_OWNER = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # this process, as a lease holder
_COPIED = "copied"  # the token of a copy-state row that marks an object copied by an earlier attempt
MAX_NAMED_SKIPS = 20


class Staging(StrEnum):
    NOT_NEEDED = "not_needed"  # no checkpoint, already local, or no store near the target
    STAGED = "staged"
    BUSY = "busy"  # another replica is copying it
    FAILED = "failed"  # a storage error or the attempt's deadline: try again next tick
    OVER_CEILING = "over_ceiling"  # the transfer alone would break the job's ceiling
    REFUSED = "refused"  # the job's checkpoint URI is not one of its tenant's locations


class StageDeadline(StorageError):
    """The staging attempt used up `checkpoint_stage_timeout_seconds`; the copy resumes on the next tick."""

    retryable = True


@dataclass(frozen=True, slots=True)
class StagePlan:
    """Copy `source_uri` (at `source`) into `target_prefix` (at `target`), the job's checkpoint prefix there."""

    source_uri: str
    source: Location
    target: Location
    target_prefix: str


@dataclass(frozen=True, slots=True)
class SourceObject:
    """One object to copy: its `key` in the source store, its `name` beneath the job's checkpoint prefix."""

    key: str
    name: str
    size: int
    version: str | None


def checkpoint_location(stores: CheckpointStores, job: Job) -> Location | None:
    """Where the job's checkpoint is: the location of the tenant's prefix holding its URI, else where it last
    ran."""
    if job.checkpoint_uri:
        found = stores.locate(job.checkpoint_uri, job.tenant)
        if found is not None:
            return found
    if job.checkpoint_provider and job.checkpoint_region:
        return job.checkpoint_provider, job.checkpoint_region
    return None


def plan_staging(stores: CheckpointStores, job: Job, target: Location) -> StagePlan | None:
    """The copy a launch at `target` needs, or None (no checkpoint, already there, or no store near it)."""
    if not job.checkpoint_uri:
        return None
    source = checkpoint_location(stores, job)
    found = stores.for_launch(*target)  # the store there, else the provider's nearest
    if source is None or found is None or source == found[0]:
        return None
    where, prefix = found
    return StagePlan(job.checkpoint_uri, source, where, layout.job_checkpoint_prefix(prefix, job.tenant, job.id))


def transfer_rate(rt: Runtime, source: Location, target: Location) -> Decimal:
    """USD per GiB from `source` to `target` for this broker (on-prem sites at the operator's rate)."""
    return transfer_usd_per_gb(
        source,
        target,
        onprem_usd_per_gb=rt.settings.onprem_egress_usd_per_gb,
        onprem_providers=frozenset(s.name for s in rt.pressure_sources),
    )


def stage_checkpoint(
    rt: Runtime, placement_id: str, now: datetime, *, clock: Callable[[], float] = time.monotonic
) -> Staging:
    """Bring the checkpoint of the job behind `placement_id` next to it; see the module docstring. `clock`
    (seconds, monotonic) times the attempt against `checkpoint_stage_timeout_seconds`."""
    with Session(rt.engine) as session:
        p = session.get(Placement, placement_id)
        job = session.get(Job, p.job_id) if p is not None else None
    if p is None or job is None or p.state != PlacementState.LAUNCHING.value or p.instance_id is not None:
        return Staging.NOT_NEEDED
    stores = rt.checkpoint_stores
    if job.checkpoint_uri is None:
        _assign_location(rt, p, job, now)
        return Staging.NOT_NEEDED
    try:
        stores.match(job.checkpoint_uri, job.tenant)
    except CheckpointRefused as exc:
        log.warning("refusing the checkpoint of %s: %s", job.id, exc)
        _note(
            rt,
            job.id,
            now,
            "checkpoint_refused",
            f"{exc}; the broker neither reads it nor hands it to an instance",
            placement_id=p.id,
            checkpoint_uri=job.checkpoint_uri,
        )
        return Staging.REFUSED
    plan = plan_staging(stores, job, (p.provider, p.region))
    if plan is None:
        return Staging.NOT_NEEDED
    lease = f"stage:{p.id}"
    until = now + timedelta(seconds=rt.settings.checkpoint_stage_lease_seconds)
    if not claim_lease(rt.engine, lease, _OWNER, until, now):
        return Staging.BUSY
    timeout = rt.settings.checkpoint_stage_timeout_seconds
    deadline = clock() + timeout

    def check(what: str) -> None:
        if clock() >= deadline:
            raise StageDeadline(f"staging stopped after {timeout:g} s ({what}); the copy resumes where it stopped")

    try:
        return _copy_and_book(rt, p, job, plan, now, check)
    except (StorageError, ValueError) as exc:
        log.warning("staging the checkpoint of %s for %s failed: %s", job.id, p.id, exc)
        _note(rt, job.id, now, "checkpoint_stage_failed", f"{exc}; retrying next tick", placement_id=p.id)
        return Staging.FAILED
    finally:
        release_lease(rt.engine, lease, _OWNER)


def _assign_location(rt: Runtime, p: Placement, job: Job, now: datetime) -> None:
    """Give a job without a checkpoint URI its checkpoint prefix in the store its instance uses (the one at the
    placement's location, else the provider's nearest: `CheckpointStores.for_launch`)."""
    found = rt.checkpoint_stores.for_launch(p.provider, p.region)
    if found is None:
        return
    where, prefix = found
    try:
        uri = layout.job_checkpoint_prefix(prefix, job.tenant, job.id)
    except UnsafeKey as exc:
        log.warning("no checkpoint location for %s: %s", job.id, exc)
        return
    with Session(rt.engine) as session:
        locked_job = session.exec(select(Job).where(Job.id == job.id).with_for_update()).one()
        if locked_job.checkpoint_uri is not None:
            return  # another replica assigned it
        locked_job.checkpoint_uri = uri
        locked_job.checkpoint_provider, locked_job.checkpoint_region = where
        locked_job.updated_at = now
        session.add(locked_job)
        add_event(
            session,
            locked_job,
            now,
            "checkpoint_location_assigned",
            f"the job checkpoints to {uri}",
            placement_id=p.id,
            checkpoint_uri=uri,
        )
        session.commit()


def _objects(store: ObjectStore, key: str, uri: str, check: Callable[[], None]) -> tuple[list[SourceObject], list[str]]:
    """The checkpoint's objects (every object under a prefix URI, else the one object) in copy order (by key,
    the agent's `MANIFEST.json` last) and the names of those skipped because their name relative to the checkpoint
    would escape (`safe_key`)."""
    if not uri.endswith("/"):
        info = store.stat(key)
        name = key.rsplit("/", 1)[-1]
        return ([SourceObject(key, name, info.size, info.version)] if info is not None else []), []
    objects: list[SourceObject] = []
    skipped: list[str] = []
    for info in store.list(key):
        check()
        name = info.key[len(key) :]
        try:
            safe_key(name)
        except UnsafeKey:
            skipped.append(info.key)
            continue
        objects.append(SourceObject(info.key, name, info.size, info.version))
    # the agent's commit mark goes last, as the agent writes it: a copy cut short never shows a manifest naming
    # objects not yet there (a copy's reader trusts whatever MANIFEST.json it finds)
    return sorted(objects, key=lambda o: (o.name == MANIFEST_NAME, o.key)), skipped


def _done_id(src_uri: str, dst_uri: str) -> str:
    return f"done:{copy_id_for(src_uri, dst_uri)}"


def _copied_before(state: DbCopyStateStore, src: ObjectStore, obj: SourceObject, dst: ObjectStore) -> int | None:
    """Bytes an earlier attempt read to copy `obj` when that copy is still good (same source version and size,
    destination present with that size), else None."""
    mark = state.load(_done_id(src.uri(obj.key), dst.uri(obj.name)))
    if mark is None or mark.token != _COPIED or (mark.size, mark.src_version) != (obj.size, obj.version):
        return None
    there = dst.stat(obj.name)
    return mark.bytes_done if there is not None and there.size == obj.size else None


def _copy_and_book(
    rt: Runtime, p: Placement, job: Job, plan: StagePlan, now: datetime, check: Callable[[str], None]
) -> Staging:
    """Copy the plan's objects (`check(what)` raises `StageDeadline` once the attempt's time is up), then book."""
    stores = rt.checkpoint_stores
    src, src_key = stores.resolve_for_tenant(plan.source_uri, job.tenant)  # confined to the tenant's prefix
    dst = stores.store(plan.target_prefix)  # confined to the job's checkpoint prefix
    objects, skipped = _objects(src, src_key, plan.source_uri, lambda: check("listing the checkpoint"))
    if skipped:
        _skipped(rt, p, job, plan, skipped, now)
    if not objects:
        log.info("job %s has no checkpoint at %s yet: nothing to stage", job.id, plan.source_uri)
        return Staging.NOT_NEEDED
    target_uri = plan.target_prefix if plan.source_uri.endswith("/") else dst.uri(objects[0].name)
    rate = transfer_rate(rt, plan.source, plan.target)
    size = sum(o.size for o in objects)
    estimate = (Decimal(size) / BYTES_PER_GB * rate).quantize(LEDGER_QUANTUM)
    # the placement was admitted with the transfer priced at the declared checkpoint size; what the real size
    # adds must still fit beside the placement's expected cost
    modelled = rate * spec_of(job).checkpoint_size_gb
    if job.spent_usd + p.expected_cost_usd + max(Decimal(0), estimate - modelled) > job.max_total_usd:
        _over_ceiling(rt, p, job, plan, size, estimate, now)
        return Staging.OVER_CEILING
    state = DbCopyStateStore(rt.engine)
    read_bytes = 0
    marks: list[str] = []
    for obj in objects:
        check(f"before {obj.name}")
        src_uri, dst_uri = src.uri(obj.key), dst.uri(obj.name)
        done = _copied_before(state, src, obj, dst)
        if done is None:
            result = copy_checkpoint(
                src,
                obj.key,
                dst,
                obj.name,
                state=state,
                progress=lambda _done, _total, name=obj.name: check(f"copying {name}"),
            )
            done = int((result.egress_gb * BYTES_PER_GB).to_integral_value())
            mark = CopyState(src_uri, dst_uri, obj.size, obj.version, result.digests.part_size, _COPIED, done)
            state.save(_done_id(src_uri, dst_uri), mark)
        marks.append(_done_id(src_uri, dst_uri))
        read_bytes += done
    egress_gb = Decimal(read_bytes) / BYTES_PER_GB
    usd = (egress_gb * rate).quantize(LEDGER_QUANTUM)
    booked = _book(rt, p, job, plan, target_uri, (len(objects), size), (egress_gb, rate, usd), now)
    for mark_id in marks:
        state.delete(mark_id)
    if booked:
        log.info("staged checkpoint of %s at %s (%d bytes, $%s)", job.id, target_uri, size, usd)
    return Staging.STAGED


def _book(
    rt: Runtime,
    p: Placement,
    job: Job,
    plan: StagePlan,
    target_uri: str,
    copied: tuple[int, int],
    paid: tuple[Decimal, Decimal, Decimal],
    now: datetime,
) -> bool:
    """Repoint the job at the copy and book the egress, once: False when another replica already did.
    `copied` is (objects, bytes), `paid` (GiB read, USD/GiB, USD)."""
    (count, size), (egress_gb, rate, usd) = copied, paid
    with Session(rt.engine) as session:
        locked_job = session.exec(select(Job).where(Job.id == job.id).with_for_update()).one()
        if locked_job.checkpoint_uri != plan.source_uri:
            return False
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
            note=f"checkpoint {plan.source_uri} -> {target_uri}"[:500],
        )
        locked_job.checkpoint_uri = target_uri
        locked_job.checkpoint_provider, locked_job.checkpoint_region = plan.target
        locked_job.updated_at = now
        session.add(locked_job)
        add_event(
            session,
            locked_job,
            now,
            "checkpoint_staged",
            f"checkpoint copied from {'/'.join(plan.source)} to {'/'.join(plan.target)}: {count} object(s), "
            f"{size} bytes; {egress_gb:.6f} GiB read at ${rate}/GiB = ${usd:.2f}",
            placement_id=p.id,
            source_uri=plan.source_uri,
            target_uri=target_uri,
            bytes=size,
            egress_usd=str(usd),
        )
        session.commit()
    return True


def _skipped(rt: Runtime, p: Placement, job: Job, plan: StagePlan, names: list[str], now: datetime) -> None:
    shown = ", ".join(repr(n[:120]) for n in names[:MAX_NAMED_SKIPS])
    more = f" and {len(names) - MAX_NAMED_SKIPS} more" if len(names) > MAX_NAMED_SKIPS else ""
    log.warning("skipping %d checkpoint object(s) of %s with unsafe names: %s", len(names), job.id, shown)
    _note(
        rt,
        job.id,
        now,
        "checkpoint_objects_skipped",
        f"{len(names)} object(s) under {plan.source_uri} were not copied: their names would reach outside the "
        f"checkpoint ('..', an absolute path, a backslash, a control character...): {shown}{more}",
        placement_id=p.id,
        objects=names[:100],
    )


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
