"""Tick step: bring cloud work back on-prem when on-prem pressure drops.

For every job running (or still starting) on a cloud pool, the step asks two questions of the pure policy code:
would the job's remaining work be placed on an on-prem pool now (`broker.loop.place.choose_pool`, the very
choice `place_pending` makes next: the deadline-aware strategy for deadline jobs, cheapest expected cost
otherwise), and does moving it pay (`federation.burst.decide_return`: on-prem starts it at once, the deadline
still holds after a restart, and it saves at least `return_min_saving_usd` against finishing in the cloud)? When
both say yes:
- a job whose instance has not started yet is stopped now and re-queued with all of its work;
- a running job is stopped at its next checkpoint: when the work done since its last checkpoint is at most one
  tick's worth (so at most that much is redone), it is stopped and re-queued with what the checkpoint saved;
  until then the step waits (one `return_planned` event, not one per tick).
The next `place_pending` then places it on-prem, with its checkpoint pre-staged there when a store is configured.
Stopping goes through the same code as any other end of a placement (`broker.loop.sync.end_placement`), under
the same row locks, so a replica syncing the placement at the same moment cannot double-handle it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select as core_select
from sqlmodel import Session, col, select

from broker.finance.budgets import HardBudgetGate
from broker.loop.common import LIVE_STATES, active_blocklist, commit_unless_raced, event_once, in_scope, lock_running
from broker.loop.place import (
    BookMemo,
    choose_pool,
    placement_context,
    preemptions_of,
    refused_pools,
    refused_pools_of_running_jobs,
)
from broker.loop.sync import observe_instances, stop_placement
from broker.runtime import Runtime
from broker.services.bulkhead import bulkhead, job_event_after
from broker.services.jobs import add_event, spec_of
from broker.store.bulk import select_among
from broker.store.tables import Job, Placement
from federation.burst import BurstParams, CloudJob, CloudOption, Verdict, decide_return
from federation.strategies import Preemption
from pricing.book import PriceBook
from providers.base import ComputeProvider, Instance, NotFound, ProviderError
from providers.model import CapacityType, JobSpec, JobState, Offering, hours_between

log = logging.getLogger(__name__)


def return_onprem(rt: Runtime, now: datetime) -> int:
    """Returns the number of cloud placements stopped to move their jobs on-prem.

    Scaling: most ticks nothing can return (every on-prem queue is longer than `return_max_wait_hours`), and then
    the step costs nothing per job. Otherwise a job is screened only when its inputs moved since it was last found
    to stay (`_Memo`: its own state, price and checkpointed work, the open on-prem pools): the rest cost a dict
    lookup. A job screened is first put to the return policy on each open on-prem pool (`_could_return`, no
    placement search); only the jobs that pass are asked the placement policy (at most `return_checks_per_tick`
    of them per tick, never or longest ago asked first), with the pools each job's launches were refused by and
    its reclaims read for all of them at once. The decision is taken first on an unlocked snapshot (the
    placement, its job, the instance read in one batch per provider); only a job that would move is locked, read
    again and decided again before anything is stopped."""
    if not rt.settings.return_onprem:
        return 0
    book = rt.catalog.book(now)
    open_onprem = _open_onprem(book, rt.settings.return_max_wait_hours)
    if not open_onprem:
        rt.return_memo.clear()  # pools reopening are a change for every job
        return 0
    with Session(rt.engine) as session:
        pairs = _candidates(rt, session)
        blocklist = active_blocklist(session, now)
    views = observe_instances(rt, [p for p, _ in pairs], this_tick=True)  # sync's read, for the unlocked screen
    budgets = HardBudgetGate(rt.engine, now, rt.extras)
    memo = _Memo.at(rt, book, open_onprem, blocklist, budgets, now)
    fresh = []
    for p, job in pairs:
        view = views.get(p.instance_id or "")
        current = book.get(p.offering_key)
        if isinstance(view, Instance) and current is not None and not memo.stays(p, job, view, current):
            fresh.append((p, job, view, current))
    screened = []
    for p, job, view, current in _with_specs(rt, fresh):
        spec = spec_of(job)
        if open_onprem.keys() & set(spec.accelerators) and _could_return(
            rt, p, job, spec, view, current, open_onprem, now
        ):
            screened.append((p, job, view, current))
        else:
            memo.keep(p, job, view, current, spec, by_policy=False)
    if not screened:
        memo.save()
        return 0
    # each question to the placement policy costs ~1-4 ms (a deadline job's strategy judges every pool): a fresh
    # process facing tens of thousands of jobs asks at most `return_checks_per_tick` per tick, never-asked and
    # longest-asked first; the rest are not remembered, so they come first in the next tick
    screened = _longest_unasked(rt, screened)[: rt.settings.return_checks_per_tick]
    with Session(rt.engine) as session:
        refused = refused_pools_of_running_jobs(session)
        # the reclaims the deadline policy is told of, read once for every job (jobs with none are missing)
        preempted = preemptions_of(session, [job.id for _, job, _, _ in screened], now)
    returned = 0
    books = BookMemo()  # the deadline jobs of one shape share their usable book and pool histories this tick
    with bulkhead(rt, "return_onprem", now) as bh:
        for p, job, view, current in screened:
            if bh.skip(p.id):
                continue
            with bh.item(p.id, job_event_after(rt, job.id, "return_onprem", now, placement_id=p.id)):
                returned += _return_one(
                    rt,
                    p,
                    job,
                    view,
                    current,
                    blocklist,
                    now,
                    memo,
                    reads=_Reads(budgets, refused.get(job.id, frozenset()), books, preempted.get(job.id, ())),
                )
    memo.save()
    return returned


def _return_one(
    rt: Runtime,
    p: Any,
    job: Any,
    view: Any,
    current: Any,
    blocklist: frozenset[str],
    now: datetime,
    memo: Any,
    *,
    reads: Any,
) -> int:
    with Session(rt.engine) as session:
        verdict = _decide(rt, session, p, job, view, current, blocklist, now, reads)
        if verdict is None:
            memo.keep(p, job, view, current, spec_of(job), by_policy=True)
            return 0
    return _return_locked(rt, p.id, blocklist, now)


_Row = tuple[Any, Any, Instance, Offering]  # a placement, its job, the instance's view, its pool in the book now


def _longest_unasked(rt: Runtime, rows: list[_Row]) -> list[_Row]:
    """`rows` by when the placement policy last gave its verdict on each (never first), then by placement id."""

    def asked(row: _Row) -> tuple[float, str]:
        known = rt.return_memo.get(row[0].id)
        return (known[3].timestamp() if known is not None and known[1] == "policy" else 0.0, row[0].id)

    return sorted(rows, key=asked)


# a verdict of the placement policy (which weighs every pool, availability history, budgets...) is taken again at
# least this often even when none of the inputs the memo keys on moved
POLICY_VERDICT_SECONDS = 300.0


@dataclass
class _Memo:
    """Which cloud jobs were found to stay, on what inputs: a job is screened again only when they moved.

    A job's own inputs: its placement's state, whether it started, the work its last checkpoint saved, the job's
    `updated_at` (a changed ceiling or deadline), and its pool's price and reclaim rate, which may fall (staying
    then pays more; the reclaim rate the broker blends from experience falls a little every tick without a
    reclaim) but not rise. Beside them, a verdict of the return policy alone (`decide_return` on each open on-prem
    pool said keep) depends only on the open on-prem pools' prices (and, for a job with a deadline, their waits):
    a pool opening or getting cheaper screens every job again. A verdict of the placement policy (it chose a cloud
    pool) depends on the whole price book, the blocklist and the job's hard-budget gate, and is retaken after
    `POLICY_VERDICT_SECONDS` whatever moved (on-prem waits and reclaim rates drift every tick). Time alone never
    turns a verdict of the return policy: with less work left, and the deadline nearer, moving pays less and a
    restart risks more."""

    rt: Runtime
    now: datetime
    budgets: HardBudgetGate
    prices: frozenset[tuple[str, Decimal]]  # the open on-prem pools and their prices
    waits: frozenset[tuple[str, Decimal, float]]  # ... and their waits
    world: int  # the price book's prices, waits and availability, and the blocklist
    kept: dict[str, tuple[Any, ...]]

    @classmethod
    def at(
        cls,
        rt: Runtime,
        book: PriceBook,
        open_onprem: dict[str, list[Offering]],
        blocklist: frozenset[str],
        budgets: HardBudgetGate,
        now: datetime,
    ) -> _Memo:
        pools = [o for offerings in open_onprem.values() for o in offerings]
        world = hash(
            (
                frozenset((o.key, o.price.hourly_usd, o.available) for o in book),
                frozenset(o.key for o in pools),
                blocklist,
            )
        )
        return cls(
            rt,
            now,
            budgets,
            frozenset((o.key, o.price.hourly_usd) for o in pools),
            frozenset((o.key, o.price.hourly_usd, o.expected_wait_hours) for o in pools),
            world,
            {},
        )

    @staticmethod
    def _own(p: Any, job: Any, view: Instance) -> tuple[Any, ...]:
        return (p.state, p.started_at is not None, view.checkpointed_work_hours, job.updated_at)

    def stays(self, p: Any, job: Any, view: Instance, current: Offering) -> bool:
        """Found to stay before, on the same inputs, its pool no dearer and no riskier than then (then it is kept
        for the next tick too)."""
        known = self.rt.return_memo.get(p.id)
        if known is None or known[0] != self._own(p, job, view):
            return False
        price, rate = known[4]
        if current.price.hourly_usd > price or current.interruption_rate_per_hour > rate:
            return False  # staying in the cloud costs more than when it was decided
        kind, around, since = known[1], known[2], known[3]
        if kind == "policy":
            fresh = (self.now - since).total_seconds() < POLICY_VERDICT_SECONDS
            same = fresh and around == (self.world, self.budgets.block_reason(job))
        else:
            same = around == (self.waits if kind == "deadline" else self.prices)
        if same:
            self.kept[p.id] = known
        return same

    def keep(self, p: Any, job: Any, view: Instance, current: Offering, spec: JobSpec, *, by_policy: bool) -> None:
        """Remember that `p` stays, and on what."""
        own, pool = self._own(p, job, view), (current.price.hourly_usd, current.interruption_rate_per_hour)
        if by_policy:
            self.kept[p.id] = (own, "policy", (self.world, self.budgets.block_reason(job)), self.now, pool)
        elif spec.deadline_at is not None:
            self.kept[p.id] = (own, "deadline", self.waits, self.now, pool)
        else:
            self.kept[p.id] = (own, "price", self.prices, self.now, pool)

    def save(self) -> None:
        """The verdicts for the next tick: those still standing (a placement gone or moved drops out)."""
        self.rt.return_memo = self.kept


def _with_specs(
    rt: Runtime, rows: list[tuple[Any, Any, Instance, Offering]]
) -> list[tuple[Any, Any, Instance, Offering]]:
    """`rows` with each placement and job as its whole row (the job's spec included): sync's snapshot carries only
    the columns every screen reads. One read of each table (`broker.store.bulk.select_among`)."""
    if not rows:
        return []
    placements = Placement.__table__  # type: ignore[attr-defined]
    jobs = Job.__table__  # type: ignore[attr-defined]
    full_p = _whole(rt, placements, sorted({p.id for p, _, _, _ in rows}))
    full_j = _whole(rt, jobs, sorted({job.id for _, job, _, _ in rows}))
    return [
        (full_p[p.id], full_j[job.id], view, current)
        for p, job, view, current in rows
        if p.id in full_p and job.id in full_j
    ]


def _whole(rt: Runtime, table: Any, ids: list[str]) -> dict[str, Any]:
    with rt.engine.connect() as conn:
        return {r.id: r for r in select_among(conn, core_select(table), table.c.id, ids)}


def _candidates(rt: Runtime, session: Session) -> list[tuple[Any, Any]]:
    """The running cloud jobs of this replica's shards with their placements (an unlocked snapshot). Inside a tick,
    sync's snapshot of the placements it left alone is reused and only those it acted on are read again."""
    query = (
        select(Placement, Job)
        .join(Job, col(Job.id) == Placement.job_id)
        .where(
            col(Placement.state).in_(LIVE_STATES),
            Placement.capacity_type != CapacityType.ON_PREM.value,
            col(Placement.instance_id).is_not(None),
            Job.state == JobState.RUNNING.value,
            col(Job.current_placement_id) == Placement.id,
            in_scope(rt, Placement.id),
        )
    )
    cache = rt.tick_cache
    if cache is None or cache.settled is None:
        return list(session.exec(query).all())
    rows: list[tuple[Any, Any]] = [(p, job) for p, job in cache.settled.values() if _returnable(p, job)]
    for start in range(0, len(cache.touched), 1000):
        rows.extend(session.exec(query.where(col(Placement.id).in_(cache.touched[start : start + 1000]))).all())
    return rows


_ON_PREM, _RUNNING = CapacityType.ON_PREM.value, JobState.RUNNING.value  # (an enum's `.value` is a slow read)


def _returnable(p: Placement, job: Job) -> bool:
    """The candidates query's condition, on a snapshot row."""
    return (
        p.state in LIVE_STATES
        and p.capacity_type != _ON_PREM
        and p.instance_id is not None
        and job.state == _RUNNING
        and job.current_placement_id == p.id
    )


def _open_onprem(book: PriceBook, max_wait_hours: float) -> dict[str, list[Offering]]:
    """By accelerator, the on-prem pools that could start a job within `max_wait_hours` (no other pool can take a
    job back: `decide_return` keeps a job in the cloud for any other)."""
    out: dict[str, list[Offering]] = defaultdict(list)
    for o in book:
        if o.capacity_type is CapacityType.ON_PREM and o.expected_wait_hours <= max_wait_hours:
            out[o.accelerator].append(o)
    return out


def _could_return(
    rt: Runtime,
    p: Placement,
    job: Job,
    spec: JobSpec,
    inst: Instance,
    current: Offering,
    open_onprem: dict[str, list[Offering]],
    now: datetime,
) -> bool:
    """The screen before the placement policy: could `decide_return` say RETURN for any open on-prem pool of the
    job's accelerators? Whatever pool `choose_pool` picks, the verdict is `decide_return`'s on that pool, so when
    none of them would return the job (a cloud job cheaper to finish where it is, a deadline a restart would miss:
    three in four jobs on a tick of `benchmarks/tick_bench.py`) the job stays and the policy is not asked (a pure
    computation per pool; no placement search)."""
    remaining, started = _remaining(p, inst)
    pools = [o for accelerator in spec.accelerators for o in open_onprem.get(accelerator, ())]
    return any(_verdict(rt, job, spec, current, o, remaining, started, now) is not None for o in pools)


def _remaining(p: Placement, inst: Instance) -> tuple[Decimal, bool]:
    """(the work left if `p` stopped now: all of it less what the instance's last checkpoint saved, started?)."""
    started = p.started_at is not None
    done = Decimal("0")
    if started and inst.checkpointed_work_hours is not None:
        done = inst.checkpointed_work_hours
    return max(Decimal("0"), p.work_hours_at_start - done), started


def _verdict(
    rt: Runtime,
    job: Job,
    spec: JobSpec,
    current: Offering,
    onprem: Offering,
    remaining: Decimal,
    started: bool,
    now: datetime,
) -> _Return | None:
    """`federation.burst.decide_return` for moving `job` from `current` to the on-prem pool `onprem`."""
    params = BurstParams(
        onprem_usd_per_gpu_hour=float(onprem.price.hourly_usd / onprem.accelerator_count),
        return_min_saving_usd=rt.settings.return_min_saving_usd,
        return_max_wait_hours=rt.settings.return_max_wait_hours,
        restart_hours=rt.settings.restart_hours,
        placement=rt.params,
    )
    cloud = CloudOption(current, 1, rt.params)
    decision = decide_return(CloudJob(job.id, spec, cloud, remaining, started), now, onprem.expected_wait_hours, params)
    if decision.verdict is not Verdict.RETURN:
        return None
    return _Return(onprem, decision.reason)


def _return_locked(rt: Runtime, pid: str, blocklist: frozenset[str], now: datetime) -> int:
    """Decide again under the row locks (placement, then job) with a fresh read of the instance, and act."""
    with Session(rt.engine, expire_on_commit=False) as session:
        found = lock_running(session, pid)
        if found is None:
            return 0
        p, job = found
        provider = rt.provider(p.provider)
        current = rt.catalog.book(now).get(p.offering_key)
        if provider is None or current is None:
            return 0
        try:
            inst = provider.get(p.instance_id)
            decision = _decide(rt, session, p, job, inst, current, blocklist, now)
            if decision is None:
                return 0
            returned = _act(rt, session, provider, p, job, inst, decision, now)
        except NotFound:
            return 0  # sync records the disappearance
        except ProviderError as exc:
            log.warning("returning %s on-prem: %s failed: %s", job.id, p.provider, exc)
            session.rollback()
            return 0
        return returned if commit_unless_raced(session, f"returning {job.id} on-prem") else 0


@dataclass(frozen=True)
class _Reads:
    """What the screen of many jobs reads once for all of them and hands `_decide` per job: the hard-budget gate,
    the pools the job's launches were refused by, the shared `BookMemo`, and the job's reclaims."""

    budgets: HardBudgetGate
    refused: frozenset[str]
    memo: BookMemo
    preemptions: tuple[Preemption, ...]


@dataclass(frozen=True)
class _Return:
    onprem: Offering
    reason: str


def _decide(
    rt: Runtime,
    session: Session,
    p: Placement,
    job: Job,
    inst: Instance,
    current: Offering,
    blocklist: frozenset[str],
    now: datetime,
    reads: _Reads | None = None,
) -> _Return | None:
    """Should `job` move on-prem now (module docstring)? Reads only; None when it stays. `reads` is what the
    screen of many jobs read for all of them at once (else each is read here)."""
    remaining, started = _remaining(p, inst)
    refused = reads.refused if reads is not None else refused_pools(session, job)
    ctx = replace(placement_context(rt, job, now, blocklist | refused), remaining_work_hours=remaining)
    best, _, _ = choose_pool(
        rt,
        session,
        job,
        rt.catalog.book(now),
        ctx,
        now,
        reads.budgets if reads is not None else None,
        explain=False,
        memo=reads.memo if reads is not None else None,
        preemptions=reads.preemptions if reads is not None else None,
    )
    if best is None or best.offering.capacity_type is not CapacityType.ON_PREM:
        return None
    return _verdict(rt, job, spec_of(job), current, best.offering, remaining, started, now)


def _act(
    rt: Runtime,
    session: Session,
    provider: ComputeProvider,
    p: Placement,
    job: Job,
    inst: Instance,
    decision: _Return,
    now: datetime,
) -> int:
    """Stop the placement now (not started, or at a fresh checkpoint) or plan the move for its next checkpoint."""
    started = p.started_at is not None
    if started and not _checkpoint_is_fresh(rt, p, inst, now):
        why = f"at its next checkpoint: {decision.reason} (to {decision.onprem.key})"
        event_once(session, job, p, now, "return_planned", why)
        return 0
    why = f"returning on-prem to {decision.onprem.key}: {decision.reason}"
    stop_placement(session, provider, p, job, now, why)
    if not started:
        job.remaining_work_hours = p.work_hours_at_start
    session.add(job)
    add_event(session, job, now, "returning_onprem", why, placement_id=p.id, onprem_offering=decision.onprem.key)
    return 1


def _checkpoint_is_fresh(rt: Runtime, p: Placement, inst: Instance, now: datetime) -> bool:
    """At most one tick's work since the last checkpoint (by the instance's report, else by the cadence)."""
    assert p.started_at is not None
    ran = hours_between(p.started_at, now)
    tick = Decimal(str(rt.settings.tick_interval_seconds)) / 3600
    if inst.checkpointed_work_hours is not None:
        return ran - inst.checkpointed_work_hours <= tick
    interval = Decimal(str(rt.settings.checkpoint_interval_hours))
    return ran % interval <= tick
