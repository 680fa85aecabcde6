"""Tick step: place pending jobs on their best pool, and launch recorded placements.

Exactly-once: a job moves pending -> running in the same transaction that inserts its placement, under a row
lock (PostgreSQL `FOR UPDATE SKIP LOCKED`) and a conditional state check, so two replicas can never place one job
twice. The launch itself happens after that commit and is idempotent on the placement's launch token, so a crash
between the two is repaired by the next tick relaunching with the same token.

Only launchable pools are chosen: a pool whose provider has no adapter in this process (prices from a feed or an
imported catalog, launching not enabled) is rejected `no_launch_adapter`, and a pool of a cloud whose instances run
the agent but that has no checkpoint store (`OVERSPILL_CHECKPOINT_STORES`, any region) `no_checkpoint_store`. A
pool's expected cost counts what its instance bills beside compute (boot disk, public IPv4: `rt.extras`, at list
price) on top of its price.

Launch failures. A definitive answer (no capacity, quota, credentials, bad request, a policy denial) fails the
placement, blocklists the scope the error names (zone, region or provider; none for a request-scoped one) at once,
also for the rest of this tick, and sends the job back to pending to be placed elsewhere; the cloud's message is in
the `launch_failed` event. A pool that refused the job's request as invalid or by policy is refused for that job
only (`refused_pools`). Launches return once the cloud accepted them: a refusal that comes later, in the cloud's
operation, reaches the broker through the sync step's read of the instance (`launch_error`), which calls
`launch_failed` here the same way. An ambiguous one (throttled after the adapter's own retries, a timeout, a
5xx: the cloud may or may not have launched) keeps the placement and its token: the next tick's sync relaunches
with the same token, which finds the instance if the request got through, and never launches a second one. After
`MAX_LAUNCH_ATTEMPTS` ambiguous attempts it fails like a definitive answer (the orphan sweep covers a late launch).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.orm.exc import StaleDataError
from sqlmodel import Session, col, func, or_, select

from broker.agent_side.attempt_spec import boots_agent
from broker.crashpoints import crashpoint
from broker.finance.budgets import HardBudgetGate, onprem_only
from broker.finance.unaccrued import unaccrued_usd
from broker.loop.attempt import (
    MAX_SPEC_FAILURES,
    AttemptStoreUnavailable,
    Prepared,
    prepare_attempt,
    resume_from,
    spec_failures,
)
from broker.loop.common import (
    AUTH_BLOCK,
    CAPACITY_BLOCK,
    QUOTA_BLOCK,
    active_blocklist,
    bind_job,
    block,
    locked,
)
from broker.loop.stage import Staging, checkpoint_location, stage_checkpoint, transfer_rate
from broker.loop.waitmemo import Waiting, WaitMemo
from broker.market.availability import pool_outlooks
from broker.runtime import Runtime
from broker.services.agent_reports import INFRA_FAILED
from broker.services.bulkhead import bulkhead, job_event_after
from broker.services.jobs import add_event, new_id, spec_of
from broker.store.tables import Job, JobEvent, Placement
from federation.fairshare import fair_order
from federation.placement import Candidate, PlacementContext, blocked, evaluate, place, quote
from federation.strategies import NOTICE_SECONDS, Move, Plan, PoolOutlook, Preemption, RunState, decide
from pricing.book import PriceBook
from pricing.extras import extra_hourly_table
from providers.base import (
    AuthError,
    InsufficientCapacity,
    InvalidRequest,
    LaunchRequest,
    PolicyDenied,
    ProviderError,
    QuotaExceeded,
    Scope,
    Throttled,
)
from providers.model import CapacityType, JobSpec, JobState, Offering, PlacementState, Tags

_P = Placement.__table__  # type: ignore[attr-defined]

_CLOUD_CAPACITY = tuple(c.value for c in CapacityType if c is not CapacityType.ON_PREM)

log = logging.getLogger(__name__)

MAX_STAGE_FAILURES = 3  # storage errors before a launch gives up pre-staging and resumes from the remote copy
MAX_LAUNCH_ATTEMPTS = 5


def launchable_providers(rt: Runtime) -> frozenset[str]:
    """The providers this process can launch on: the ones it has an adapter for (simulated ones included)."""
    return frozenset(rt.providers)


def storeless_providers(rt: Runtime) -> frozenset[str]:
    """Providers whose instances run the agent but that have no checkpoint store in any region: none of their
    pools can run a job (rejected `no_checkpoint_store`). The simulated clouds and Slurm run no agent."""
    have = rt.checkpoint_stores.providers_with_stores()
    return frozenset(name for name, prov in rt.providers.items() if boots_agent(prov) and name not in have)


def extra_hourly(rt: Runtime) -> dict[str, Decimal]:
    """What an instance bills per hour beside compute, by `provider/capacity_type` (placement's shape)."""
    return extra_hourly_table(rt.extras, _CLOUD_CAPACITY)


def placement_context(rt: Runtime, job: Job, now: datetime, blocklist: frozenset[str]) -> PlacementContext:
    checkpoint_at = checkpoint_location(rt.checkpoint_stores, job)
    # the sender pays: price moving the checkpoint out of its provider, and between two of its regions
    elsewhere = ("", "")
    return PlacementContext(
        now=now,
        remaining_work_hours=job.remaining_work_hours,
        spent_usd=job.spent_usd,
        blocklist=blocklist,
        checkpoint_at=checkpoint_at,
        checkpoint_egress_usd_per_gb=transfer_rate(rt, checkpoint_at, elsewhere) if checkpoint_at else Decimal(0),
        checkpoint_interregion_usd_per_gb=(
            transfer_rate(rt, checkpoint_at, (checkpoint_at[0], "")) if checkpoint_at else Decimal(0)
        ),
        params=rt.params,
        launchable=launchable_providers(rt),
        extra_hourly_usd=extra_hourly(rt),
        no_checkpoint_store=storeless_providers(rt),
    )


def place_pending(rt: Runtime, now: datetime) -> int:
    """Place as many pending jobs as the catalog allows, the tenants taking turns in weighted fair share
    (`federation.fairshare.fair_order`; `priority` orders jobs only within a tenant), at most
    `max_placements_per_tick` looked at. A job whose wait cannot have changed since the last round looked at it
    (`WaitMemo`) is skipped without being judged. A job whose state changed while it was judged (a cancel, a PATCH:
    the conditional write finds no row, `StaleDataError`) is left to the next round. Returns placements made."""
    book = rt.catalog.book(now)
    settings = rt.settings
    with Session(rt.engine) as session:
        blocklist = active_blocklist(session, now)
        queues = pending_queues(session, settings.placement_scan_per_tenant)
        running = running_by_tenant(session)
    budgets = HardBudgetGate(rt.engine, now, rt.extras)
    looked = rt.wait_memo.renew(book, blocklist, budgets.blocking())
    fresh = {tenant: [w.job_id for w in queue if not looked.unchanged(w)] for tenant, queue in queues.items()}
    ids = fair_order(
        fresh,
        settings.max_placements_per_tick,
        weights=settings.tenant_weights,
        running=running,
        default_weight=settings.default_tenant_weight,
    )
    placed: list[str] = []
    memo = BookMemo()  # deadline jobs of one shape share their usable book and pool histories this tick
    verdicts: dict[tuple[Any, ...], str] = {}  # shape -> why no pool fits it, this round
    first_book = book
    with Session(rt.engine) as session:  # an unlocked snapshot: only to skip jobs a write would not change
        snapshot = {j.id: j for j in session.exec(select(Job).where(col(Job.id).in_(ids))).all()} if ids else {}
    with bulkhead(rt, "place_pending", now) as bh:
        for job_id in ids:
            bind_job(None)
            if bh.skip(job_id):
                continue
            seen = snapshot.get(job_id)
            shape = _shape(seen) if seen is not None else None
            if seen is not None and shape is not None and verdicts.get(shape) == seen.wait_reason:
                # a job of the same shape found no pool in this round, and this one already says why: judging it
                # would change nothing and write nothing
                looked.remember(_fingerprint(seen))
                continue
            with bh.item(job_id, job_event_after(rt, job_id, "place_pending", now)):
                try:
                    placement_id, book = _place_one(rt, job_id, book, blocklist, now, budgets, memo, verdicts, looked)
                except StaleDataError:
                    log.info("job %s changed state while it was being placed; the next round looks again", job_id)
                    continue
                if placement_id:
                    placed.append(placement_id)
                    crashpoint("place.after_commit")
                    try:
                        scope = launch_placement(rt, placement_id, now)
                    except StaleDataError:
                        log.info(
                            "placement %s changed state while it was launched; the next tick looks again", placement_id
                        )
                        continue
                    if scope:  # the rest of this tick avoids it too: no hammering a pool that just said no
                        blocklist = blocklist | {scope}
    if book is not first_book or blocklist != looked.blocklist:
        rt.wait_memo.forget()  # an on-prem queue or the blocklist changed mid-round: judge everyone afresh
    return len(placed)


def pending_queues(session: Session, per_tenant: int) -> dict[str, list[Waiting]]:
    """Each tenant's pending jobs, highest priority then oldest first, at most `per_tenant` of each (one
    statement: a window over the pending jobs by tenant), with their fingerprints (`Waiting`)."""
    rank = (
        func.row_number()
        .over(partition_by=col(Job.tenant), order_by=(col(Job.priority).desc(), col(Job.id)))
        .label("rank")
    )
    inner = (
        select(Job.id, Job.tenant, *_FINGERPRINT, rank)  # type: ignore[call-overload]
        .where(Job.state == JobState.PENDING.value)
        .subquery()
    )
    rows = session.exec(
        select(inner.c.id, inner.c.tenant, *(inner.c[c.key] for c in _FINGERPRINT))  # type: ignore[call-overload]
        .where(inner.c.rank <= per_tenant)
        .order_by(inner.c.tenant, inner.c.rank)
    ).all()
    out: dict[str, list[Waiting]] = {}
    for job_id, tenant, *fingerprint in rows:
        out.setdefault(tenant, []).append(Waiting(job_id, tuple(fingerprint)))
    return out


# the columns of a pending job its placement verdict reads besides its shape (which no write but a PATCH changes,
# and a PATCH changes one of these too): `WaitMemo` compares them
_FINGERPRINT = (
    col(Job.updated_at),
    col(Job.max_total_usd),
    col(Job.max_hourly_usd),
    col(Job.deadline_at),
    col(Job.spent_usd),
    col(Job.remaining_work_hours),
    col(Job.attempts),
)


def _fingerprint(job: Job) -> Waiting:
    return Waiting(job.id, tuple(getattr(job, c.key) for c in _FINGERPRINT))


def running_by_tenant(session: Session) -> dict[str, int]:
    """How many jobs each tenant runs now: its usage in the fair share."""
    rows = session.exec(
        select(Job.tenant, func.count())  # type: ignore[call-overload]
        .where(Job.state == JobState.RUNNING.value)
        .group_by(col(Job.tenant))
    ).all()
    return {tenant: int(n) for tenant, n in rows}


def _shape(job: Job) -> tuple[Any, ...] | None:
    """What a never-placed job's verdict depends on besides the round's book, blocklist and budgets: two jobs of
    one shape get the same answer from `choose_pool`. None for a job whose answer is its own (a deadline, earlier
    attempts: refused pools and unaccrued runs)."""
    if job.deadline_at is not None or job.attempts:
        return None
    spec = {k: v for k, v in job.spec.items() if k not in _NOT_SHAPE}
    return (
        job.tenant,
        job.team,
        job.project,
        json.dumps(spec, sort_keys=True, default=str),
        job.remaining_work_hours,
        job.spent_usd,
        job.checkpoint_uri,
        job.checkpoint_provider,
        job.checkpoint_region,
    )


# spec fields no placement decision reads
_NOT_SHAPE = frozenset({"name", "command", "env", "secrets", "registry_secret", "image", "priority"})


def _place_one(
    rt: Runtime,
    job_id: str,
    book: PriceBook,
    blocklist: frozenset[str],
    now: datetime,
    budgets: HardBudgetGate | None = None,
    memo: BookMemo | None = None,
    verdicts: dict[tuple[Any, ...], str] | None = None,
    looked: WaitMemo | None = None,
) -> tuple[str | None, PriceBook]:
    """Judge one pending job under its row lock and place it (or record why it waits, or pause it). `verdicts`
    shares this round's "no pool" answers among jobs of one shape (`_shape`); `looked` remembers a job that waits
    so later rounds skip it while nothing it depends on changed. Raises `StaleDataError` when the job's state
    changed between its read and the write (nothing is written then)."""
    with Session(rt.engine, expire_on_commit=False) as session:
        job = session.exec(locked(select(Job).where(Job.id == job_id))).first()
        if job is None or job.state != JobState.PENDING.value:
            return None, book  # another replica has it, or it changed state
        bind_job(job)
        shape = _shape(job) if verdicts is not None else None
        known = verdicts.get(shape) if verdicts is not None and shape is not None else None
        if known is not None:
            best, reason, pause = None, known, False  # a job of the same shape found no pool in this round
        else:
            ctx = placement_context(rt, job, now, blocklist | refused_pools(session, job))
            # a run that ended this tick is accrued later in it (accrue_costs): its stretch counts against the ceiling
            ended = unaccrued_usd(session.connection(), now, _P.c.job_id == job.id, extras=rt.extras)
            ctx = replace(ctx, spent_usd=ctx.spent_usd + ended) if ended else ctx
            best, reason, pause = choose_pool(rt, session, job, book, ctx, now, budgets, memo=memo)
        if best is None:
            if pause:
                job.state = JobState.PAUSED.value
            if reason != job.wait_reason or pause:
                job.wait_reason = reason
                job.updated_at = now
                session.add(job)
                add_event(session, job, now, "paused" if pause else "waiting", reason)
            session.commit()
            if not pause and shape is not None and verdicts is not None:
                verdicts[shape] = reason
            if not pause and looked is not None and job.deadline_at is None:
                looked.remember(_fingerprint(job))
            return None, book
        off = best.offering
        twin = book.on_demand_price(off)
        created_at = _not_before_previous(session, job, now)
        placement = Placement(
            id=new_id("plc"),
            job_id=job.id,
            tenant=job.tenant,
            offering_key=off.key,
            provider=off.provider,
            region=off.region,
            zone=off.zone,
            instance_type=off.instance_type,
            capacity_type=off.capacity_type.value,
            accelerator=off.accelerator,
            accelerator_count=off.accelerator_count,
            hourly_usd=off.price.hourly_usd,
            on_demand_hourly_usd=twin.price.hourly_usd if twin else off.price.hourly_usd,
            expected_cost_usd=best.expected_cost_usd,
            launch_token=uuid.uuid4().hex,
            state=PlacementState.LAUNCHING.value,
            simulated=off.simulated,
            work_hours_at_start=job.remaining_work_hours,
            created_at=created_at,
        )
        session.add(placement)
        job.state = JobState.RUNNING.value
        job.current_placement_id = placement.id
        job.attempts += 1
        job.wait_reason = ""
        job.updated_at = now
        session.add(job)
        add_event(
            session,
            job,
            now,
            "placed",
            f"placed on {off.key} at ${off.price.hourly_usd}/h, expected ${best.expected_cost_usd}",
            placement_id=placement.id,
            offering_key=off.key,
            hourly_usd=str(off.price.hourly_usd),
            expected_cost_usd=str(best.expected_cost_usd),
            expected_finish_at=best.expected_finish_at.isoformat(),
            simulated=off.simulated,
        )
        session.commit()
    bind_job(job, placement)
    log.info("job placed", extra={"capacity_type": off.capacity_type.value, "hourly_usd": str(off.price.hourly_usd)})
    if off.capacity_type is CapacityType.ON_PREM:
        book = _refresh_provider(rt, book, off.provider, now)
    return placement.id, book


def choose_pool(
    rt: Runtime,
    session: Session,
    job: Job,
    book: PriceBook,
    ctx: PlacementContext,
    now: datetime,
    budgets: HardBudgetGate | None = None,
    *,
    explain: bool = True,
    memo: BookMemo | None = None,
    preemptions: tuple[Preemption, ...] | None = None,
) -> tuple[Candidate | None, str, bool]:
    """Where the job's remaining work (`ctx.remaining_work_hours`) should run now: the deadline-aware strategy
    for a job with a deadline, the cheapest expected cost otherwise, on-prem pools only while a hard budget of
    its team or project is spent. Returns (candidate, reason when none, pause?). Also asked by the
    return-on-prem step, so both steps agree on where a job belongs. A step choosing for many jobs passes one
    `budgets` gate for all of them; one that does not show the reason passes `explain=False` (explaining a
    cheapest-cost miss is a full `quote`, every pool of the job's accelerators judged: skipped then); one asking
    about many deadline jobs passes a `memo` (`BookMemo`) and each job's `preemptions` (`preemptions_of`, read for
    all of them at once; else they are read here)."""
    spec = spec_of(job)
    over_budget = (budgets or HardBudgetGate(session, now)).block_reason(job)
    if over_budget:
        book = onprem_only(book, now)
    refused = tenant_refusals(rt, job.tenant)
    if refused:  # e.g. Slurm without a submit identity for this tenant: never run it as the broker's account
        book = PriceBook.build([o for o in book if o.provider not in refused], now, book.feed_observed_at)
    if spec.deadline_at is not None:
        best, reason, pause = _deadline_decision(rt, session, job, spec, book, ctx, now, memo, preemptions)
    else:
        best, reason, pause = place(spec, book, ctx), "", False
    if best is None:
        reason = over_budget or reason or (quote(spec, book, ctx).wait_reason() if explain else "")
        if refused:
            reason = f"{reason}; {'; '.join(refused.values())}"[:500]
    return best, reason, pause


def tenant_refusals(rt: Runtime, tenant: str) -> dict[str, str]:
    """Providers that will not run this tenant's jobs at all, with why (`refuses_tenant`, e.g. the Slurm provider
    for a tenant with no submit identity): their pools are left out of its placement."""
    out: dict[str, str] = {}
    for name, provider in rt.providers.items():
        refuses = getattr(provider, "refuses_tenant", None)
        reason = refuses(tenant) if refuses is not None else None
        if reason:
            out[name] = reason
    return out


def _refused(query: Any) -> Any:
    """`query` (over Placement) narrowed to failed placements whose pool refused the launch request for good, or
    where the job's attempt failed for infrastructure reasons (retried elsewhere)."""
    return query.where(
        Placement.state == PlacementState.FAILED.value,
        or_(
            col(Placement.detail).startswith(f"{InvalidRequest.__name__}:"),
            col(Placement.detail).startswith(f"{PolicyDenied.__name__}:"),
            col(Placement.detail).startswith(f"{INFRA_FAILED}:"),
        ),
    )


def refused_pools(session: Session, job: Job) -> frozenset[str]:
    """The pools that refused this job's launch request as invalid (`InvalidRequest`: a configuration the pool
    does not support, a pool no longer offered, a request the cloud rejects) or by policy (`PolicyDenied`: an
    organisation, IAM or Azure policy refused this request): placing the job there again would be refused again,
    so they are out of this job's choices for good; other jobs may still use them. So are the pools where the
    job's attempt failed for infrastructure reasons (the agent's `infra_failed`: an image the pool's registry
    cannot serve, no GPU driver), retried elsewhere."""
    if job.attempts == 0:
        return frozenset()
    keys = session.exec(_refused(select(Placement.offering_key).where(Placement.job_id == job.id))).all()
    return frozenset(keys)


def refused_pools_of_running_jobs(session: Session) -> dict[str, frozenset[str]]:
    """`refused_pools` of every running job at once (one query, for steps that judge every running job): by job
    id, only jobs with any refused pool."""
    rows = session.exec(  # type: ignore[call-overload]
        _refused(
            select(Placement.job_id, Placement.offering_key)
            .join(Job, col(Job.id) == Placement.job_id)
            .where(Job.state == JobState.RUNNING.value, col(Job.attempts) > 0)
        )
    ).all()
    out: dict[str, set[str]] = {}
    for job_id, key in rows:
        out.setdefault(job_id, set()).add(key)
    return {job_id: frozenset(keys) for job_id, keys in out.items()}


def _not_before_previous(session: Session, job: Job, now: datetime) -> datetime:
    """`now`, or the end of the job's previous placement if that is later.

    A tick's `now` is read when the tick starts; a long tick on one replica can place a job that another replica,
    with a later clock (or a provider reporting its own end time), ended a moment "after" it. Placements of one
    job must not overlap even on paper (the ledger and reports read them in order), so a new one starts no
    earlier than the previous one ended."""
    if job.attempts == 0:
        return now
    ended = session.exec(
        select(func.max(Placement.ended_at)).where(Placement.job_id == job.id)  # type: ignore[call-overload]
    ).one()
    return max(now, ended) if ended is not None else now


def _deadline_decision(
    rt: Runtime,
    session: Session,
    job: Job,
    spec: JobSpec,
    book: PriceBook,
    ctx: PlacementContext,
    now: datetime,
    memo: BookMemo | None = None,
    preemptions: tuple[Preemption, ...] | None = None,
) -> tuple[Candidate | None, str, bool]:
    """A job with a deadline is placed by the deadline-aware strategy (federation.strategies): spot while the
    slack allows, on-demand (or on-prem) when it does not, pause when the budget cannot finish it.

    Returns (candidate, reason when none, pause?)."""
    state = deadline_state(rt, session, job, spec, book, ctx, now, memo=memo, preemptions=preemptions)
    plan = deadline_plan(rt, state, book, ctx, memo)
    if plan.move is Move.PAUSE:
        return None, f"paused: {plan.reason}", True
    if plan.move is not Move.LAUNCH or plan.offering is None:
        return None, f"waiting: {plan.reason}", False
    # the strategy answers for the deadline; the placement model still prices the pool and holds the ceiling
    verdict = evaluate(replace(spec, deadline_at=None), plan.offering, ctx)
    if isinstance(verdict, Candidate):
        return verdict, "", False
    return None, f"{verdict.reason.value}: {verdict.message} ({plan.offering.key})", False


@dataclass(frozen=True, slots=True)
class RunningNow:
    """A running job as the deadline policy is told of it: its pool (as the book lists it now), the changeover it
    still has ahead, and the work done since its last checkpoint (what stopping it now would redo)."""

    offering: Offering
    restart_left_hours: float
    unsaved_work_hours: float


def deadline_state(
    rt: Runtime,
    session: Session,
    job: Job,
    spec: JobSpec,
    book: PriceBook,
    ctx: PlacementContext,
    now: datetime,
    *,
    run: RunningNow | None = None,
    memo: BookMemo | None = None,
    preemptions: tuple[Preemption, ...] | None = None,
) -> RunState:
    """What the deadline policy is told about `job` now: waiting to be placed (`run` None), or running as `run`
    says (`broker.loop.move`). `ctx` gives the work left and the spend. A step that asks about many jobs at once
    passes a `memo` (the pools' histories read once per set of pools) and each job's `preemptions`
    (`preemptions_of`, read for all of them at once)."""
    if preemptions is None:
        preemptions = preemptions_of(session, [job.id], now).get(job.id, ())
    memo = memo or BookMemo()
    outlook = memo.outlook(book, spec, lambda keys: pool_outlooks(session, keys, now, rt.trace_runs))
    return RunState(
        job=spec,
        now=now,
        started_at=job.created_at,
        remaining_work_hours=ctx.remaining_work_hours,
        spent_usd=ctx.spent_usd,
        current=run.offering if run else None,
        restart_left_hours=run.restart_left_hours if run else 0.0,
        checkpoint_at=ctx.checkpoint_at,
        preemptions=preemptions,
        tick_hours=rt.settings.tick_interval_seconds / 3600,
        outlook=outlook,
        checkpoint_interval_hours=rt.settings.checkpoint_interval_hours,
        notice_seconds=_notice_seconds(rt),
        unsaved_work_hours=run.unsaved_work_hours if run else 0.0,
    )


def preemptions_of(session: Session, job_ids: list[str], now: datetime) -> dict[str, tuple[Preemption, ...]]:
    """The reclaims of each job's earlier placements, by job id (jobs with none are missing): one read per 1,000
    jobs."""
    out: dict[str, list[Preemption]] = {}
    for start in range(0, len(job_ids), 1000):
        rows = session.exec(
            select(Placement)
            .where(
                col(Placement.job_id).in_(job_ids[start : start + 1000]),
                Placement.state == PlacementState.PREEMPTED.value,
            )
            .order_by(col(Placement.created_at))
        ).all()
        for p in rows:
            out.setdefault(p.job_id, []).append(Preemption(p.ended_at or now, p.provider, p.region, p.zone))
    return {job_id: tuple(found) for job_id, found in out.items()}


def deadline_plan(
    rt: Runtime, state: RunState, book: PriceBook, ctx: PlacementContext, memo: BookMemo | None = None
) -> Plan:
    """The process's deadline policy's plan for `state`, on the pools the job may use now (`without_blocked`;
    through `memo` when given: one filtered book per job shape and exclusions)."""
    strategy = rt.deadline_strategy()
    usable = (memo or BookMemo()).without_blocked(book, state.job, ctx, state.now)
    with rt.deadline_policy_lock:
        return decide(strategy, state, usable)


class BookMemo:
    """What a step that asks the deadline policy about many jobs of one tick computes once, not per job: a job's
    usable book (`without_blocked`) per (book, accelerators, exclusions), its spot pools per (book, accelerators),
    and the pools' histories per set of pools. Keyed by the book's identity and keeping the book alive, so an
    entry is never taken for another book. One memo lives for one step of one tick (prices, blocklist and
    histories are those of that moment)."""

    def __init__(self) -> None:
        self._books: dict[tuple[Any, ...], tuple[PriceBook, PriceBook]] = {}
        self._keys: dict[tuple[Any, ...], tuple[PriceBook, frozenset[str]]] = {}
        self._outlooks: dict[frozenset[str], dict[str, PoolOutlook]] = {}

    def without_blocked(self, book: PriceBook, spec: JobSpec, ctx: PlacementContext, now: datetime) -> PriceBook:
        key = (id(book), tuple(spec.accelerators), ctx.blocklist, ctx.launchable, ctx.no_checkpoint_store)
        found = self._books.get(key)
        if found is None or found[0] is not book:
            found = (book, without_blocked(book, spec, ctx, now))
            self._books[key] = found
        return found[1]

    def outlook(
        self, book: PriceBook, spec: JobSpec, read: Callable[[frozenset[str]], dict[str, PoolOutlook]]
    ) -> dict[str, PoolOutlook]:
        """The histories of the job's spot pools in `book`, read by `read` once per set of pools."""
        key = (id(book), tuple(spec.accelerators))
        found = self._keys.get(key)
        if found is None or found[0] is not book:
            found = (book, frozenset(_spot_keys(book, spec)))
            self._keys[key] = found
        pools = found[1]
        if pools not in self._outlooks:
            self._outlooks[pools] = read(pools)
        return self._outlooks[pools]


def _notice_seconds(rt: Runtime) -> dict[str, float]:
    """Each provider's spot interruption notice, by the notice its adapter's agent watches (none: 0)."""
    return {
        name: NOTICE_SECONDS.get(str(getattr(prov, "notice_source", "none")), 0.0)
        for name, prov in rt.providers.items()
    }


def _spot_keys(book: PriceBook, spec: JobSpec) -> list[str]:
    return [
        item.offering.key
        for group in book.for_accelerators(spec.accelerators)
        for item in group
        if item.offering.capacity_type is CapacityType.SPOT
    ]


def without_blocked(book: PriceBook, spec: JobSpec, ctx: PlacementContext, now: datetime) -> PriceBook:
    """The job's pools minus those the broker's blocklist (failed launches, recent reclaims) rules out now and those
    nothing here can launch."""
    blocklist, launchable, storeless = ctx.blocklist, ctx.launchable, ctx.no_checkpoint_store
    if not blocklist and launchable is None and not storeless:
        return book
    keep = [
        item.offering
        for group in book.for_accelerators(spec.accelerators)
        for item in group
        if not blocked(item.offering, blocklist)
        and (launchable is None or item.offering.provider in launchable)
        and item.offering.provider not in storeless
    ]
    return PriceBook.build(keep, now, book.feed_observed_at)


def _refresh_provider(rt: Runtime, book: PriceBook, provider: str, now: datetime) -> PriceBook:
    """After an on-prem placement its queue (and so its expected wait) changed: re-read that feed."""
    for source in rt.offering_sources:
        if source.name == provider:
            return book.with_provider(provider, source.offerings(now), now)
    return book


def launch_placement(rt: Runtime, placement_id: str, now: datetime) -> str | None:
    """Launch a LAUNCHING placement (idempotent on its token); on a definitive failure, blocklist and re-queue,
    on an ambiguous one keep the placement for the next tick (see the module docstring).

    The job's checkpoint is first pre-staged next to the target (`broker.loop.stage`). While another replica
    copies it, or after a storage error, the placement stays LAUNCHING for the next tick to retry; after
    `MAX_STAGE_FAILURES` errors the job resumes from where its checkpoint is. A transfer the ceiling cannot pay
    pauses the job instead, and so does a checkpoint URI outside the tenant's checkpoint prefixes (it is neither
    read nor handed to the instance). The instance is told the job's checkpoint URI as it is after staging (a
    job without one was given its prefix in the store at the target, if any).

    On a cloud whose instances run the agent, the attempt's spec is then written to the job's store and the start-up
    script recorded (`broker.loop.attempt.prepare_attempt`): a store error leaves the placement LAUNCHING for the
    next tick (after `MAX_SPEC_FAILURES` the launch fails over), a refused image or secret reference pauses the job,
    and the instance always boots with its spec in place.

    A placement whose job was cancelled meanwhile is stopped without launching.

    Returns the scope key blocklisted because of this launch, if any."""
    staging = stage_checkpoint(rt, placement_id, now)
    if staging is Staging.BUSY:
        return None
    if staging is Staging.FAILED and _stage_failures(rt, placement_id) < MAX_STAGE_FAILURES:
        return None
    if staging is Staging.OVER_CEILING:
        _abandon(
            rt,
            placement_id,
            now,
            "checkpoint transfer would exceed the job's ceiling",
            lambda p, job: (
                f"paused: moving the checkpoint to {p.provider}/{p.region} would exceed the "
                f"${job.max_total_usd} ceiling (see the checkpoint_stage_refused event)"
            ),
        )
        return None
    if staging is Staging.REFUSED:
        _abandon(
            rt,
            placement_id,
            now,
            "the job's checkpoint_uri is not one of its tenant's checkpoint locations",
            lambda p, job: (
                "paused: its checkpoint_uri is outside the tenant's checkpoint prefixes (see the "
                "checkpoint_refused event); cancel it and submit it again with an allowed checkpoint_uri"
            ),
        )
        return None
    prepared, why = prepare_attempt(rt, placement_id, now)
    if prepared is Prepared.FAILED and spec_failures(rt, _job_of(rt, placement_id), placement_id) < MAX_SPEC_FAILURES:
        return None
    if prepared is Prepared.REFUSED:
        _abandon(
            rt,
            placement_id,
            now,
            "the job cannot be handed to an instance",
            lambda p, job: f"paused: {why}"[:500],
        )
        return None
    with Session(rt.engine, expire_on_commit=False) as session:
        p = session.exec(locked(select(Placement).where(Placement.id == placement_id))).first()
        if p is None or p.state != PlacementState.LAUNCHING.value or p.instance_id is not None:
            return None
        job = session.get(Job, p.job_id)
        bind_job(job, p)
        provider = rt.provider(p.provider)
        offering = rt.catalog.book(now).get(p.offering_key)
        assert job is not None
        if job.state == JobState.CANCELLED.value:
            # cancelled between the placement's record and its launch (a crash, or an unanswered launch waiting
            # for a retry): launch nothing. An instance an earlier, unanswered attempt did start is the orphan
            # sweep's to terminate, as it has no live placement from here on.
            p.state = PlacementState.STOPPED.value
            p.ended_at = now
            p.detail = "job cancelled before its instance was launched"
            session.add(p)
            add_event(session, job, now, "stopped", f"{p.detail} on {p.offering_key}", placement_id=p.id)
            session.commit()
            return None
        if provider is None or offering is None:
            gone = InvalidRequest(f"pool {p.offering_key} is no longer offered", provider=p.provider)
            scope = launch_failed(session, p, job, gone, now)
            session.commit()
            return scope
        if prepared in (Prepared.FAILED, Prepared.NO_STORE):  # never launched without its spec: fail over
            refusal: ProviderError = (
                AttemptStoreUnavailable(f"the attempt's spec could not be written: {why}", provider=p.provider)
                if prepared is Prepared.FAILED
                else InvalidRequest(f"{why}: its instances could not run the agent", provider=p.provider)
            )
            scope = launch_failed(session, p, job, refusal, now)
            session.commit()
            return scope
        p.launch_attempts += 1
        try:
            instance = provider.launch(
                LaunchRequest(
                    offering=offering,
                    launch_token=p.launch_token,
                    tags=Tags(rt.settings.broker_id, job.id, p.id),
                    spec=replace(spec_of(job), checkpoint_uri=job.checkpoint_uri),
                    remaining_work_hours=p.work_hours_at_start,
                    resume_from=resume_from(job),
                    checkpoint_interval_hours=Decimal(str(rt.settings.checkpoint_interval_hours)),
                    user_data=p.user_data,
                )
            )
        except ProviderError as exc:
            if _ambiguous(exc) and p.launch_attempts < MAX_LAUNCH_ATTEMPTS:
                p.detail = f"launch attempt {p.launch_attempts} unanswered ({type(exc).__name__}: {exc})"[:500]
                session.add(p)
                add_event(session, job, now, "launch_retry", p.detail, placement_id=p.id)
                session.commit()
                log.info("launch of %s on %s unanswered, retrying next tick: %s", p.id, p.offering_key, exc)
                return None
            scope = launch_failed(session, p, job, exc, now)
            session.commit()
            return scope
        crashpoint("launch.after_cloud_call")
        p.instance_id = instance.id
        p.detail = instance.detail
        session.add(p)
        add_event(session, job, now, "launched", f"instance {instance.id} requested", placement_id=p.id)
        session.commit()
    log.info("instance launched", extra={"instance_id": instance.id})
    return None


def _job_of(rt: Runtime, placement_id: str) -> str:
    with Session(rt.engine) as session:
        return session.exec(select(Placement.job_id).where(Placement.id == placement_id)).first() or ""


def _stage_failures(rt: Runtime, placement_id: str) -> int:
    with Session(rt.engine) as session:
        job_id = session.exec(select(Placement.job_id).where(Placement.id == placement_id)).first()
        events = session.exec(
            select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.kind == "checkpoint_stage_failed")
        ).all()
    return sum(1 for data in events if data.get("placement_id") == placement_id)


def _abandon(
    rt: Runtime, placement_id: str, now: datetime, detail: str, reason: Callable[[Placement, Job], str]
) -> None:
    """Staging cannot go on (the transfer would break the ceiling, or the checkpoint is refused): give the
    placement up (`detail`) and pause the job with `reason(placement, job)`."""
    with Session(rt.engine) as session:
        p = session.exec(locked(select(Placement).where(Placement.id == placement_id))).first()
        if p is None or p.state != PlacementState.LAUNCHING.value or p.instance_id is not None:
            return
        job = session.exec(select(Job).where(Job.id == p.job_id).with_for_update()).one()
        p.state = PlacementState.FAILED.value
        p.ended_at = now
        p.detail = detail
        session.add(p)
        if job.current_placement_id == p.id:
            job.state = JobState.PAUSED.value
            job.current_placement_id = None
            job.wait_reason = reason(p, job)
            job.updated_at = now
            session.add(job)
            add_event(session, job, now, "paused", job.wait_reason, placement_id=p.id)
        session.commit()


def _ambiguous(exc: ProviderError) -> bool:
    """The cloud may have acted on the request: throttled or an untyped failure (timeout, 5xx, connection)."""
    return type(exc) in (Throttled, ProviderError)


def launch_failed(session: Session, p: Placement, job: Job, exc: ProviderError, now: datetime) -> str | None:
    """Record a definitive launch refusal on the locked placement: FAILED with the error's type and message, the
    error's scope blocklisted (zone, region or provider; none for a request-scoped one), the job back to pending,
    and a `launch_failed` event carrying the cloud's message. Used for a refusal at launch and for one the sync step
    reads later from the instance (`Instance.launch_error`). Returns the scope key blocklisted, if any."""
    p.state = PlacementState.FAILED.value
    p.ended_at = now
    p.detail = f"{type(exc).__name__}: {exc}"[:500]
    session.add(p)
    scope = {
        Scope.ZONE: f"{p.provider}/{p.region}/{p.zone}",
        Scope.REGION: f"{p.provider}/{p.region}",
        Scope.PROVIDER: p.provider,
    }.get(exc.scope)
    ttl = {InsufficientCapacity: CAPACITY_BLOCK, QuotaExceeded: QUOTA_BLOCK, AuthError: AUTH_BLOCK}.get(
        type(exc), CAPACITY_BLOCK
    )
    if scope is not None:
        block(session, scope, now + ttl, p.detail)
    if job.state == JobState.RUNNING.value:
        job.state = JobState.PENDING.value
        job.current_placement_id = None
        job.wait_reason = f"launch failed on {p.offering_key} ({type(exc).__name__}); trying elsewhere"
        job.updated_at = now
        session.add(job)
    add_event(
        session,
        job,
        now,
        "launch_failed",
        p.detail,
        placement_id=p.id,
        blocked=scope,
        error=type(exc).__name__,
        cloud_message=str(exc)[:2000],
        code=exc.detail[:200],
    )
    log.info("launch of %s on %s failed: %s", p.id, p.offering_key, exc)
    return scope
