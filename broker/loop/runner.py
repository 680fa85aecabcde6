"""Running the control loop on an interval (for `overspill serve` and `overspill tick --loop`)."""

from __future__ import annotations

import logging
import threading

from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.shards import release_shards

log = logging.getLogger(__name__)


def run_forever(rt: Runtime, stop: threading.Event) -> None:
    """Tick every `tick_interval_seconds` until `stop` is set. A failing tick is logged, never fatal. The process is
    a long-running replica: its ticks share the per-placement work with the other replicas by shard leases
    (`broker.store.shards`). On a clean stop its leases are given back, so the other replicas take its placements at
    their next tick (not only once the leases run out)."""
    interval = rt.settings.tick_interval_seconds
    rt.shares_work = True
    try:
        while not stop.is_set():
            report = tick(rt, rt.clock())
            for step in report.steps:
                if step.error:
                    log.warning("tick step %s failed: %s", step.name, step.error)
            log.debug("tick: %s", {s.name: (s.count, round(s.seconds, 3)) for s in report.steps})
            stop.wait(interval)
    finally:
        try:
            release_shards(rt.engine, rt.replica_id)
        except Exception:  # the database away at shutdown: the leases run out on their own
            log.warning("giving back the shard leases failed; they expire on their own", exc_info=True)
