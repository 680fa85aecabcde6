"""The first real hour, measured: the example training job on the local pool, as a newcomer runs it.

Starts `overspill serve` (the local pool on, the simulated market off, the given tick interval) in a temporary
directory, submits `examples/train-local.yaml` (300 steps of 0.1 s, checkpoint every 50: ~30 s of training) with
the `overspill` CLI, follows its log with `overspill logs -f`, sends `overspill notice JOB` once the log shows step
100, and waits for the job to succeed; then checks the final weights are bit-identical to an uninterrupted run
(tests/local_pool_harness.py `run_drill`, the same walk as tests/test_local_pool.py). `--runs` repeats it.

Prints, per run and as medians: `submit_to_finished_s` (submit until the job reads succeeded, notice included),
`notice_to_resumed_s` (the `notice_drill` event until the second attempt's `agent_started` event: the agent's
checkpoint and final report, the broker's re-placement at its next tick, the new attempt's boot and restore) and
`notice_cli_to_finished_s`. `--tick` is the broker's tick interval (default 10 s, `make run`'s; the re-placement
waits for a tick). `--runtime podman` runs the example in the test image (tests/container_images.py).

    python benchmarks/first_job_bench.py [--runs 1] [--tick 10] [--runtime process|podman] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.local_pool_harness import STEPS, Broker, example_job, run_drill


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--tick", type=float, default=10.0, help="the broker's tick interval in seconds")
    parser.add_argument("--runtime", choices=("process", "podman"), default="process")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="overspill-first-job-") as tmp:
            env = {"OVERSPILL_TICK_INTERVAL_SECONDS": str(args.tick), "OVERSPILL_LOCAL_POOL_SLOTS": "1"}
            image = None
            if args.runtime == "podman":
                from tests.container_images import containers_conf, examples_image

                image = examples_image()
                env |= {"OVERSPILL_AGENT_RUNTIME": '{"local": "podman"}', "CONTAINERS_CONF": str(containers_conf())}
            broker = Broker.start(Path(tmp), env)
            try:
                _, figures = run_drill(broker, Path(tmp), example_job(Path(tmp), image=image, **STEPS), image=image)
            finally:
                broker.stop()
        results.append(figures)
        if not args.json:
            print(f"run {len(results)}: {figures}", flush=True)
    medians = {k: round(statistics.median(r[k] for r in results), 1) for k in results[0]}
    out = {"runtime": args.runtime, "tick_seconds": args.tick, "runs": results, **medians}
    print(json.dumps(out) if args.json else f"medians over {len(results)} run(s), tick {args.tick}s: {medians}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
