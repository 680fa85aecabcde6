"""Tick step: burst opted-in jobs waiting in the on-prem Slurm queue to the cloud, holding them there meanwhile.

A Slurm user opts a job in with its comment: `overspill-burst` followed by an optional JSON object of a few job
fields, judged against the job's account policy (`broker.slurm.policy`: the account decides tenant, team,
project, the largest ceiling, the images and the monthly budget; the comment may only narrow them):

    sbatch -A acme --gres=gpu:a100:2 --comment='overspill-burst {"max_total_usd": "40", "work_gpu_hours": "16"}' x.sh

A job (or each pending task of an array, one at a time, keyed `<array>_<task>`) is a candidate when it is pending
for capacity (Resources/Priority) and its policy allows it. Which candidates burst is one decision with the
simulator's: under `burst_policy` "economic" (the default), per partition and GPU type, in queue order,
`federation.burst.plan_bursts` with `quote_cloud` (the very functions `overspill simulate` scores) weighs each
one's expected on-prem wait (the provider's queue model) at `burst_value_usd_per_gpu_hour` against the cloud
premium over the partition's internal rate, and its deadline; under "wait_threshold" (the fallback) a wait of
`burst_after_wait_hours` and any cloud pool within its ceiling suffice. A job chosen then bursts unless a hard
budget of its team or project or its account's monthly budget is spent (checked one by one, after the bursts
before it). What the burst runs is the job itself (`broker.slurm.job.script_job`: its batch script, submission
environment, working directory mapped by `slurm_cloud_paths`, its own container), read just before the hold; a job
that cannot run in the cloud as it would on-prem is refused (`job_not_runnable_in_cloud`, the reason in the audit
entry). An array task's own job id and output path are read again after the hold, which splits it out of its
array record. Every decision to burst, refuse or drop is counted
(`overspill_burst_decisions_total`), logged and written to the audit log with the Slurm user and account (a
refusal once per job and reason in a day per process, not every tick).

Exactly once. (1) Hold first: the Slurm job gets the broker's signed mark and `scontrol hold`. (2) Read it again:
only if it is still PENDING and held by us (JobHeldAdmin + our mark) is (3) the broker job committed, keyed by its
origin `<provider>:<target>` (unique, so two replicas cannot both commit it). If Slurm started it in between, the
hold is undone (a running job keeps running) and nothing is recorded: it runs on-prem, once. A crash between (1)
and (3) leaves a job held by us with no broker job: once its mark is `ORPHAN_GRACE` old, a replica records a
cancelled job under that origin (so a late commit elsewhere fails on the unique origin) and releases it.

Settling, per tick:
- the held Slurm job ended on-prem while its burst was pending or running in the cloud (its user cancelled it;
  read from squeue, or from accounting once it left squeue) or was started there (someone released the hold): the
  broker job is cancelled (the sync step stops its instance), so a withdrawn job stops spending and nothing runs
  twice;
- the cloud job succeeded: its log is written to the Slurm job's `--output` path as its user
  (`broker.loop.slurm_output`), then every pending dependent's dependency is rewritten as if the Slurm job had completed
  (`afterok` dependents run, `afternotok` ones never do), then the held job (only that task) is cancelled
  (`SlurmProvider.complete_held`); dependents submitted later are rewritten too while the success is recent;
- the cloud job failed, was paused or cancelled, or found no pool within `burst_give_up_minutes`: the broker job is
  cancelled and the Slurm job released: under priority/basic with its recorded priority (its place in the queue),
  under other priority plugins by the release alone, so Slurm recomputes it and it keeps ageing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from broker.api.audit import record_system
from broker.finance.budgets import budget_block_reason, month_window
from broker.loop.common import bind_job
from broker.loop.place import extra_hourly, launchable_providers, storeless_providers
from broker.loop.slurm_output import write_back
from broker.observe.metrics import BurstReason
from broker.runtime import Runtime
from broker.services.jobs import add_event, new_id, spec_of
from broker.slurm.job import script_job, task_paths
from broker.slurm.policy import OPT_IN, BurstRequest, Refusal, SlurmRequest, burst_request, policy_for
from broker.store.tables import CostEntryRow, Job
from federation.burst import BurstParams, CloudOption, Verdict, WaitingJob, plan_bursts, quote_cloud
from federation.placement import PlacementContext, place
from providers.base import ProviderError
from providers.model import JobSpec, JobState
from providers.slurm.accounting import classify, describe_ending
from providers.slurm.provider import hold_note

log = logging.getLogger(__name__)

ORPHAN_GRACE = timedelta(minutes=10)  # a hold older than this with no broker job was left by a crash
REFUSAL_AUDIT_EVERY = timedelta(hours=24)
REREAD_UNRUNNABLE = timedelta(minutes=1)  # a job refused as not runnable in the cloud is read again after this
DEPENDENT_SWEEP_DAYS = 7
_UNFINISHED = (JobState.PENDING.value, JobState.RUNNING.value, JobState.PAUSED.value)


def _burstable_providers(rt: Runtime) -> list[Any]:
    return [p for p in rt.providers.values() if hasattr(p, "queued_jobs") and hasattr(p, "hold")]


def burst_onprem_queue(rt: Runtime, now: datetime) -> int:
    """Returns the number of Slurm jobs (or array tasks) newly burst."""
    burst = 0
    for provider in _burstable_providers(rt):
        try:
            queued = provider.queued_jobs()
        except ProviderError as exc:
            log.warning("reading the %s queue failed: %s", provider.name, exc)
            continue
        candidates: list[_Candidate] = []
        for q in queued:
            bind_job(None)
            if q.held_by == provider.broker_id:
                _repair_orphan(rt, provider, q, now)
            elif q.burstable and OPT_IN in (q.job.comment or "") and q.held_by is None:
                candidate = _candidate(rt, provider, q, now)
                if candidate is not None:
                    candidates.append(candidate)
        for candidate, reason in _decide(rt, provider, candidates, now):
            burst += _burst(rt, provider, candidate, reason, now)
        _settle(rt, provider, now)
        _sweep_dependents(rt, provider, now)
    _forget_old_refusals(rt, now)
    return burst


@dataclass(frozen=True, slots=True)
class _Candidate:
    """An opted-in job its account's policy allows to burst, with its broker job (not committed yet) and the
    expected on-prem wait the decision weighs."""

    q: Any
    request: BurstRequest
    job: Job
    spec: JobSpec
    wait_hours: float


def _origin(provider: Any, target: str) -> str:
    return f"{provider.name}:{target}"


def _request(q: Any) -> SlurmRequest:
    return SlurmRequest(
        target=q.target,
        name=q.job.name,
        user=q.job.user,
        account=q.job.account,
        qos=q.job.qos,
        partition=q.job.partitions[0] if q.job.partitions else "",
        accelerator=q.accelerator,
        gpus=q.gpus,
        time_limit_minutes=q.job.time_limit,
        comment=q.job.comment,
    )


def _candidate(rt: Runtime, provider: Any, q: Any, now: datetime) -> _Candidate | None:
    """The job as a burst candidate, or None (burst already, refused by its account's policy, or so short a wait
    that no rule would burst it). Budgets are checked by `_burst`, after the bursts committed before it."""
    origin = _origin(provider, q.target)
    with Session(rt.engine) as session:
        if session.exec(select(Job.id).where(Job.origin == origin)).first() is not None:
            return None  # burst once already (held now, or settled)
    clouds = [name for name in rt.providers if name != provider.name]
    decision = burst_request(_request(q), rt.settings.slurm_accounts, rt.settings.slurm_default_images, clouds)
    if isinstance(decision, Refusal):
        _refuse(rt, provider, q, decision, "", now)
        return None
    wait = provider.model().expected_wait_hours(q.accelerator.upper(), q.gpus, now, work_hours=None)
    floor = rt.settings.burst_after_wait_hours if rt.settings.burst_policy == "wait_threshold" else 0.0
    if wait < max(floor, _params(rt, provider, q).min_wait_hours):
        rt.metrics.burst_decision("stay", BurstReason.SHORT_WAIT)
        return None
    job = _new_job(decision, origin, now, q)
    return _Candidate(q, decision, job, spec_of(job), wait)


def _params(rt: Runtime, provider: Any, q: Any) -> BurstParams:
    """The burst economics for a job of this partition: the site's value of waiting, the partition's internal rate
    as the on-prem cost the cloud premium is measured against, the broker's placement parameters."""
    part = q.job.partitions[0] if q.job.partitions else ""
    info = getattr(provider, "partitions", {}).get(part)
    rate = float(info.rate_usd_per_gpu_hour) if info is not None else 0.0
    return BurstParams(
        value_usd_per_gpu_hour=rt.settings.burst_value_usd_per_gpu_hour,
        onprem_usd_per_gpu_hour=rate,
        deadline_margin_hours=rt.settings.burst_deadline_margin_hours,
        min_wait_hours=rt.settings.burst_min_wait_hours,
        restart_hours=rt.settings.restart_hours,
        placement=rt.params,
    )


def _decide(rt: Runtime, provider: Any, candidates: list[_Candidate], now: datetime) -> list[tuple[_Candidate, str]]:
    """The candidates to burst, each with its reason. `burst_policy` "economic" (the default): per partition and
    GPU type, in queue order, `federation.burst.plan_bursts` over the cloud quotes of `quote_cloud`, exactly as
    `overspill simulate` scores it; "wait_threshold": a wait of `burst_after_wait_hours` or more and any cloud
    pool within the job's ceilings."""
    if not candidates:
        return []
    book = rt.catalog.book(now)
    base = PlacementContext(
        now=now,
        remaining_work_hours=Decimal(0),
        params=rt.params,
        launchable=launchable_providers(rt),  # a pool nothing here launches on is no pool to burst to
        extra_hourly_usd=extra_hourly(rt),
        no_checkpoint_store=storeless_providers(rt),
    )
    out: list[tuple[_Candidate, str]] = []
    if rt.settings.burst_policy == "wait_threshold":
        for c in candidates:
            ctx = replace(base, remaining_work_hours=c.spec.work_hours)
            if place(c.spec, book, ctx) is None:
                rt.metrics.burst_decision("stay", BurstReason.NO_CLOUD_POOL)
            else:
                out.append((c, BurstReason.LONG_WAIT))
        return out
    groups: dict[tuple[str, str], list[_Candidate]] = {}
    for c in candidates:
        part = c.q.job.partitions[0] if c.q.job.partitions else ""
        groups.setdefault((part, c.q.accelerator), []).append(c)
    for (part, _acc), group in groups.items():
        params = _params(rt, provider, group[0].q)
        by_id = {c.q.target: c for c in group}
        waiting = [WaitingJob(c.q.target, c.spec, c.spec.work_hours, c.wait_hours) for c in group]
        gpus = provider.partition_gpus(part) if hasattr(provider, "partition_gpus") else None

        def quote(w: WaitingJob, params: BurstParams = params) -> CloudOption | None:
            return quote_cloud(w.spec, book, now, params, base)

        plans = plan_bursts(waiting, quote, now, None, params, gpus)
        for d in plans:
            c = by_id[d.job_id]
            if d.verdict is Verdict.BURST:
                reason = BurstReason.DEADLINE if d.reason.startswith("deadline") else BurstReason.LONG_WAIT
                out.append((c, reason))
                continue
            reason = BurstReason.NO_CLOUD_POOL if d.cloud is None else BurstReason.PREMIUM
            if d.cloud is not None and d.cloud_cost_usd is not None and "max_total_usd" in d.reason:
                reason = BurstReason.NO_CLOUD_POOL
            rt.metrics.burst_decision("stay", reason)
            log.debug("Slurm job %s stays on-prem: %s", c.q.target, d.reason)
    return out


def _burst(rt: Runtime, provider: Any, c: _Candidate, reason: str, now: datetime) -> int:
    """Budgets (team/project hard budgets, the account's monthly budget), then hold, verify, commit (the module
    docstring's exactly-once order)."""
    q, job, wait = c.q, c.job, c.wait_hours
    with Session(rt.engine) as session:  # checked here, after the bursts committed before it in this tick
        hard = budget_block_reason(session, job, now)
        over = _account_budget_refusal(session, provider, c.request, now)
    if hard:
        _refuse(rt, provider, q, Refusal(BurstReason.HARD_BUDGET, hard), c.request.policy.tenant, now)
        return 0  # it stays queued on-prem
    if over:
        _refuse(rt, provider, q, over, c.request.policy.tenant, now)
        return 0
    unrunnable = f"burst-unrunnable:{provider.name}:{q.target}"
    if unrunnable in rt.marks and now - rt.marks[unrunnable] < REREAD_UNRUNNABLE:
        rt.metrics.burst_decision("refuse", BurstReason.JOB_NOT_RUNNABLE)
        return 0  # read and refused a moment ago: not three Slurm calls a tick for it
    built = script_job(  # the user's own batch script, environment and directory
        provider.run, q.target, q.job.array_job_id, q.gpus, c.request, rt.settings, _request(q).partition
    )
    if isinstance(built, Refusal):
        rt.marks[unrunnable] = now
        _refuse(rt, provider, q, built, c.request.policy.tenant, now)
        return 0
    job = _new_job(built.request, _origin(provider, q.target), now, q)
    job.spec["slurm"].update(built.record)
    try:
        held = provider.hold(q.target, f"bursting to the cloud as overspill job {job.id}")
    except ProviderError as exc:
        log.warning("holding Slurm job %s failed: %s", q.target, exc)
        return 0
    if not held.held:
        rt.metrics.burst_decision("drop", BurstReason.STARTED_ON_PREM)
        _audit(rt, provider, q, "DROP", BurstReason.STARTED_ON_PREM, 409, c.request.policy.tenant, now)
        log.info("not bursting Slurm job %s: %s", q.target, held.detail)
        return 0
    job.spec["slurm"]["priority"] = held.priority
    if held.job is not None and held.job.job_id != q.job.job_id:  # an array task got its own job id when held
        own = str(held.job.job_id)
        job.spec["env"] = {**job.spec["env"], "SLURM_JOB_ID": own, "SLURM_JOBID": own}
        job.spec["slurm"].update(task_paths(provider.run, q.target))
    if not _commit(rt, job, q, wait, now):
        return 0
    rt.metrics.burst_decision("burst", reason)
    _audit(rt, provider, q, "BURST", reason, 202, job.tenant, now, ref=job.id)
    bind_job(job)
    log.info("bursting Slurm job %s to the cloud", q.target, extra={"expected_onprem_wait_hours": wait})
    return 1


def _commit(rt: Runtime, job: Job, q: Any, wait: float, now: datetime) -> bool:
    """Record the burst; False when its origin is already taken (another replica's commit, or an orphan repair)."""
    slurm = job.spec.get("slurm") or {}
    with Session(rt.engine, expire_on_commit=False) as session:
        session.add(job)
        add_event(
            session,
            job,
            now,
            "burst_from_onprem",
            f"Slurm job {q.target} of {q.job.user}/{q.job.account} waited for {q.reason}; "
            f"expected on-prem wait {wait:.1f} h: bursting; its batch script runs in {slurm.get('cloud_workdir')}"
            + ("" if slurm.get("env_known", True) else " with only the SLURM_* variables (environment unknown)"),
            slurm_job_id=q.target,
            slurm_workdir=slurm.get("workdir"),
            slurm_output=slurm.get("output"),
            image=job.spec.get("image"),
            slurm_user=q.job.user,
            slurm_account=q.job.account,
            expected_onprem_wait_hours=round(wait, 2),
        )
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            log.info("Slurm job %s was burst by another replica or given back: not committing", q.target)
            return False
    return True


def _new_job(request: BurstRequest, origin: str, now: datetime, q: Any) -> Job:
    create = request.create
    spec = create.model_dump(mode="json")
    spec["slurm"] = {"target": q.target, "user": q.job.user, "account": q.job.account, "priority": None}
    job = Job(
        id=new_id("job"),
        tenant=request.policy.tenant,
        team=create.team,
        project=create.project,
        name=create.name,
        spec=spec,
        state=JobState.PENDING.value,
        wait_reason="burst from the on-prem queue; waiting for the next placement round",
        priority=create.priority,
        max_total_usd=create.max_total_usd,
        max_hourly_usd=create.max_hourly_usd,
        deadline_at=create.deadline,
        checkpoint_uri=None,  # never from the comment: the broker derives checkpoint locations
        origin=origin,
        created_at=now,
        updated_at=now,
    )
    job.work_hours = job.remaining_work_hours = spec_of(job).work_hours
    return job


def _account_budget_refusal(session: Session, provider: Any, request: BurstRequest, now: datetime) -> Refusal | None:
    """The account's monthly budget: this month's ledger spend of its bursts, plus what its unfinished bursts may
    still spend (their ceilings left), plus this job's ceiling, must fit. Ceilings are promises, so the budget is
    never overrun."""
    budget = request.policy.monthly_budget_usd
    if budget is None:
        return None
    start, _ = month_window(now)
    rows = session.exec(
        select(Job.id, Job.spec, Job.state, Job.max_total_usd, Job.spent_usd).where(
            col(Job.origin).startswith(f"{provider.name}:"), Job.tenant == request.policy.tenant
        )
    ).all()
    mine = [r for r in rows if (r[1].get("slurm") or {}).get("account") == request.account]
    spent = Decimal(0)
    if mine:
        total = session.exec(
            select(func.coalesce(func.sum(CostEntryRow.usd), 0)).where(
                col(CostEntryRow.job_id).in_([r[0] for r in mine]), CostEntryRow.period_start_at >= start
            )
        ).one()
        spent = Decimal(str(total))
    reserved = sum((r[3] - r[4] for r in mine if r[2] in _UNFINISHED), Decimal(0))
    need = request.create.max_total_usd
    if spent + reserved + need <= budget:
        return None
    return Refusal(
        BurstReason.ACCOUNT_BUDGET,
        f"account {request.account}: ${spent} spent this month + ${reserved} reserved by running bursts + "
        f"${need} for this one exceeds its monthly_budget_usd ${budget}",
    )


def _refuse(rt: Runtime, provider: Any, q: Any, refusal: Refusal, tenant: str, now: datetime) -> None:
    rt.metrics.burst_decision("refuse", refusal.reason)
    key = f"burst-refusal:{provider.name}:{q.target}:{refusal.reason}"
    last = rt.marks.get(key)
    if last is not None and now - last < REFUSAL_AUDIT_EVERY:
        return
    rt.marks[key] = now
    log.warning("Slurm job %s asks to burst, refused (%s): %s", q.target, refusal.reason, refusal.message)
    detailed = refusal.reason == BurstReason.JOB_NOT_RUNNABLE  # the audit says what to change
    _audit(rt, provider, q, "REFUSE", f"{refusal.reason}: {refusal.message}" if detailed else refusal.reason, 403,
           tenant, now)  # fmt: skip


def _forget_old_refusals(rt: Runtime, now: datetime) -> None:
    for key in [k for k, at in rt.marks.items() if k.startswith("burst-refusal:") and now - at >= REFUSAL_AUDIT_EVERY]:
        del rt.marks[key]
    for key in [k for k, at in rt.marks.items() if k.startswith("burst-unrunnable:") and now - at >= REREAD_UNRUNNABLE]:
        del rt.marks[key]


def _audit(
    rt: Runtime, provider: Any, q: Any, action: str, reason: str, status: int, tenant: str, now: datetime, ref: str = ""
) -> None:
    record_system(
        rt.engine,
        at=now,
        tenant=tenant,
        action=action,
        subject=f"/slurm/{provider.name}/jobs/{q.target}",
        reason=reason,
        status=status,
        actor=f"slurm user={q.job.user} account={q.job.account}",
        ref=ref,
    )


def _repair_orphan(rt: Runtime, provider: Any, q: Any, now: datetime) -> None:
    """A job held by this broker with no burst recorded (a crash between hold and commit): after the grace,
    take its origin with a cancelled job (a late commit then fails) and give the job back to the queue."""
    origin = _origin(provider, q.target)
    with Session(rt.engine) as session:
        if session.exec(select(Job.id).where(Job.origin == origin)).first() is not None:
            return
    marked = _mark_time(q.job.comment)
    if marked is None or now - marked < ORPHAN_GRACE:
        return
    policy = policy_for(rt.settings.slurm_accounts, q.job.account)
    tenant = policy.tenant if policy is not None else rt.settings.bootstrap_tenant
    tomb = Job(
        id=new_id("job"),
        tenant=tenant,
        team="default",
        project="default",
        name=f"slurm-{q.target}",
        spec={"image": "none", "accelerators": [q.accelerator], "gpu_count": q.gpus, "max_total_usd": "0"},
        state=JobState.CANCELLED.value,
        wait_reason="an on-prem hold left without a burst (a crash): released back to Slurm",
        origin=origin,
        origin_settled=True,
        created_at=now,
        updated_at=now,
        finished_at=now,
    )
    with Session(rt.engine) as session:
        session.add(tomb)
        try:
            session.commit()
        except IntegrityError:
            return  # committed meanwhile: it is a real burst
    try:
        provider.release(q.target, owned=True)
    except ProviderError as exc:
        log.warning("releasing orphaned hold on Slurm job %s failed: %s", q.target, exc)
        return
    rt.metrics.burst_decision("release", BurstReason.ORPHAN_HOLD)
    _audit(rt, provider, q, "RELEASE", BurstReason.ORPHAN_HOLD, 200, tenant, now, ref=tomb.id)
    log.warning("released Slurm job %s: held by this broker with no burst recorded", q.target)


def _mark_time(comment: str) -> datetime | None:
    note = hold_note(comment) or {}
    try:
        return datetime.strptime(note.get("at", ""), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _settle(rt: Runtime, provider: Any, now: datetime) -> None:
    """Finish the on-prem side of bursts whose cloud side has an outcome."""
    give_up = timedelta(minutes=rt.settings.burst_give_up_minutes)
    with Session(rt.engine) as session:
        jobs = session.exec(
            select(Job).where(col(Job.origin).startswith(f"{provider.name}:"), Job.origin_settled == False)  # noqa: E712
        ).all()
    live = [j for j in jobs if j.state in (JobState.PENDING.value, JobState.RUNNING.value)]
    lost = _lost_holds(provider, [str(j.origin).split(":", 1)[1] for j in live])
    for job in jobs:
        bind_job(job)
        target = str(job.origin).split(":", 1)[1]
        slurm = job.spec.get("slurm") or {}
        if target in lost and job.state in (JobState.PENDING.value, JobState.RUNNING.value):
            _withdraw(rt, provider, job, target, lost[target], now)
            continue
        if job.state == JobState.SUCCEEDED.value:
            action, reason = "complete", BurstReason.CLOUD_SUCCEEDED
        elif job.state in (JobState.FAILED.value, JobState.CANCELLED.value, JobState.PAUSED.value):
            action, reason = "release", BurstReason.CLOUD_ENDED + job.state
        elif job.state == JobState.PENDING.value and now - job.created_at >= give_up:
            action, reason = "release", BurstReason.GAVE_UP
        else:
            continue
        dependents: list[str] = []
        try:
            if action == "complete":
                write_back(rt, job, now)  # its --output first: an afterok dependent may read it
                dependents = provider.complete_held(target, owned=True)
                message = f"ran in the cloud as {job.id}; the held Slurm job {target} ended as done"
                if dependents:
                    message += f" (dependencies of {', '.join(dependents)} rewritten)"
            else:
                provider.release(target, priority=slurm.get("priority"), owned=True)
                message = f"cloud job {job.state}; Slurm job {target} released on-prem"
                if reason == BurstReason.GAVE_UP:
                    message = f"no cloud placement within {give_up}; Slurm job {target} released on-prem"
        except ProviderError as exc:
            log.warning("settling Slurm job %s failed (retried next tick): %s", target, exc)
            continue
        with Session(rt.engine) as session:
            row = session.exec(select(Job).where(Job.id == job.id).with_for_update()).one()
            row.origin_settled = True
            if action == "complete":  # the sweep must not touch these again (an afternotok turned afterok)
                row.spec = {**row.spec, "slurm": {**slurm, "dependents": dependents}}
            if action == "release" and row.state in (JobState.PENDING.value, JobState.PAUSED.value):
                # the job now runs on-prem: the cloud side must never be resumed or placed again
                row.state = JobState.CANCELLED.value
                row.finished_at = now
                row.wait_reason = "returned to the on-prem queue"
            row.updated_at = now
            session.add(row)
            add_event(session, row, now, "onprem_" + ("completed" if action == "complete" else "released"), message)
            session.commit()
        rt.metrics.burst_decision("cancel_onprem" if action == "complete" else "release", reason)
        _audit_burst(rt, provider, job, target, "SETTLE", reason, now)
        log.info(message)


def _lost_holds(provider: Any, targets: list[str]) -> dict[str, Any]:
    if not targets or not hasattr(provider, "lost_holds"):
        return {}
    try:
        return dict(provider.lost_holds(targets))
    except ProviderError as exc:
        log.warning("checking the holds of bursts on %s failed: %s", provider.name, exc)
        return {}


def _withdraw(rt: Runtime, provider: Any, job: Job, target: str, slurm_job: Any, now: datetime) -> None:
    """The held Slurm job ended on-prem (its user cancelled it; accounting says so after it left squeue) or was
    started there (someone released the hold) while its burst ran in the cloud: the cloud run is cancelled (the
    sync step stops its instance) and the burst settled, so the work never runs twice and a withdrawn job stops
    spending."""
    ended = classify(slurm_job) is not None
    what = f"ended on-prem ({describe_ending(slurm_job)})" if ended else f"was started on-prem ({slurm_job.state})"
    message = f"Slurm job {target} {what} while it ran in the cloud as {job.id}: cloud run cancelled"
    with Session(rt.engine) as session:
        row = session.exec(select(Job).where(Job.id == job.id).with_for_update()).one()
        if row.origin_settled or row.state not in (JobState.PENDING.value, JobState.RUNNING.value):
            return
        row.origin_settled = True
        row.state = JobState.CANCELLED.value
        row.finished_at = now
        row.updated_at = now
        row.wait_reason = f"withdrawn: Slurm job {target} {what}"
        session.add(row)
        add_event(session, row, now, "onprem_withdrawn", message, slurm_job_id=target, slurm_state=slurm_job.state)
        session.commit()
    reason = BurstReason.ENDED_ON_PREM if ended else BurstReason.STARTED_ON_PREM
    rt.metrics.burst_decision("withdraw", reason)
    _audit_burst(rt, provider, job, target, "WITHDRAW", reason, now)
    log.warning(message)


def _audit_burst(rt: Runtime, provider: Any, job: Job, target: str, action: str, reason: str, now: datetime) -> None:
    """The audit entry of what became of a burst (settled, withdrawn), with the Slurm user and account."""
    slurm = job.spec.get("slurm") or {}
    record_system(
        rt.engine,
        at=now,
        tenant=job.tenant,
        action=action,
        subject=f"/slurm/{provider.name}/jobs/{target}",
        reason=reason,
        status=200,
        actor=f"slurm user={slurm.get('user', '')} account={slurm.get('account', '')}",
        ref=job.id,
    )


def _sweep_dependents(rt: Runtime, provider: Any, now: datetime) -> None:
    """Dependents submitted after a burst's Slurm job was ended get their dependency rewritten too."""
    since = now - timedelta(days=DEPENDENT_SWEEP_DAYS)
    with Session(rt.engine) as session:
        rows = session.exec(
            select(Job.origin, Job.spec).where(
                col(Job.origin).startswith(f"{provider.name}:"),
                Job.origin_settled == True,  # noqa: E712
                Job.state == JobState.SUCCEEDED.value,
                col(Job.updated_at) >= since,
            )
        ).all()
    targets = [str(origin).split(":", 1)[1] for origin, _ in rows]
    if not targets:
        return
    done = {d for _, spec in rows for d in (spec.get("slurm") or {}).get("dependents", [])}
    try:
        rewritten = provider.sweep_dependents(targets, done)
    except ProviderError as exc:
        log.warning("rewriting late dependents on %s failed: %s", provider.name, exc)
        return
    if rewritten:
        log.info("rewrote the dependencies of %s: their burst dependency ran in the cloud", ", ".join(rewritten))
