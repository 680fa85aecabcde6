"""Tick step: move running cloud jobs with a deadline where the deadline policy moves them.

The simulator asks the deadline policy (`federation.strategies`, `OVERSPILL_DEADLINE_POLICY`) about a job at every
tick, running or not, and for a running job the answer may be a move: back to spot from on-demand once a pool is
up and expected to last, to a clearly cheaper spot pool, or (the DP policies) off the pool to wait. A broker that
asks only about waiting jobs leaves a job on on-demand to its end once it went there: on the us-east-1 month that
alone takes `overspill` from 1.13x to 1.38x the optimum (benchmarks/README.md, "the live loop moves running
jobs"). This step asks the same policy object, with the inputs `place_pending` gives it plus the running pool,
about every running cloud placement of a job with a deadline, at most once per `move_check_seconds` while the
policy keeps it (every tick while a move waits for its checkpoint), and carries a move out as `Plan` promises: at
the job's next checkpoint.

Per tick at most `move_checks_per_tick` placements are asked about, those asked longest ago (or never) first; the
reads beside the job itself (refused pools, unaccrued spend, earlier reclaims) are one statement each for all of
them, the pools' histories one per set of pools (`Reads`). For each placement due:
1. Its progress is estimated: work starts one changeover (`restart_hours`: launch and restore) after the launch,
   or when the instance started if that is later; the work done since the last durable checkpoint (the
   provider's or the agent's figure) is what stopping it now would redo (`RunState.unsaved_work_hours`).
2. The policy is asked about the job on its pool (`RunState.current`). A plan to launch another cloud pool, or to
   wait, is a move; a move to an on-prem pool is left to `return_onprem` (its own economics: savings, queue
   wait), a pause to the sync step's ceiling guard.
3. A move goes ahead only if the same policy, asked about the job as it would be once stopped (the work its
   checkpoint saved, nothing running), does not put it back on the pool it runs on (no stop-and-relaunch churn),
   and the pool it would then launch passes the placement model (ceiling, hourly cap).
4. Under the placement's and the job's row locks, with a fresh read of the instance, all of this is decided
   again. Then a job whose instance has not started, or that is at most one tick's work past its last
   checkpoint, is stopped (`broker.loop.sync.stop_placement`) and goes back to pending with the work its
   checkpoint saved; `place_pending`, the next step of the tick, places it where the policy says. Otherwise one
   `move_planned` event is written and the step asks again next tick. A crash after the stop leaves a pending
   job (placed next tick) or, before the commit, a running placement whose instance is gone (ended by sync).

`federation.simulate.deadline.run_deadline(moves_at_checkpoints=True)` executes moves by the same rule, so the
simulator's `*_live` figures are what this step delivers; `tests/test_move_running.py` replays a trace through the
real loop and gets the simulator's launches, at the same ticks, for the same cost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select as core_select
from sqlmodel import Session, col, select

from broker.finance.budgets import HardBudgetGate
from broker.finance.unaccrued import unaccrued_by, unaccrued_usd
from broker.loop.common import (
    LIVE_STATES,
    active_blocklist,
    bind_job,
    commit_unless_raced,
    event_once,
    in_scope,
    lock_running,
)
from broker.loop.place import (
    BookMemo,
    RunningNow,
    deadline_plan,
    deadline_state,
    placement_context,
    preemptions_of,
    refused_pools,
    refused_pools_of_running_jobs,
    tenant_refusals,
)
from broker.loop.sync import observe_instances, saved_work, stop_placement
from broker.runtime import Runtime
from broker.services.bulkhead import bulkhead, job_event_after
from broker.services.jobs import add_event, spec_of
from broker.store.tables import Job, Placement
from federation.placement import Candidate, evaluate
from federation.strategies import Move, Plan, Preemption
from pricing.book import PriceBook
from providers.base import Instance, NotFound, ProviderError
from providers.model import CapacityType, JobState, Offering, hours_between

log = logging.getLogger(__name__)

_P = Placement.__table__  # type: ignore[attr-defined]
_J = Job.__table__  # type: ignore[attr-defined]
EPS_HOURS = 1e-9
_NEVER = datetime.min.replace(tzinfo=UTC)  # the last check of a placement never asked about sorts first


@dataclass(frozen=True, slots=True)
class Progress:
    """A running placement's work as the step estimates it now (module docstring, 1)."""

    run: RunningNow
    remaining_work_hours: Decimal  # if it keeps running: its work less what it has done
    saved_remaining_hours: Decimal  # if it stops now: its work less what its last checkpoint holds
    started: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    """A move the policy wants: the plan for the job where it runs, the plan for it once stopped, and whether it
    can be stopped now (not started, or at most one tick past its last checkpoint)."""

    plan: Plan
    then: Plan
    now: bool

    def describe(self, current: Offering) -> str:
        to = self.then.offering.key if self.then.move is Move.LAUNCH and self.then.offering else "wait"
        return f"{self.plan.reason} (from {current.key} to {to})"


@dataclass
class Reads:
    """What deciding about a job reads beside the job itself, for one tick: the price book, the blocklist, the
    hard-budget gate, the books and pools' histories per job shape (`BookMemo`), and per job its refused pools, its
    unaccrued spend and its earlier reclaims. `bulk` reads those three for many jobs in one statement each (the
    unlocked screen); a `fresh` one reads them per job (under the row locks, where nothing is taken from an earlier
    read)."""

    book: PriceBook
    blocklist: frozenset[str]
    budgets: HardBudgetGate
    extras: dict[str, Any]  # what instances bill beside compute (`Runtime.extras`), for the unaccrued spend
    memo: BookMemo = field(default_factory=BookMemo)
    refused: dict[str, frozenset[str]] | None = None
    unaccrued: dict[str, Decimal] | None = None
    preempted: dict[str, tuple[Preemption, ...]] | None = None

    def bulk(self, rt: Runtime, job_ids: list[str], now: datetime) -> Reads:
        with Session(rt.engine) as session:
            refused = refused_pools_of_running_jobs(session)
            preempted = preemptions_of(session, job_ids, now)
        unaccrued: dict[str, Decimal] = {}
        with rt.engine.connect() as conn:
            for start in range(0, len(job_ids), 1000):
                among = _P.c.job_id.in_(job_ids[start : start + 1000])
                spend = unaccrued_by(conn, now, (_P.c.job_id,), among, extras=self.extras)
                unaccrued |= {key[0]: usd for key, usd in spend.items()}
        return replace(self, refused=refused, unaccrued=unaccrued, preempted=preempted)

    def fresh(self) -> Reads:
        return replace(self, refused=None, unaccrued=None, preempted=None)

    def refused_of(self, session: Session, job: Job) -> frozenset[str]:
        return self.refused.get(job.id, frozenset()) if self.refused is not None else refused_pools(session, job)

    def unaccrued_of(self, session: Session, job: Job, now: datetime) -> Decimal:
        if self.unaccrued is not None:
            return self.unaccrued.get(job.id, Decimal(0))
        return unaccrued_usd(session.connection(), now, _P.c.job_id == job.id, extras=self.extras)

    def preempted_of(self, session: Session, job: Job, now: datetime) -> tuple[Preemption, ...]:
        found = self.preempted if self.preempted is not None else preemptions_of(session, [job.id], now)
        return found.get(job.id, ())


def move_deadline_jobs(rt: Runtime, now: datetime) -> int:
    """Returns the number of placements stopped to move their jobs. Works on the running cloud placements of jobs
    with a deadline in this replica's shards (`broker.store.shards`; all of them outside a tick), at most
    `move_checks_per_tick` of them per tick, those asked about longest ago (or never) first."""
    if not rt.settings.move_running_jobs:
        return 0
    candidates = _candidates(rt)
    checked = rt.move_checked = {k: at for k, at in rt.move_checked.items() if k in candidates}  # live ones only
    every = rt.settings.move_check_seconds
    due = [k for k in candidates if k not in checked or _age(checked[k], now) >= every]
    due = sorted(sorted(due), key=lambda k: checked.get(k, _NEVER))[: rt.settings.move_checks_per_tick]
    if not due:
        return 0
    rows = _whole_rows(rt, sorted(due))
    with Session(rt.engine) as session:
        blocklist = active_blocklist(session, now)
    base = Reads(rt.catalog.book(now), blocklist, HardBudgetGate(rt.engine, now, rt.extras), rt.extras)
    reads = base.bulk(rt, sorted({job.id for _, job in rows}), now)
    views = observe_instances(rt, [p for p, _ in rows], this_tick=True)  # sync's read, for the unlocked screen
    moved = 0
    with bulkhead(rt, "move_deadline_jobs", now) as bh:
        for p, job in rows:
            bind_job(job, p)
            current = reads.book.get(p.offering_key)
            view = views.get(p.instance_id or "")
            if current is None or not current.available or not isinstance(view, Instance) or view.state.terminal:
                continue  # gone from the book, reclaimed or ended: the sync step's
            if bh.skip(p.id):
                continue
            with bh.item(p.id, job_event_after(rt, job.id, "move_deadline_jobs", now, placement_id=p.id)):
                with Session(rt.engine) as session:
                    verdict = _decide(rt, session, p, job, view, current, now, reads)
                if verdict is None:
                    checked[p.id] = now
                    continue
                moved += _move_locked(rt, p.id, now, reads.fresh())
    bind_job(None)
    return moved


def _candidates(rt: Runtime) -> set[str]:
    """The ids of the running cloud placements of jobs with a deadline in this replica's shards (one read of ids)."""
    query = (
        core_select(_P.c.id)
        .select_from(_P.join(_J, _J.c.id == _P.c.job_id))
        .where(
            _P.c.state.in_(LIVE_STATES),
            _P.c.capacity_type != CapacityType.ON_PREM.value,
            _P.c.instance_id.is_not(None),
            _J.c.state == JobState.RUNNING.value,
            _J.c.current_placement_id == _P.c.id,
            _J.c.deadline_at.is_not(None),
            in_scope(rt, _P.c.id),
        )
    )
    with rt.engine.connect() as conn:
        return {r[0] for r in conn.execute(query).all()}


def _age(at: datetime, now: datetime) -> float:
    return (now - at).total_seconds()


def _whole_rows(rt: Runtime, ids: list[str]) -> list[tuple[Any, Any]]:
    """The placements `ids` with their jobs, whole rows (the job's spec included), in id order."""
    with Session(rt.engine) as session:
        placements = {p.id: p for p in _among(session, Placement, ids)}
        jobs = {j.id: j for j in _among(session, Job, sorted({p.job_id for p in placements.values()}))}
    return [(placements[i], jobs[placements[i].job_id]) for i in ids if i in placements]


def _among(session: Session, model: Any, ids: list[str]) -> list[Any]:
    out: list[Any] = []
    for start in range(0, len(ids), 1000):
        out.extend(session.exec(select(model).where(col(model.id).in_(ids[start : start + 1000]))).all())
    return out


def progress(p: Placement, inst: Instance, current: Offering, now: datetime, restart_hours: float) -> Progress:
    """The work of `p` done and saved as of `now` (module docstring, 1)."""
    started_at = p.started_at or inst.started_at
    work = p.work_hours_at_start
    saved = min(work, saved_work(p, inst) or Decimal(0))
    changeover = Decimal(repr(restart_hours))
    if started_at is None:
        left = max(Decimal(0), changeover - hours_between(p.created_at, now))
        done = saved
    else:
        since_launch = hours_between(p.created_at, now)
        since_start = hours_between(started_at, now)
        working = min(since_launch - changeover, since_start)  # work starts a changeover after launch, or later
        left = max(Decimal(0), -working)
        done = min(work, max(saved, working))
    run = RunningNow(current, float(left), float(done - saved))
    return Progress(run, work - done, work - saved, started_at is not None)


def _decide(
    rt: Runtime,
    session: Session,
    p: Placement,
    job: Job,
    inst: Instance,
    current: Offering,
    now: datetime,
    reads: Reads,
) -> Verdict | None:
    """Should the job of `p` move now (module docstring, 2-3)? Reads only; None when it stays."""
    spec = spec_of(job)
    if spec.deadline_at is None or reads.budgets.block_reason(job):
        return None  # no deadline; or a hard budget allows only on-prem, which is return_onprem's to judge
    book = reads.book
    refused = tenant_refusals(rt, job.tenant)
    if refused:
        book = PriceBook.build([o for o in book if o.provider not in refused], now, book.feed_observed_at)
    done = progress(p, inst, current, now, rt.settings.restart_hours)
    ctx = placement_context(rt, job, now, reads.blocklist | reads.refused_of(session, job))
    spent = ctx.spent_usd + reads.unaccrued_of(session, job, now)
    running = replace(ctx, remaining_work_hours=done.remaining_work_hours, spent_usd=spent)
    history, memo = reads.preempted_of(session, job, now), reads.memo
    told = deadline_state(rt, session, job, spec, book, running, now, run=done.run, memo=memo, preemptions=history)
    plan = deadline_plan(rt, told, book, running, memo)
    if not _moves(plan, current):
        return None
    stopped = replace(running, remaining_work_hours=done.saved_remaining_hours)
    idle = deadline_state(rt, session, job, spec, book, stopped, now, memo=memo, preemptions=history)
    then = deadline_plan(rt, idle, book, stopped, memo)
    if then.move is Move.PAUSE:
        return None
    if then.move is Move.LAUNCH and then.offering is not None:
        if then.offering.key == current.key or then.offering.capacity_type is CapacityType.ON_PREM:
            return None  # it would be placed back where it runs (churn), or on-prem: return_onprem's
        if not isinstance(evaluate(replace(spec, deadline_at=None), then.offering, stopped), Candidate):
            return None  # the pool it would go to cannot take it (ceiling, hourly cap): stay
    tick = rt.settings.tick_interval_seconds / 3600
    return Verdict(plan, then, not done.started or done.run.unsaved_work_hours <= tick + EPS_HOURS)


def _moves(plan: Plan, current: Offering) -> bool:
    """Whether `plan`, for a job running on `current`, moves it: a wait, or a launch of another cloud pool."""
    if plan.move is Move.WAIT:
        return True
    return (
        plan.move is Move.LAUNCH
        and plan.offering is not None
        and plan.offering.key != current.key
        and plan.offering.capacity_type is not CapacityType.ON_PREM
    )


def _move_locked(rt: Runtime, pid: str, now: datetime, reads: Reads) -> int:
    """Decide again under the row locks (placement, then job) with a fresh read of the instance, and act."""
    with Session(rt.engine, expire_on_commit=False) as session:
        found = lock_running(session, pid)
        if found is None:
            return 0
        p, job = found
        provider = rt.provider(p.provider)
        current = reads.book.get(p.offering_key)
        if provider is None or current is None or not current.available:
            return 0
        try:
            inst = provider.get(p.instance_id)
            if inst.state.terminal:
                return 0  # ended meanwhile: the sync step's
            verdict = _decide(rt, session, p, job, inst, current, now, reads)
            if verdict is None:
                rt.move_checked[p.id] = now
                return 0
            why = verdict.describe(current)
            if not verdict.now:
                event_once(session, job, p, now, "move_planned", f"at its next checkpoint: {why}")
                commit_unless_raced(session, f"moving {job.id}")
                return 0
            stop_placement(session, provider, p, job, now, f"moving: {why}")
            to = verdict.then.offering.key if verdict.then.offering is not None else ""
            add_event(session, job, now, "moving", why, placement_id=p.id, from_offering=current.key, to_offering=to)
        except NotFound:
            return 0  # sync records the disappearance
        except ProviderError as exc:
            log.warning("moving %s: %s failed: %s", job.id, p.provider, exc)
            session.rollback()
            return 0
        if not commit_unless_raced(session, f"moving {job.id}"):
            return 0  # cancelled (or ended) meanwhile: the sync step stops what is left of it
        rt.move_checked.pop(p.id, None)
        return 1
