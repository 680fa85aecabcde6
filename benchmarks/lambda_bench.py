"""Lambda entry point figures: cold start (import, then the first invocation building the runtime and migrating a
fresh database) and warm invocation latency, measured in a fresh Python process as a Lambda container would be.

    python benchmarks/lambda_bench.py                          # SQLite in a temp dir
    python benchmarks/lambda_bench.py --pg-url postgresql://postgres@127.0.0.1:5432/bench   # an empty database
    python benchmarks/lambda_bench.py --calls 300 --json

Prints: import time of broker.serverless (with FastAPI, SQLAlchemy, Mangum...), the first API Gateway event's
time (runtime build + migrations + the request), warm p50/p95 of GET /healthz and of an authenticated GET /v1/jobs
through Mangum, one "tick" task on the simulated market after a "refresh_prices" task, and the process's peak RSS.
Nothing here asserts: the figures go to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, statistics, sys, time
t0 = time.perf_counter()
from broker import serverless
from broker.config.settings import DEV_API_KEY
from tests.serverless_events import http_event, schedule_event
imported = time.perf_counter() - t0
calls = int(sys.argv[1])
t1 = time.perf_counter()
first = serverless.handler(http_event("GET", "/healthz"), None)
first_s = time.perf_counter() - t1
assert first["statusCode"] == 200, first

def timed(event):
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        response = serverless.handler(event, None)
        samples.append(time.perf_counter() - t)
        assert response["statusCode"] == 200, response
    samples.sort()
    return {"p50_ms": 1000 * samples[len(samples) // 2], "p95_ms": 1000 * samples[int(len(samples) * 0.95)]}

health = timed(http_event("GET", "/healthz"))
jobs = timed(http_event("GET", "/v1/jobs", headers={"Authorization": f"Bearer {DEV_API_KEY}"}))
t2 = time.perf_counter()
refreshed = serverless.handler(schedule_event("refresh_prices"), None)
refresh_s = time.perf_counter() - t2
t3 = time.perf_counter()
ticked = serverless.handler(schedule_event("tick"), None)
tick_s = time.perf_counter() - t3
print(json.dumps({
    "import_s": imported, "first_invocation_s": first_s, "healthz": health, "jobs_list": jobs,
    "refresh_prices_s": refresh_s, "pools": refreshed["pools"], "tick_s": tick_s, "tick_ok": ticked["ok"],
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="warm invocations per endpoint")
    parser.add_argument("--pg-url", default="", help="an empty PostgreSQL database instead of SQLite")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
        env |= {
            "OVERSPILL_DATA_DIR": tmp,
            "OVERSPILL_DATABASE_URL": args.pg_url or f"sqlite:///{tmp}/bench.db",
            "PYTHONPATH": str(ROOT),
        }
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(args.calls)], env=env, cwd=ROOT, capture_output=True, text=True
        )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures["database"] = "postgresql" if args.pg_url else "sqlite"
    if args.json:
        print(json.dumps(figures))
        return
    print(f"database: {figures['database']}, {args.calls} warm calls per endpoint")
    print(f"import broker.serverless:      {figures['import_s'] * 1000:8.0f} ms")
    print(f"first invocation (cold start): {figures['first_invocation_s'] * 1000:8.0f} ms  (runtime + migrations)")
    for name in ("healthz", "jobs_list"):
        f = figures[name]
        print(f"warm {name:<26}{f['p50_ms']:8.2f} ms p50 {f['p95_ms']:8.2f} ms p95")
    print(f"refresh_prices task:           {figures['refresh_prices_s'] * 1000:8.0f} ms  ({figures['pools']} pools)")
    print(f"tick task:                     {figures['tick_s'] * 1000:8.0f} ms  (ok={figures['tick_ok']})")
    print(f"peak RSS:                      {figures['peak_rss_mb']:8.0f} MB")


if __name__ == "__main__":
    main()
