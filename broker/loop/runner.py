"""Running the control loop on an interval (for `overspill serve` and `overspill tick --loop`)."""

from __future__ import annotations

import logging
import threading

from broker.loop.tick import tick
from broker.runtime import Runtime

log = logging.getLogger(__name__)


def run_forever(rt: Runtime, stop: threading.Event) -> None:
    """Tick every `tick_interval_seconds` until `stop` is set. A failing tick is logged, never fatal."""
    interval = rt.settings.tick_interval_seconds
    while not stop.is_set():
        report = tick(rt, rt.clock())
        for step in report.steps:
            if step.error:
                log.warning("tick step %s failed: %s", step.name, step.error)
        log.debug("tick: %s", {s.name: (s.count, round(s.seconds, 3)) for s in report.steps})
        stop.wait(interval)
