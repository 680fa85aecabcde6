"""Job service: submit (idempotent), read, list, cancel and the event timeline. Routes call these; they hold
no HTTP knowledge and raise `broker.services.errors` exceptions that the app maps to status codes."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import Any, cast

import anyio.to_thread
import psycopg
from sqlalchemy import insert, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm.exc import StaleDataError
from sqlmodel import Session, col, select

from broker.agent_side.attempt_spec import secret_ref_refusal
from broker.api.auth import InvalidKey
from broker.api.schemas import JobCreate, JobPage, JobPublic, JobUpdate, PlacementPublic
from broker.config.checkpoint_stores import CheckpointRefused, CheckpointStores
from broker.config.settings import Settings
from broker.finance.unaccrued import unaccrued_usd
from broker.market.catalog import CatalogCache
from broker.services import jobs_pg
from broker.services.accelerator_names import check_accelerators
from broker.services.errors import Conflict, NotFoundError, TooManyRequests, Unprocessable
from broker.services.job_notes import launch_times, waiting_note
from broker.services.job_progress import checkpoint_public, latest_reports, progress_public, remaining_from_progress
from broker.store.db_async import AsyncPgPool
from broker.store.tables import AuditEntry, Job, JobEvent, Placement, PlacementReport
from federation.placement import ever_feasible
from pricing.book import PriceBook
from providers.model import JobSpec, JobState, SecretReference, hours_between


def new_id(prefix: str) -> str:
    """Time-ordered, unique ids: `job_` + 16 hex digits of nanoseconds + 8 random hex digits."""
    return f"{prefix}_{time.time_ns():016x}{os.urandom(4).hex()}"


def spec_of(job: Job) -> JobSpec:
    """The domain JobSpec of a stored job."""
    s = job.spec

    def dec(name: str) -> Decimal | None:
        v = s.get(name)
        return Decimal(str(v)) if v is not None else None

    deadline = datetime.fromisoformat(s["deadline"]) if s.get("deadline") else None
    return JobSpec(
        tenant=job.tenant,
        team=job.team,
        project=job.project,
        name=job.name,
        image=s["image"],
        command=tuple(s.get("command", ())),
        accelerators=tuple(s["accelerators"]),
        gpu_count=int(s["gpu_count"]),
        max_total_usd=Decimal(str(s["max_total_usd"])),
        min_gpu_memory_gib=int(s.get("min_gpu_memory_gib", 0)),
        cpus=int(s.get("cpus", 0)),
        memory_gib=dec("memory_gib") or Decimal("0"),
        work_gpu_hours=dec("work_gpu_hours"),
        runtime_hours=dec("runtime_hours"),
        deadline_at=deadline,
        max_hourly_usd=dec("max_hourly_usd"),
        checkpoint_uri=s.get("checkpoint_uri"),
        checkpoint_size_gb=dec("checkpoint_size_gb") or Decimal("0"),
        allowed_providers=tuple(s.get("allowed_providers", ())),
        allowed_regions=tuple(s.get("allowed_regions", ())),
        priority=int(s.get("priority", 0)),
        preemptible=bool(s.get("preemptible", True)),
        env={str(k): str(v) for k, v in (s.get("env") or {}).items()},
        secrets=tuple(_secret_ref(x, x.get("env", "")) for x in s.get("secrets") or ()),
        registry_secret=_secret_ref(s["registry_secret"], "") if s.get("registry_secret") else None,
        shm_size_gb=dec("shm_size_gb"),
        max_infra_retries=int(s.get("max_infra_retries", 3)),
    )


def _secret_ref(raw: dict[str, Any], env: str) -> SecretReference:
    return SecretReference(env=str(env), source=str(raw["source"]), ref=str(raw["ref"]), field=raw.get("field"))


def _request_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def add_event(
    session: Session,
    job: Job,
    at: datetime,
    kind: str,
    message: str,
    *,
    not_before: datetime | None = None,
    **data: Any,
) -> None:
    """Append an event to the job's timeline (the message is cut to the column's 1000 characters).

    Nothing happens to a job before it was submitted: a tick that read its clock before the job arrived places it
    at the submission time, not before it, so the timeline in time order starts with `submitted`. `not_before`
    keeps an event after another one the same way (a provider's start time, in whole seconds, can read earlier
    than the placement it started)."""
    for floor in (job.created_at, not_before):
        if floor is not None and _aware(at) < _aware(floor):
            at = floor
    session.add(JobEvent(job_id=job.id, tenant=job.tenant, at=at, kind=kind, message=message[:1000], data=data))


def check_checkpoint_uri(checkpoints: CheckpointStores | None, tenant: str, uri: str | None) -> None:
    """Raise Unprocessable naming `checkpoint_uri` unless `uri` is None or lies under one of `tenant`'s allowed
    checkpoint prefixes (`CheckpointStores.match`; with no `checkpoints` given, nothing is allowed)."""
    if uri is None:
        return
    if checkpoints is None:
        raise Unprocessable("checkpoint_uri", "no checkpoint location is configured, so no checkpoint_uri is accepted")
    try:
        checkpoints.match(uri, tenant)
    except CheckpointRefused as exc:
        raise Unprocessable("checkpoint_uri", str(exc)) from None


def check_secret_refs(settings: Settings | None, tenant: str, create: JobCreate) -> None:
    """Raise Unprocessable naming `secrets[i].ref` (or `registry_secret.ref`) for a secret reference that is not
    under one of `tenant`'s secret prefixes (`OVERSPILL_TENANT_SECRET_PREFIXES`; none given: no secret is allowed),
    and `secrets[i].env` for a variable set twice (by `env` or another secret)."""
    seen: set[str] = set()
    for i, secret in enumerate(create.secrets):
        if secret.env in create.env or secret.env in seen:
            raise Unprocessable(f"secrets[{i}].env", f"{secret.env} is set twice (in env or by another secret)")
        seen.add(secret.env)
    named = [(f"secrets[{i}].ref", secret.ref) for i, secret in enumerate(create.secrets)]
    if create.registry_secret is not None:
        named.append(("registry_secret.ref", create.registry_secret.ref))
    for name, ref in named:
        reason = secret_ref_refusal(settings.tenant_secret_prefixes if settings else {}, tenant, ref)
        if reason:
            raise Unprocessable(name, reason)


def submit_job(
    engine: Engine,
    catalog: CatalogCache,
    *,
    tenant: str,
    create: JobCreate,
    idempotency_key: str | None,
    now: datetime,
    request_id: str | None = None,
    checkpoints: CheckpointStores | None = None,
    settings: Settings | None = None,
    audit: dict[str, Any] | None = None,
    key_id: str | None = None,
) -> tuple[Job, bool]:
    """Store a new pending job, or return the one an earlier request with the same Idempotency-Key made.

    The job, its `submitted` event and `audit` (an `audit_log` row, if given) are inserted in one transaction.
    With `key_id` (the submitting API key) that transaction first re-reads the key's row and raises `InvalidKey`,
    inserting nothing, when the key is missing or revoked: a revocation in any process stops submissions at once.
    Idempotency is the database's: a second job with the tenant's key cannot be inserted, so the transaction
    fails and the earlier job is returned (nothing of this request is kept, `audit` included). A key is looked up
    before the job is checked only when the check refuses it (a replay of an accepted job is answered as before).
    `submit_job_async` does the same on PostgreSQL in one statement awaited on the event loop.

    Returns (job, created). Raises Unprocessable when no pool could ever run the job (wrong accelerator,
    region or provider constraints...), the deadline has passed, `checkpoint_uri` is not under one of the
    tenant's allowed prefixes in `checkpoints` (none given: any checkpoint_uri is refused), or a secret reference is
    not under one of the tenant's secret prefixes in `settings` (none given: any secret is refused), Conflict
    when the key was used for a different request, and TooManyRequests (429, naming `max_pending_jobs_per_tenant`)
    when `settings` are given and the tenant already has that many pending jobs (a replay of an accepted job is
    still answered with it; submissions committing concurrently may pass the cap by their number).
    """
    prepared = _prepare(catalog, tenant, create, idempotency_key, now, request_id, checkpoints, settings)
    if isinstance(prepared, _Refused):
        return _replay_or_raise(engine, tenant, prepared), False
    row, event = prepared
    cap = settings.max_pending_jobs_per_tenant if settings is not None else None
    try:
        # Core inserts, one transaction: the hot path of the API skips the ORM's unit of work.
        with engine.begin() as conn:
            if key_id is not None:
                key = conn.execute(_KEY_REVOKED_AT, {"key_id": key_id}).first()
                if key is None or key.revoked_at is not None:
                    raise InvalidKey()
            if cap is not None and conn.execute(_PENDING_OF_TENANT, {"tenant": tenant}).scalar_one() >= cap:
                raise _AtCap()
            conn.execute(_INSERT_JOB, [row])
            conn.execute(_INSERT_EVENT, [event])
            if audit is not None:
                conn.execute(_INSERT_AUDIT, [audit])
    except IntegrityError:
        if not row["idempotency_key"]:
            raise
        existing = _by_idempotency_key(engine, tenant, row["idempotency_key"])
        if existing is None:
            raise
        return _replayed(existing, row["request_hash"]), False
    except _AtCap:
        earlier = _by_idempotency_key(engine, tenant, row["idempotency_key"]) if row["idempotency_key"] else None
        if earlier is None:  # (a replay of a job accepted earlier is answered with it, cap or not)
            raise pending_cap_reached(cap or 0) from None
        return _replayed(earlier, row["request_hash"]), False
    return Job(**row), True


class _AtCap(Exception):
    """The tenant has `max_pending_jobs_per_tenant` pending jobs: nothing is inserted."""


def pending_cap_reached(cap: int) -> TooManyRequests:
    """The 429 of a submission beyond the tenant's pending-job cap."""
    return TooManyRequests(
        "max_pending_jobs_per_tenant",
        f"this tenant already has {cap} pending jobs, the most it may have (max_pending_jobs_per_tenant = {cap}); "
        "wait for some to be placed, or cancel some, and submit again",
    )


# how many pending jobs a tenant has; the cap may be passed by submissions committing concurrently (each reads the
# count before its own insert): by at most the number of submissions in flight for the tenant
_PENDING_OF_TENANT = text("SELECT count(*) FROM job WHERE tenant = :tenant AND state = 'pending'")


async def submit_job_async(
    pool: AsyncPgPool,
    engine: Engine,
    catalog: CatalogCache,
    *,
    tenant: str,
    create: JobCreate,
    idempotency_key: str | None,
    now: datetime,
    request_id: str | None = None,
    checkpoints: CheckpointStores | None = None,
    settings: Settings | None = None,
    audit: dict[str, Any] | None = None,
    key_id: str | None = None,
) -> tuple[JobPublic, bool]:
    """`submit_job` on PostgreSQL: the checks run on the event loop (they never block), the key check and the three
    inserts are one statement on `pool` (broker/services/jobs_pg.py), and only the rare Idempotency-Key lookup of a
    replay goes to a worker thread (through `engine`). Same contract and errors; it returns the job's public view
    (`job_public(job, None)`), built without an ORM object."""
    # the catalog's re-check (every 2 s, a rebuild when prices changed) reads the database: in a worker thread
    book = catalog.cached_book()
    if book is None:  # (an empty book is falsy: compare with None)
        book = await anyio.to_thread.run_sync(catalog.book, now)
    prepared = _prepare(catalog, tenant, create, idempotency_key, now, request_id, checkpoints, settings, book)
    if isinstance(prepared, _Refused):
        earlier = await anyio.to_thread.run_sync(_replay_or_raise, engine, tenant, prepared)
        return job_public(earlier, None), False
    row, event = prepared
    if settings is not None and await jobs_pg.pending_jobs(pool, tenant) >= settings.max_pending_jobs_per_tenant:
        earlier = (
            await anyio.to_thread.run_sync(_by_idempotency_key, engine, tenant, row["idempotency_key"])
            if row["idempotency_key"]
            else None
        )
        if earlier is None:
            raise pending_cap_reached(settings.max_pending_jobs_per_tenant)
        return job_public(_replayed(earlier, row["request_hash"]), None), False
    try:
        inserted = await jobs_pg.insert_submission(pool, row, event, audit, key_id)
    except psycopg.errors.UniqueViolation:
        if not row["idempotency_key"]:
            raise
        existing = await anyio.to_thread.run_sync(_by_idempotency_key, engine, tenant, row["idempotency_key"])
        if existing is None:
            raise
        return job_public(_replayed(existing, row["request_hash"]), None), False
    if not inserted:
        raise InvalidKey()
    return job_public(_unsaved(row), None), True


class _Refused:
    """A submission the checks refused: answered with the earlier job of its Idempotency-Key, else refused."""

    def __init__(self, error: Unprocessable, idempotency_key: str | None, digest: str) -> None:
        self.error, self.idempotency_key, self.digest = error, idempotency_key, digest


def _prepare(
    catalog: CatalogCache,
    tenant: str,
    create: JobCreate,
    idempotency_key: str | None,
    now: datetime,
    request_id: str | None,
    checkpoints: CheckpointStores | None,
    settings: Settings | None,
    book: PriceBook | None = None,
) -> tuple[dict[str, Any], dict[str, Any]] | _Refused:
    """The new job's row and its `submitted` event, or why the checks refused it (against `book`, or
    `catalog.book(now)` when none is given)."""
    idempotency_key = idempotency_key or None  # an empty `Idempotency-Key` header is no key (never a shared one)
    payload = create.model_dump(mode="json")
    digest = _request_hash(payload)
    try:
        row = _checked_job(
            catalog.book(now) if book is None else book,
            tenant,
            create,
            payload,
            digest,
            idempotency_key,
            now,
            request_id,
            checkpoints,
            settings,
        )
    except Unprocessable as exc:
        return _Refused(exc, idempotency_key, digest)
    event = {
        "job_id": row["id"],
        "tenant": tenant,
        "at": now,
        "kind": "submitted",
        "message": f"submitted with a ceiling of ${row['max_total_usd']}",
        "data": {},
    }
    return row, event


def _replay_or_raise(engine: Engine, tenant: str, refused: _Refused) -> Job:
    existing = _by_idempotency_key(engine, tenant, refused.idempotency_key) if refused.idempotency_key else None
    if existing is None:
        raise refused.error
    return _replayed(existing, refused.digest)  # accepted earlier: the answer stands, whatever changed since


# every column's default, so that a new job's row is complete without building the ORM object
_JOB_DEFAULTS: dict[str, Any] = {
    name: field.default for name, field in Job.model_fields.items() if not field.is_required()
}


def _unsaved(row: dict[str, Any]) -> Job:
    """A job not stored yet, read as a `Job` is read (`spec_of`, `job_public`: attributes only), without building
    the ORM object (about 80 us, a tenth of a submission's CPU in the API)."""
    return cast(Job, SimpleNamespace(**row))


# inline(): no RETURNING of the generated ids, which nothing reads (the job's id is ours)
_INSERT_JOB = insert(Job.__table__).inline()  # type: ignore[attr-defined]
_INSERT_EVENT = insert(JobEvent.__table__).inline()  # type: ignore[attr-defined]
_INSERT_AUDIT = insert(AuditEntry.__table__).inline()  # type: ignore[attr-defined]
_KEY_REVOKED_AT = text("SELECT revoked_at FROM api_key WHERE id = :key_id")


def _checked_job(
    book: PriceBook,
    tenant: str,
    create: JobCreate,
    payload: dict[str, Any],
    digest: str,
    idempotency_key: str | None,
    now: datetime,
    request_id: str | None,
    checkpoints: CheckpointStores | None,
    settings: Settings | None,
) -> dict[str, Any]:
    """The columns of a submission's new job (every one, defaults included), or Unprocessable naming the field
    that refuses it (see `submit_job`)."""
    if create.deadline is not None and create.deadline <= now:
        raise Unprocessable("deadline", "the deadline is in the past")
    check_checkpoint_uri(checkpoints, tenant, create.checkpoint_uri)
    check_secret_refs(settings, tenant, create)
    row = _JOB_DEFAULTS | dict(
        id=new_id("job"),
        tenant=tenant,
        team=create.team,
        project=create.project,
        name=create.name,
        spec=payload,
        state=JobState.PENDING.value,
        wait_reason="waiting for the next placement round",
        priority=create.priority,
        idempotency_key=idempotency_key,
        request_hash=digest,
        request_id=request_id,
        max_total_usd=create.max_total_usd,
        max_hourly_usd=create.max_hourly_usd,
        deadline_at=create.deadline,
        checkpoint_uri=create.checkpoint_uri,
        created_at=now,
        updated_at=now,
    )
    spec = spec_of(_unsaved(row))
    row["work_hours"] = row["remaining_work_hours"] = spec.work_hours
    check_accelerators(spec.accelerators, book)
    relevant = [i.offering for group in book.for_accelerators(spec.accelerators) for i in group]
    if len(book) and not ever_feasible(spec, relevant):
        field = "accelerators" if not relevant else "gpu_count"
        raise Unprocessable(
            field,
            "no pool could ever run this job: check accelerators, gpu_count, min_gpu_memory_gib, cpus, "
            "memory_gib, allowed_providers, allowed_regions and preemptible (see POST /v1/quotes)",
        )
    return row


def _by_idempotency_key(engine: Engine, tenant: str, key: str) -> Job | None:
    with Session(engine, expire_on_commit=False) as session:
        return session.exec(select(Job).where(Job.tenant == tenant, Job.idempotency_key == key)).first()


def _replayed(job: Job, digest: str) -> Job:
    if job.request_hash != digest:
        raise Conflict("Idempotency-Key", "this Idempotency-Key was already used for a different job")
    return job


# a job in these states holds no placement; it shows the last one that ran (where it ran, what it cost there)
_SHOWS_LAST_PLACEMENT = frozenset(
    {JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value, JobState.PAUSED.value}
)


def _last_ran(session: Session, job_ids: list[str]) -> dict[str, Placement]:
    """The latest placement that started, per job."""
    if not job_ids:
        return {}
    rows = session.exec(
        select(Placement)
        .where(col(Placement.job_id).in_(job_ids), col(Placement.started_at).is_not(None))
        .order_by(col(Placement.created_at), col(Placement.id))
    ).all()
    return {p.job_id: p for p in rows}  # later rows win


def get_job(engine: Engine, tenant: str, job_id: str) -> tuple[Job, Placement | None]:
    """The tenant's job and the placement to show: its current one, or for a job that ended, its last."""
    job, placement, _ = get_job_with_report(engine, tenant, job_id)
    return job, placement


def get_job_with_report(
    engine: Engine, tenant: str, job_id: str
) -> tuple[Job, Placement | None, PlacementReport | None]:
    """`get_job`, with the shown placement's newest report carrying progress (for `job_public`)."""
    with Session(engine, expire_on_commit=False) as session:
        job = session.get(Job, job_id)
        if job is None or job.tenant != tenant:
            raise NotFoundError("job", job_id)
        placement = session.get(Placement, job.current_placement_id) if job.current_placement_id else None
        if placement is None and job.state in _SHOWS_LAST_PLACEMENT:
            placement = _last_ran(session, [job.id]).get(job.id)
        report = latest_reports(session, [placement.id]).get(placement.id) if placement is not None else None
        return job, placement, report


def launch_time_of(engine: Engine, placement: Placement | None) -> tuple[float, int] | None:
    """The measured launch time of the pool of a placement still starting (`job_notes.launch_times`)."""
    if placement is None or placement.started_at is not None:
        return None
    with Session(engine) as session:
        return launch_times(session, {placement.offering_key}).get(placement.offering_key)


def _encode_cursor(job_id: str) -> str:
    return base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode("ascii"))
        job_id = raw.decode("ascii")
    except (ValueError, UnicodeError) as exc:
        raise Unprocessable("cursor", "malformed cursor; pass back next_cursor unchanged") from exc
    if not job_id.startswith("job_"):
        raise Unprocessable("cursor", "malformed cursor; pass back next_cursor unchanged")
    return job_id


def list_jobs(
    engine: Engine,
    tenant: str,
    *,
    state: str | None,
    team: str | None,
    project: str | None,
    cursor: str | None,
    limit: int,
    now: datetime | None = None,
) -> JobPage:
    """Newest first, `limit` per page; `next_cursor` continues after the last item."""
    query = select(Job).where(Job.tenant == tenant)
    if state:
        query = query.where(Job.state == state)
    if team:
        query = query.where(Job.team == team)
    if project:
        query = query.where(Job.project == project)
    if cursor:
        query = query.where(col(Job.id) < _decode_cursor(cursor))
    query = query.order_by(col(Job.id).desc()).limit(limit + 1)
    with Session(engine, expire_on_commit=False) as session:
        jobs = list(session.exec(query).all())
        more = len(jobs) > limit
        jobs = jobs[:limit]
        ids = [j.current_placement_id for j in jobs if j.current_placement_id]
        placements = (
            {p.id: p for p in session.exec(select(Placement).where(col(Placement.id).in_(ids))).all()} if ids else {}
        )
        ended = [j.id for j in jobs if not j.current_placement_id and j.state in _SHOWS_LAST_PLACEMENT]
        last = _last_ran(session, ended)
        shown = {j.id: placements.get(j.current_placement_id or "") or last.get(j.id) for j in jobs}
        reports = latest_reports(session, [p.id for p in shown.values() if p is not None])
        launch = launch_times(session, {p.offering_key for p in shown.values() if p is not None and not p.started_at})
    items = [
        job_public(j, p, now, reports.get(p.id) if p else None, launch.get(p.offering_key) if p else None)
        for j in jobs
        for p in [shown[j.id]]
    ]
    return JobPage(items=items, next_cursor=_encode_cursor(jobs[-1].id) if more else None)


_RACE_RETRIES = 8  # re-reads of a job whose state changed between a service's read and its conditional write


def _retrying(action: Callable[[], Job]) -> Job:
    """Run `action` (one read-check-write transaction on a job) again while its conditional write finds the job's
    state changed since its read (`StaleDataError`, see broker/store/tables.py): each run re-reads and re-checks, so
    the answer is decided on the state the write applies to. Raises Conflict once the job kept changing."""
    for _ in range(_RACE_RETRIES):
        try:
            return action()
        except StaleDataError:
            continue
    raise Conflict("state", "the job kept changing state while this request was applied; read it and retry")


def cancel_job(engine: Engine, tenant: str, job_id: str, now: datetime) -> Job:
    """Mark the job cancelled; the next tick stops any instance it holds. Cancelling twice is harmless.

    The write is conditional on the state the cancel read (a placement round or a PATCH that committed in
    between makes it re-read and cancel the job as it is now), so "cancelled" is never answered for a job that a
    concurrent writer then moved on: the cancel is the job's last transition."""
    return _retrying(lambda: _cancel_once(engine, tenant, job_id, now))


def _cancel_once(engine: Engine, tenant: str, job_id: str, now: datetime) -> Job:
    with Session(engine, expire_on_commit=False) as session:
        job = session.exec(select(Job).where(Job.id == job_id).with_for_update()).first()
        if job is None or job.tenant != tenant:
            raise NotFoundError("job", job_id)
        if JobState(job.state).terminal:
            if job.state == JobState.CANCELLED.value:
                return job
            raise Conflict("state", f"job already {job.state}")
        job.state = JobState.CANCELLED.value
        job.wait_reason = ""
        job.updated_at = now
        job.finished_at = now
        session.add(job)
        add_event(session, job, now, "cancelled", "cancelled by request")
        session.commit()
        return job


def update_job(engine: Engine, tenant: str, job_id: str, update: JobUpdate, now: datetime) -> Job:
    """Apply new limits or priority to a job that has not ended (`JobUpdate`), under the job's row lock, with an
    `updated` event naming each change. A paused job goes back to pending (a `resumed` event): the next placement
    round judges it under the new limits, and it waits or pauses again, with the reason, if they still do not fit.

    Raises NotFoundError (not this tenant's), Conflict (the job has ended) and Unprocessable naming the field: a
    ceiling below what the job has already spent, a deadline in the past.

    The write is conditional on the state read: a cancel (or a placement) that commits between the read and the
    write makes it re-read and decide again, so a PATCH never resumes a job that was cancelled meanwhile."""
    return _retrying(lambda: _update_once(engine, tenant, job_id, update, now))


def _update_once(engine: Engine, tenant: str, job_id: str, update: JobUpdate, now: datetime) -> Job:
    changes = update.model_dump(mode="json", include=update.model_fields_set)
    with Session(engine, expire_on_commit=False) as session:
        job = session.exec(select(Job).where(Job.id == job_id).with_for_update()).first()
        if job is None or job.tenant != tenant:
            raise NotFoundError("job", job_id)
        if JobState(job.state).terminal:
            raise Conflict("state", f"job already {job.state}: nothing left to change")
        if job.origin and job.origin_settled:
            raise Conflict("state", f"job handed back to its on-prem queue ({job.origin}): it runs there")
        if update.max_total_usd is not None:
            # what it has spent: the ledger, and the running placement's stretch not accrued yet
            own = Placement.__table__.c.job_id == job.id  # type: ignore[attr-defined]
            spent = job.spent_usd + unaccrued_usd(session.connection(), now, own)
            if update.max_total_usd < spent:
                raise Unprocessable(
                    "max_total_usd", f"${update.max_total_usd} is below the ${spent} this job has already spent"
                )
        if update.deadline is not None and update.deadline <= now:
            raise Unprocessable("deadline", "the deadline is in the past")
        said = []
        spec = dict(job.spec)
        for name, value in changes.items():
            said.append(f"{name} {spec.get(name)} -> {value}")
            spec[name] = value
        job.spec = spec  # a new dict: the JSON column sees the change
        if "max_total_usd" in changes:
            job.max_total_usd = update.max_total_usd  # type: ignore[assignment]
        if "max_hourly_usd" in changes:
            job.max_hourly_usd = update.max_hourly_usd
        if "deadline" in changes:
            job.deadline_at = update.deadline
        if "priority" in changes:
            job.priority = update.priority  # type: ignore[assignment]
        job.updated_at = now
        add_event(session, job, now, "updated", "; ".join(said), **changes)
        if job.state == JobState.PAUSED.value:
            job.state = JobState.PENDING.value
            job.wait_reason = "resumed after an update: waiting for the next placement round"
            add_event(session, job, now, "resumed", job.wait_reason)
        session.add(job)
        session.commit()
        return job


def placement_public(p: Placement) -> PlacementPublic:
    return PlacementPublic(
        id=p.id,
        offering_key=p.offering_key,
        provider=p.provider,
        region=p.region,
        zone=p.zone,
        instance_type=p.instance_type,
        capacity_type=p.capacity_type,
        hourly_usd=p.hourly_usd,
        expected_cost_usd=p.expected_cost_usd,
        cost_usd=p.cost_usd,
        state=p.state,
        simulated=p.simulated,
        instance_id=p.instance_id,
        created_at=p.created_at,
        started_at=p.started_at,
        ended_at=p.ended_at,
    )


def public_state(job: Job, placement: Placement | None) -> str:
    """The job's state for people: `starting` while its placement's instance is launching or queued."""
    if job.state == JobState.RUNNING.value and placement is not None and placement.started_at is None:
        return "starting"
    return job.state


def live_remaining(job: Job, placement: Placement | None, now: datetime | None) -> Decimal:
    """Work left: what the running placement started with, less the hours it has run so far (never below 0)."""
    if (
        now is None
        or placement is None
        or job.state != JobState.RUNNING.value
        or placement.id != job.current_placement_id
        or placement.started_at is None
        or placement.ended_at is not None
    ):
        return job.remaining_work_hours
    ran = hours_between(_aware(placement.started_at), _aware(now))
    return max(Decimal(0), placement.work_hours_at_start - max(ran, Decimal(0))).quantize(Decimal("0.001"))


def job_public(
    job: Job,
    placement: Placement | None,
    now: datetime | None = None,
    report: PlacementReport | None = None,
    launch: tuple[float, int] | None = None,
) -> JobPublic:
    """The API's view of a job; `report` is the placement's newest report carrying progress
    (`job_progress.latest_reports`): its progress and checkpoint are shown, and the work left comes from the
    progress when the job reports it; else, with `now`, `remaining_work_hours` counts down while it runs. `launch`:
    the placement's pool's measured launch time (`job_notes.launch_times`), for the note of a job starting there."""
    by_progress = remaining_from_progress(job, report) if job.state == JobState.RUNNING.value else None
    shown_state = public_state(job, placement)
    return JobPublic(
        id=job.id,
        tenant=job.tenant,
        name=job.name,
        team=job.team,
        project=job.project,
        state=shown_state,
        wait_reason=waiting_note(job, placement, shown_state, launch, now),
        spent_usd=job.spent_usd,
        max_total_usd=job.max_total_usd,
        max_hourly_usd=job.max_hourly_usd,
        work_hours=job.work_hours,
        remaining_work_hours=by_progress if by_progress is not None else live_remaining(job, placement, now),
        progress=progress_public(report),
        checkpoint=checkpoint_public(job, placement, report),
        deadline=job.deadline_at,
        attempts=job.attempts,
        created_at=job.created_at,
        updated_at=job.updated_at,
        finished_at=job.finished_at,
        placement=placement_public(placement) if placement else None,
        spec=job.spec,
    )
