"""Running the control loop on an interval (for `overspill serve` and `overspill tick --loop`).

Between two ticks the loop is not idle: a job whose agent report calls for it at once (a final report, a preempt
notice: `Runtime.wakeup`, marked by the report callback) gets the report steps (`WAKE_STEPS`: read the mailboxes,
sync, place, accrue) run for it right away, and while an instance works to a preempt notice (its final checkpoint
and report on the way) the mailboxes alone are read every `NOTICE_POLL_SECONDS` (the other steps run once one
brings a report), so the job is re-placed within about a second of its final report, not at the next tick.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlmodel import Session, col, func, select

from broker.loop.accrue import accrue_costs
from broker.loop.mailbox import read_mailboxes
from broker.loop.place import place_pending
from broker.loop.sync import sync_instances
from broker.loop.tick import Step, TickReport, tick
from broker.runtime import Runtime
from broker.services.agent_reports import LIVE
from broker.store.shards import release_shards
from broker.store.tables import Placement

log = logging.getLogger(__name__)

WAKE_STEPS: tuple[Step, ...] = (
    ("read_mailboxes", read_mailboxes),
    ("sync_instances", sync_instances),
    ("place_pending", place_pending),
    ("accrue_costs", accrue_costs),
)
NOTICE_POLL_SECONDS = 0.5  # mailbox reads while an instance works to a preempt notice
STOP_POLL_SECONDS = 0.25  # how soon a waiting loop sees `stop`


def run_forever(rt: Runtime, stop: threading.Event) -> None:
    """Tick every `tick_interval_seconds` until `stop` is set, running `WAKE_STEPS` in between whenever a report
    wakes the loop (see the module docstring). A failing tick is logged, never fatal. The process is a
    long-running replica: its ticks share the per-placement work with the other replicas by shard leases
    (`broker.store.shards`). On a clean stop its leases are given back, so the other replicas take its placements at
    their next tick (not only once the leases run out)."""
    interval = rt.settings.tick_interval_seconds
    rt.shares_work = True
    try:
        while not stop.is_set():
            _report(tick(rt, rt.clock()), "tick")
            wait_and_wake(rt, stop, time.monotonic() + interval)
    finally:
        try:
            release_shards(rt.engine, rt.replica_id)
        except Exception:  # the database away at shutdown: the leases run out on their own
            log.warning("giving back the shard leases failed; they expire on their own", exc_info=True)


def wait_and_wake(rt: Runtime, stop: threading.Event, until: float) -> int:
    """Wait until the monotonic time `until` (or `stop`), running `WAKE_STEPS` whenever a report marks a job, and
    every NOTICE_POLL_SECONDS while an instance works to a preempt notice. Returns how many times it ran them."""
    runs = 0
    awaiting = _awaiting_final(rt)
    while not stop.is_set():
        left = until - time.monotonic()
        if left <= 0:
            break
        woken = rt.wakeup.wait(min(left, NOTICE_POLL_SECONDS if awaiting else STOP_POLL_SECONDS))
        if not woken and not awaiting:
            continue
        full_tick_seconds = rt.last_tick_seconds  # a short run must not shorten the ceiling guard's horizon
        steps = WAKE_STEPS
        if woken:
            log.info("woken for %s: running the report steps now", ", ".join(sorted(woken)))
        else:  # only the mailboxes (one list call per store and tenant); the cloud is asked once a report came
            polled = tick(rt, rt.clock(), WAKE_STEPS[:1])
            _report(polled, "mailbox poll")
            steps = WAKE_STEPS[1:] if polled.count("read_mailboxes") else ()
        if steps:
            _report(tick(rt, rt.clock(), steps), "wake")
            runs += 1
        rt.last_tick_seconds = full_tick_seconds
        awaiting = _awaiting_final(rt)
    return runs


def _awaiting_final(rt: Runtime) -> bool:
    """Some live placement that runs the agent has a preempt notice: its final report is on the way."""
    try:
        with Session(rt.engine) as session:
            count = session.exec(
                select(func.count())
                .select_from(Placement)
                .where(
                    col(Placement.state).in_(LIVE),
                    col(Placement.notice_deadline_at).is_not(None),
                    col(Placement.attempt_uri).is_not(None),
                )
            ).one()
    except Exception:  # the database away: the next tick reports it
        log.warning("checking for noticed placements failed", exc_info=True)
        return False
    return bool(count)


def _report(report: TickReport, what: str) -> None:
    for step in report.steps:
        if step.error:
            log.warning("%s step %s failed: %s", what, step.name, step.error)
    log.debug("%s: %s", what, {s.name: (s.count, round(s.seconds, 3)) for s in report.steps})
