"""A control-loop replica for the many-replicas test and benchmark:
`python -m tests.replica_worker DONE_FILE [STEADY_TICKS]` (settings from the OVERSPILL_* environment).

Ticks on the real clock, `OVERSPILL_TICK_INTERVAL_SECONDS` apart, until DONE_FILE exists and a tick placed
nothing (the driver creates it once every submission has been answered), then `STEADY_TICKS` more (default 0:
ticks with every job placed and running, to time the loop at full load), then prints one JSON line: ticks run,
placements this replica made, every step error (a deadlock or a lost update would show here), the duration of
each tick of both phases, and the shards (`broker.store.shards`) its last tick held.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from broker.config.settings import Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.store.db import utcnow


def main() -> None:
    done = Path(sys.argv[1])
    steady_ticks = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    logging.basicConfig(level=logging.ERROR)
    settings = Settings()
    rt = build_runtime(settings)
    rt.shares_work = True  # a long-running replica, as `overspill serve` runs one
    ticks = placed = 0
    errors: list[str] = []
    placing_seconds: list[float] = []
    steady_seconds: list[float] = []
    steady_left = None  # counts down once every job is placed
    while steady_left is None or steady_left > 0:
        finished = done.exists()
        started = time.perf_counter()
        report = tick(rt, utcnow())
        seconds = time.perf_counter() - started
        ticks += 1
        placed_now = report.count("place_pending")
        placed += placed_now
        errors.extend(f"{s.name}: {s.error}" for s in report.steps if s.error)
        if steady_left is None:
            placing_seconds.append(seconds)
            if finished and placed_now == 0:
                steady_left = steady_ticks
                continue
        else:
            steady_seconds.append(seconds)
            steady_left -= 1
        time.sleep(settings.tick_interval_seconds)
    summary = {
        "ticks": ticks,
        "placed": placed,
        "errors": errors,
        "placing_tick_seconds": placing_seconds,
        "steady_tick_seconds": steady_seconds,
        "shards": report.shards,  # of the last tick
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
