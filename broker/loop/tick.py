"""The control loop: one `tick(rt, now)` runs every step once, in order, each guarded and timed.

Steps: refresh prices -> sample on-prem pressure -> burst opted-in Slurm jobs -> act on interruption notices
-> read the instance agents' reports from the mailboxes -> sync instances (the agents' verdicts, cancellations,
ceilings, finishes, preemptions) -> return cloud work on-prem when its queue drained -> move running deadline jobs
where the deadline policy moves them (at their next checkpoint) -> place pending jobs
-> accrue cost -> sweep orphans -> check budgets (threshold alerts) -> run due reports -> deliver reports (queued
by the API and by scheduled runs; each within a total deadline, the step within `delivery_step_seconds`).
Providers with `begin_tick(now)` / `end_tick()` (the Slurm provider) are told where a tick starts and ends, so
they read their scheduler once per tick for every step. Every step is idempotent and safe with several replicas
ticking at once against PostgreSQL, so `overspill tick` can run from cron or a serverless schedule as well as
from `overspill serve`'s interval loop. One step failing is logged and reported; the next still runs.

Long-running replicas share the work (`rt.shares_work`, set by `broker.loop.runner.run_forever`: `overspill
serve` and `overspill tick --loop`): before its steps such a tick claims this replica's shard leases
(`broker.store.shards`), and the per-placement steps (read_mailboxes, sync_instances, return_onprem, move_deadline_jobs,
accrue_costs) read only the placements of those shards. The global steps (prices, pressure, bursting,
interruption notices, placing pending jobs, budgets, reports) keep running in every replica, safe as before
through row locks; the orphan sweep runs in one replica per interval (a lease). A one-shot tick (`overspill tick`
from cron, the serverless schedule, a test) holds no lease and works on every placement: a process that lives for
one tick would only keep its shards from the next one.

The cyclic garbage collector is paused while a tick runs (`collector_relaxed`): a tick with tens of thousands of
running placements allocates hundreds of thousands of objects that live until its step ends (rows, instance
views), which made the collector run thousands of times per tick and scan everything the process keeps (a fifth
of a tick's time at 20,000 jobs, in `benchmarks/tick_bench.py`). Reference counting still frees what a tick drops;
the cycles it leaves are collected once the tick is over.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from broker.api.request_id import new_request_id
from broker.finance.budgets import check_budgets
from broker.finance.reports.runs import deliver_pending_reports, run_due_reports
from broker.loop.accrue import accrue_costs
from broker.loop.feeds import refresh_prices, sample_pressure
from broker.loop.interrupts import handle_interruptions, sweep_orphans
from broker.loop.mailbox import read_mailboxes
from broker.loop.move import move_deadline_jobs
from broker.loop.onprem_burst import burst_onprem_queue
from broker.loop.place import place_pending
from broker.loop.return_onprem import return_onprem
from broker.loop.sync import sync_instances
from broker.observe.logging_setup import log_context, log_scope
from broker.runtime import Runtime, TickCache
from broker.store.shards import EVERYTHING, SHARDS, ShardScope, claim_shards

log = logging.getLogger(__name__)

STEPS: tuple[tuple[str, Callable[[Runtime, datetime], int]], ...] = (
    ("refresh_prices", refresh_prices),
    ("sample_pressure", sample_pressure),
    ("burst_onprem_queue", burst_onprem_queue),
    ("handle_interruptions", handle_interruptions),
    ("read_mailboxes", read_mailboxes),
    ("sync_instances", sync_instances),
    ("return_onprem", return_onprem),
    ("move_deadline_jobs", move_deadline_jobs),
    ("place_pending", place_pending),
    ("accrue_costs", accrue_costs),
    ("sweep_orphans", sweep_orphans),
    ("check_budgets", check_budgets),
    ("run_due_reports", run_due_reports),
    ("deliver_reports", deliver_pending_reports),
)


@dataclass
class StepResult:
    name: str
    count: int
    seconds: float
    error: str = ""


@dataclass
class TickReport:
    at: datetime
    tick_id: str = ""
    steps: list[StepResult] = field(default_factory=list)
    shards: int = 0  # how many shards (of broker.store.shards.SHARDS) this replica's per-placement steps covered

    @property
    def ok(self) -> bool:
        return not any(s.error for s in self.steps)

    def count(self, name: str) -> int:
        return next((s.count for s in self.steps if s.name == name), 0)


Step = tuple[str, Callable[[Runtime, datetime], int]]


def tick(rt: Runtime, now: datetime, steps: Sequence[Step] = STEPS) -> TickReport:
    """Run `steps` (default: all of STEPS, in order) once. The serverless deployment passes STEPS without the
    steps that have schedules of their own there. Log records inside carry this round's `tick_id`; step durations
    and failures go to `rt.metrics`."""
    report = TickReport(at=now, tick_id=new_request_id("tick"))
    rt.shards = _claim(rt, now) if rt.shares_work else None
    rt.tick_cache = TickCache()
    report.shards = len(rt.shards.shards) if rt.shards is not None else SHARDS
    scoped = _tick_scoped(rt)
    for source in scoped:
        source.begin_tick(now)
    try:
        with collector_relaxed():
            _run_steps(rt, now, steps, report)
    finally:
        rt.shards = rt.tick_cache = None
        for source in scoped:
            source.end_tick()
    return report


TICK_GC_THRESHOLD = 100_000  # young objects between two collections while a tick runs (Python's default: 700)
_relaxed: dict[str, Any] = {"depth": 0, "saved": None}
_relaxed_lock = threading.Lock()


@contextmanager
def collector_relaxed() -> Iterator[None]:
    """The cyclic garbage collector relaxed inside: a young-generation collection once TICK_GC_THRESHOLD objects
    were allocated, not 700 (a large tick keeps tens of thousands of rows alive until its steps end, and the default
    rate ran hundreds of collections a tick, each scanning all of them). It still runs, so the API threads of the
    same process never go without one however long a tick takes. Restored as it was once the last of the
    overlapping ticks of this process (threads) is over."""
    with _relaxed_lock:
        if _relaxed["depth"] == 0:
            saved = gc.get_threshold()
            _relaxed["saved"] = saved
            gc.set_threshold(max(saved[0], TICK_GC_THRESHOLD), *saved[1:])
        _relaxed["depth"] += 1
    try:
        yield
    finally:
        with _relaxed_lock:
            _relaxed["depth"] -= 1
            if _relaxed["depth"] == 0:
                gc.set_threshold(*_relaxed["saved"])


def _claim(rt: Runtime, now: datetime) -> ShardScope:
    """This replica's shards for this tick. The lease outlives the tick it starts (at least three of the last
    tick's durations plus an interval), so a slow tick does not hand its shards over while it still works on them;
    if the claim itself fails (the database away), every shard, which is what ticks did before sharding."""
    seconds = max(rt.settings.shard_lease_seconds, 3 * rt.last_tick_seconds + rt.settings.tick_interval_seconds)
    try:
        return claim_shards(rt.engine, rt.replica_id, now, timedelta(seconds=seconds))
    except Exception:  # the per-step guard's rule: report, keep going (each step then fails or works on its own)
        log.exception("claiming shard leases failed; this tick works on every shard")
        return EVERYTHING


def _tick_scoped(rt: Runtime) -> list[Any]:
    """Providers and feeds that read their whole state once per tick (`begin_tick` / `end_tick`, e.g. Slurm: one
    squeue and one sinfo shared by pressure, prices, bursting and sync), each once."""
    seen: dict[int, Any] = {}
    for source in [*rt.providers.values(), *rt.pressure_sources, *rt.offering_sources]:
        if hasattr(source, "begin_tick") and hasattr(source, "end_tick"):
            seen.setdefault(id(source), source)
    return list(seen.values())


def _run_steps(rt: Runtime, now: datetime, steps: Sequence[Step], report: TickReport) -> None:
    with log_context(tick_id=report.tick_id):
        for name, step in steps:
            started = time.perf_counter()
            try:
                with log_scope():  # job context a step binds ends with the step
                    count = step(rt, now)
                error = ""
            except Exception as exc:  # the reconciler's per-step guard: report, keep going
                log.exception("tick step %s failed", name, extra={"step": name})
                count, error = 0, f"{type(exc).__name__}: {exc}"
            seconds = time.perf_counter() - started
            rt.metrics.observe_step(name, seconds, failed=bool(error))
            report.steps.append(StepResult(name, count, seconds, error))
        rt.metrics.tick_completed()
        rt.last_tick_seconds = sum(s.seconds for s in report.steps)
        log.debug("tick done", extra={"steps": {s.name: (s.count, round(s.seconds, 4)) for s in report.steps}})
