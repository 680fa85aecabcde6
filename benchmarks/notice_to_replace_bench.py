"""The broker's share of notice -> re-placed: from the agent's final `preempted` report reaching the broker to the
job's next placement (placed, and launched at the cloud), with `overspill serve`'s interval loop running.

Set-up as the tests use it (tests/test_reports_mailbox.py): a job launched by real ticks on moto EC2 + S3 (g5
pools in us-east-1's zones), the agent's signed reports written as the agent writes them (it is not booted). Each
round: a fresh job, the loop (`broker.loop.runner.run_forever`, the tick interval of the settings: 10 s) started and
its first tick done, a pause of `--pause` seconds into the interval, then the preempt notice and the final report:
- `callback`: both by `POST /v1/placements/{id}/reports` (the agent's callback);
- `mailbox`: the notice by the callback, the final report only in the tenant's mailbox in S3 (the callback lost).
`--baseline` runs the loop as it was before issue 31 (a tick every interval, nothing in between) for comparison.
Target: under 1 s from the final report to the new placement (the issue measured 12.2 s, the next tick).

Run (from the repository root, in the environment where the project is installed with the dev extra):
    python benchmarks/notice_to_replace_bench.py                 # 3 rounds per path
    python benchmarks/notice_to_replace_bench.py --baseline      # the loop before: wait for the next tick
    python benchmarks/notice_to_replace_bench.py --json          # {"callback": {...}, "mailbox": {...}}
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _old_loop(rt: Any, stop: threading.Event) -> None:
    """The interval loop before the wake-up: a tick, then sleep the interval."""
    from broker.loop.tick import tick

    rt.shares_work = True
    while not stop.is_set():
        tick(rt, rt.clock())
        stop.wait(rt.settings.tick_interval_seconds)


def _round(moto_url: str, path: str, pause: float, baseline: bool) -> dict[str, float]:
    import pytest
    from sqlmodel import Session

    from agent import protocol as proto
    from broker.loop.runner import run_forever
    from broker.store.tables import Job, Placement
    from tests.test_reports_mailbox import _body, launch

    mp = pytest.MonkeyPatch()
    with tempfile.TemporaryDirectory() as tmp:
        at = launch(moto_url, Path(tmp), mp, instance_types=["g5.xlarge", "g5.2xlarge"])
        first = at.placement
        stop = threading.Event()
        at.rt.last_tick_seconds = 0.0
        loop = threading.Thread(target=_old_loop if baseline else run_forever, args=(at.rt, stop), daemon=True)
        loop.start()
        while at.rt.last_tick_seconds == 0.0:  # the loop's first tick is done: the interval starts
            time.sleep(0.01)
        time.sleep(pause)
        notice = proto.Notice(proto.NoticeSource.AWS, "preempt", at.now.isoformat(), None)
        answer = at.api.post(
            f"/v1/placements/{first.id}/reports", json=_body(at.report(proto.ReportKind.NOTICE, 1, notice=notice))
        )
        assert answer.status_code == 200, answer.text
        time.sleep(0.5)  # the agent signals the workload and uploads its final checkpoint meanwhile
        final = at.report(proto.ReportKind.FINAL, 2, outcome=proto.Outcome.PREEMPTED, checkpointed=0.5)
        sent = time.monotonic()
        if path == "callback":
            answer = at.api.post(f"/v1/placements/{first.id}/reports", json=_body(final))
            assert answer.status_code == 200, answer.text
        else:
            at.post_mailbox(final)
        placed = launched = None
        while time.monotonic() - sent < 60 and launched is None:
            with Session(at.rt.engine) as s:
                job = s.get(Job, at.job_id)
                now_id = job.current_placement_id if job else None
                p = s.get(Placement, now_id) if now_id and now_id != first.id else None
            if p is not None:
                placed = placed or time.monotonic()
                if p.instance_id:
                    launched = time.monotonic()
            time.sleep(0.01)
        stop.set()
        loop.join(timeout=60)
        at.api.close()
        mp.undo()
        at.rt.engine.dispose()
    return {
        "to_placed_s": round((placed or float("nan")) - sent, 3),
        "to_launched_s": round((launched or float("nan")) - sent, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds into the tick interval the notice comes")
    parser.add_argument("--path", choices=("callback", "mailbox", "both"), default="both")
    parser.add_argument("--baseline", action="store_true", help="the loop before: nothing between two ticks")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    from tests.moto_server import running_moto_server

    paths = ["callback", "mailbox"] if args.path == "both" else [args.path]
    results: dict[str, Any] = {}
    with running_moto_server() as url:
        for path in paths:
            rounds = [_round(url, path, args.pause, args.baseline) for _ in range(args.rounds)]
            results[path] = {
                "rounds": rounds,
                "median_to_placed_s": statistics.median(r["to_placed_s"] for r in rounds),
                "median_to_launched_s": statistics.median(r["to_launched_s"] for r in rounds),
                "max_to_launched_s": max(r["to_launched_s"] for r in rounds),
            }
    results["loop"] = "before (tick only)" if args.baseline else "with wake-up"
    if args.json:
        print(json.dumps(results))
        return
    print(f"final preempted report -> job re-placed ({results['loop']}; tick interval 10 s, {args.rounds} rounds)")
    for path in paths:
        r = results[path]
        each = ", ".join(f"{x['to_placed_s']:.2f}/{x['to_launched_s']:.2f}" for x in r["rounds"])
        placed, launched = r["median_to_placed_s"], r["median_to_launched_s"]
        print(
            f"  {path:8}  placed median {placed:.2f} s, launched median {launched:.2f} s"
            f" (max {r['max_to_launched_s']:.2f} s)   [placed/launched per round: {each}]"
        )


if __name__ == "__main__":
    main()
