"""A tick process for concurrency tests: `python -m tests.tick_worker DB_URL TICKS START_ISO STEP_MINUTES`.

Builds its own runtime (as a separate broker replica would) on a clock that moves STEP_MINUTES per tick from
START_ISO, so several workers started together tick the same simulated moments against one database.
"""

from __future__ import annotations

import atexit
import shutil
import sys
from datetime import datetime, timedelta
from pathlib import Path
from tempfile import mkdtemp

from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime


def main() -> None:
    url, ticks, start, step = sys.argv[1], int(sys.argv[2]), datetime.fromisoformat(sys.argv[3]), float(sys.argv[4])
    now = start

    def clock() -> datetime:
        return now

    data_dir = Path(mkdtemp())
    atexit.register(shutil.rmtree, data_dir, True)  # the run's leak check counts folders left behind
    settings = Settings(
        database_url=url, data_dir=data_dir, bootstrap_api_key=DEV_API_KEY, tick_interval_seconds=step * 60
    )
    rt = build_runtime(settings, clock=clock)
    failures = 0
    for _ in range(ticks):
        report = tick(rt, now)
        failures += sum(1 for s in report.steps if s.error)
        for s in report.steps:
            if s.error:
                print(f"{s.name}: {s.error}", file=sys.stderr)
        now += timedelta(minutes=step)
    print(f"ticks={ticks} step_errors={failures}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
