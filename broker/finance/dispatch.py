"""Running a tick's deliveries (budget alerts, report runs) side by side, within a time budget.

`run_bounded(tasks, workers=, budget_seconds=, name=)` runs the callables in at most `workers` threads and starts
no new one once `budget_seconds` have passed since it began: those left are not started, and wait for the next
tick (they are still pending in the database). Each task has its own total deadline (`delivery_deadline_seconds`),
so the call returns within about `budget_seconds + deadline`, whatever the receivers do. A task that raises is
logged with its traceback and counted as not done; it never stops the others (one tenant's bad budget or report
cannot hold up another's). Returns how many tasks returned True.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

log = logging.getLogger(__name__)

Task = Callable[[], bool]


def run_bounded(tasks: Iterable[Task], *, workers: int, budget_seconds: float, name: str) -> int:
    started = time.monotonic()
    done = 0
    skipped = 0
    running: set[Future[bool]] = set()

    def collect(finished: Iterable[Future[bool]]) -> None:
        nonlocal done
        for future in finished:
            error = future.exception()
            if error is not None:
                log.error("%s: a delivery failed unexpectedly", name, exc_info=error)
            elif future.result():
                done += 1

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=f"overspill-{name}") as pool:
        for task in tasks:
            while len(running) >= workers:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                collect(finished)
            if time.monotonic() - started >= budget_seconds:
                skipped += 1
                continue
            running.add(pool.submit(contextvars.copy_context().run, task))  # the tick's log context goes along
        finished, _ = wait(running)
        collect(finished)
    if skipped:
        log.info("%s: %d deliveries wait for the next tick (time budget of %g s spent)", name, skipped, budget_seconds)
    return done
