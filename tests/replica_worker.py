"""A control-loop replica for the many-replicas test and benchmark:
`python -m tests.replica_worker DONE_FILE` (settings from the OVERSPILL_* environment).

Ticks on the real clock, `OVERSPILL_TICK_INTERVAL_SECONDS` apart, until DONE_FILE exists and a tick placed
nothing (the driver creates it once every submission has been answered), then prints one JSON line: ticks run,
placements this replica made, and every step error (a deadlock or a lost update would show here).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from broker.db import utcnow
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.settings import Settings


def main() -> None:
    done = Path(sys.argv[1])
    logging.basicConfig(level=logging.ERROR)
    settings = Settings()
    rt = build_runtime(settings)
    ticks = placed = 0
    errors: list[str] = []
    while True:
        finished = done.exists()
        report = tick(rt, utcnow())
        ticks += 1
        placed_now = report.count("place_pending")
        placed += placed_now
        errors.extend(f"{s.name}: {s.error}" for s in report.steps if s.error)
        if finished and placed_now == 0:
            break
        time.sleep(settings.tick_interval_seconds)
    print(json.dumps({"ticks": ticks, "placed": placed, "errors": errors}))


if __name__ == "__main__":
    main()
