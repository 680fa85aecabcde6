"""Web console speed with 10,000 jobs in the database: API response times and page render times in Chromium.

What it measures
  1. Fills a fresh database (SQLite file, or PostgreSQL with `--db postgresql`) with `--jobs` jobs (default
     10,000) in two tenants: a realistic mix of states (55% succeeded, 12% running, 15% pending, 6% failed,
     6% cancelled, 6% paused), a placement for every job that ran, 6-12 events and 3-8 ledger entries each, and
     one long job with `--long-events` events (default 2,000: a 6-hour run accrued every 10 s). Inserted with
     bulk Core inserts, so filling takes seconds; the simulated market's prices come from one real tick.
  2. Starts the broker as a real uvicorn process (tests/console_server.py, control loop off, so nothing moves
     while it measures) and times `--requests` calls per API endpoint the console uses (p50 / p95 / max, ms).
  3. Drives headless Chromium (Playwright, /usr/bin/chromium): for each page (jobs list, the long job's detail,
     pools, costs) a fresh navigation `--loads` times; the render time is `performance.now()` when the page marks
     itself ready (data fetched and drawn), i.e. from navigation start, network and API calls included.
     Target: < 1 s per page.

Run (from the repository root):
    python benchmarks/console_bench.py
    python benchmarks/console_bench.py --jobs 10000 --loads 7 --db postgresql --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, text

from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.store.db import make_engine
from broker.store.tables import CostEntryRow, Job, JobEvent, Placement

REPO_ROOT = Path(__file__).resolve().parents[1]
STATES = [("succeeded", 55), ("running", 12), ("pending", 15), ("failed", 6), ("cancelled", 6), ("paused", 6)]
CHROMIUM = os.environ.get("OVERSPILL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def fill(settings: Settings, n_jobs: int, long_events: int, seed: int) -> str:
    """Populate the database; returns the id of the job with the long timeline."""
    rt = build_runtime(settings)
    now = datetime.now(UTC)
    tick(rt, now)
    pools = [o for o in rt.catalog.book(now)]
    rng = random.Random(seed)
    states = [s for s, weight in STATES for _ in range(weight)]
    jobs: list[dict[str, Any]] = []
    placements: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    start = now - timedelta(days=20)
    for i in range(n_jobs):
        tenant = "demo" if i % 10 else "other"
        created = start + timedelta(seconds=i * 170)
        state = rng.choice(states)
        job_id = f"job_{int(created.timestamp() * 1e9):016x}{i:08x}"
        team, project = rng.choice(["vision", "nlp", "speech", "ranking", "ads"]), rng.choice(["atlas", "hermes"])
        ceiling = Decimal(rng.choice([20, 40, 80, 200]))
        pool = rng.choice(pools)
        ran = state not in ("pending",)
        placement_id = f"plc_{int(created.timestamp() * 1e9):016x}{i:08x}" if ran else None
        spent = Decimal("0")
        n_entries = rng.randint(3, 8) if ran else 0
        for k in range(n_entries):
            usd = (pool.price.hourly_usd * Decimal(rng.randint(1, 30)) / 60).quantize(Decimal("0.0000000001"))
            spent += usd
            entries.append(
                {
                    "job_id": job_id,
                    "placement_id": placement_id,
                    "tenant": tenant,
                    "team": team,
                    "project": project,
                    "provider": pool.provider,
                    "capacity_type": pool.capacity_type.value,
                    "kind": "compute",
                    "period_start_at": created + timedelta(minutes=10 * k),
                    "period_end_at": created + timedelta(minutes=10 * (k + 1)),
                    "hourly_usd": pool.price.hourly_usd,
                    "usd": usd,
                    "on_demand_usd": usd * 3,
                    "created_at": created + timedelta(minutes=10 * (k + 1)),
                }
            )
        kinds = ["submitted"] + (["placed", "launched", "started"] + ["cost_accrued"] * n_entries if ran else [])
        if state in ("succeeded", "failed", "cancelled", "paused"):
            kinds.append({"succeeded": "finished"}.get(state, state))
        for k, kind in enumerate(kinds):
            events.append(
                {
                    "job_id": job_id,
                    "tenant": tenant,
                    "at": created + timedelta(minutes=k),
                    "kind": kind,
                    "message": f"{kind} on {pool.key}",
                    "data": {"placement_id": placement_id} if placement_id else {},
                }
            )
        spec = {
            "name": f"train-{i}",
            "image": "ghcr.io/acme/train:1.0",
            "accelerators": [pool.accelerator],
            "gpu_count": 1,
            "work_gpu_hours": "4",
            "max_total_usd": str(ceiling),
        }
        jobs.append(
            {
                "id": job_id,
                "tenant": tenant,
                "team": team,
                "project": project,
                "name": f"train-{i}",
                "spec": spec,
                "state": state,
                "wait_reason": "waiting for capacity" if state == "pending" else "",
                "priority": 0,
                "max_total_usd": ceiling,
                "spent_usd": spent,
                "work_hours": Decimal("4"),
                "remaining_work_hours": Decimal("0") if state == "succeeded" else Decimal("2"),
                "current_placement_id": placement_id if state == "running" else None,
                "attempts": 1 if ran else 0,
                "origin_settled": False,
                "created_at": created,
                "updated_at": created,
                "finished_at": created + timedelta(hours=1) if state in ("succeeded", "failed", "cancelled") else None,
            }
        )
        if placement_id:
            placements.append(
                {
                    "id": placement_id,
                    "job_id": job_id,
                    "tenant": tenant,
                    "offering_key": pool.key,
                    "provider": pool.provider,
                    "region": pool.region,
                    "zone": pool.zone,
                    "instance_type": pool.instance_type,
                    "capacity_type": pool.capacity_type.value,
                    "accelerator": pool.accelerator,
                    "accelerator_count": pool.accelerator_count,
                    "hourly_usd": pool.price.hourly_usd,
                    "on_demand_hourly_usd": pool.price.hourly_usd * 3,
                    "expected_cost_usd": spent,
                    "launch_token": placement_id,
                    "instance_id": f"i-{i}",
                    "state": "running" if state == "running" else "succeeded",
                    "simulated": True,
                    "work_hours_at_start": Decimal("4"),
                    "created_at": created,
                    "started_at": created + timedelta(minutes=2),
                    "cost_usd": spent,
                }
            )
    long_job = next(j for j in reversed(jobs) if j["tenant"] == "demo" and j["state"] == "running")
    for k in range(long_events):
        events.append(
            {
                "job_id": long_job["id"],
                "tenant": "demo",
                "at": long_job["created_at"] + timedelta(seconds=10 * k),
                "kind": "cost_accrued",
                "message": "$0.0031 for 0.003 h at $1.1/h",
                "data": {"spent_usd": "1.23"},
            }
        )
    with rt.engine.begin() as conn:
        for table, rows in ((Job, jobs), (Placement, placements), (JobEvent, events), (CostEntryRow, entries)):
            for i in range(0, len(rows), 2000):
                conn.execute(insert(table), rows[i : i + 2000])
    if rt.engine.dialect.name == "postgresql":  # fresh statistics, as autovacuum would gather after a bulk load
        with rt.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    rt.engine.dispose()
    print(
        f"filled: {len(jobs)} jobs, {len(placements)} placements, {len(events)} events, {len(entries)} ledger entries"
    )
    return str(long_job["id"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.console_server", "--port", str(port), "--no-loop"],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"broker exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("broker did not start")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def time_api(url: str, long_job: str, n: int) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {DEV_API_KEY}"}
    month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0).isoformat()
    endpoints = [
        ("jobs list (50)", "/v1/jobs?limit=50"),
        ("jobs list, state=running", "/v1/jobs?limit=50&state=running"),
        ("job detail", f"/v1/jobs/{long_job}"),
        ("job events (long job)", f"/v1/jobs/{long_job}/events"),
        ("pools (all)", "/v1/pools?limit=5000"),
        ("pressure", "/v1/pressure"),
        ("readyz", "/readyz"),
        ("costs by team,provider", f"/v1/costs?group_by=team,provider&from={month}"),
        ("metrics", "/metrics"),
        ("console page", "/console/"),
    ]
    out = []
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for name, path in endpoints:
            first = client.get(path)
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                client.get(path)
                times.append((time.perf_counter() - t0) * 1000)
            out.append(
                {
                    "endpoint": name,
                    "status": first.status_code,
                    "bytes": len(first.content),
                    "p50_ms": round(statistics.median(times), 1),
                    "p95_ms": round(pct(times, 0.95), 1),
                    "max_ms": round(max(times), 1),
                }
            )
    return out


def time_pages(url: str, long_job: str, loads: int) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    pages = [
        ("jobs", "#/jobs", "jobs"),
        ("job detail (2,000 events)", f"#/jobs/{long_job}", "job"),
        ("pools", "#/pools", "pools"),
        ("costs", "#/costs", "costs"),
    ]
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.add_init_script(f"sessionStorage.setItem('overspill.key', {json.dumps(DEV_API_KEY)})")
        page = context.new_page()
        page.goto(f"{url}/console/#/jobs")  # warm the browser cache and the server's connection pool
        page.wait_for_selector("body[data-ready=jobs]")
        for name, fragment, ready in pages:
            ready_ms, dcl_ms, rows = [], [], 0
            for _ in range(loads):
                page.goto("about:blank")
                page.goto(f"{url}/console/{fragment}")
                page.wait_for_selector(f"body[data-ready={ready}]", timeout=30_000)
                ready_ms.append(float(page.evaluate("() => Number(document.body.dataset.readyAt)")))
                dcl_ms.append(
                    float(page.evaluate("() => performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"))
                )
                rows = int(page.evaluate("() => document.querySelectorAll('tr, li').length"))
            out.append(
                {
                    "page": name,
                    "dom_content_loaded_ms": round(statistics.median(dcl_ms), 1),
                    "rendered_p50_ms": round(statistics.median(ready_ms), 1),
                    "rendered_max_ms": round(max(ready_ms), 1),
                    "rows_drawn": rows,
                }
            )
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--long-events", type=int, default=2_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set OVERSPILL_CHROMIUM)")
    tmp = Path(tempfile.mkdtemp(prefix="console-bench-"))
    pg = None
    if args.db == "postgresql":
        sys.path.insert(0, str(REPO_ROOT))
        from tests.pg import start_postgres

        pg = start_postgres()
        db_url = str(pg.create_database())
    else:
        db_url = f"sqlite:///{tmp / 'bench.db'}"
    env = {
        **os.environ,
        "OVERSPILL_DATABASE_URL": db_url,
        "OVERSPILL_DATA_DIR": str(tmp),
        "OVERSPILL_LOG_LEVEL": "warning",
        "OVERSPILL_BOOTSTRAP_API_KEY": DEV_API_KEY,
    }
    settings = Settings(database_url=db_url, data_dir=tmp, bootstrap_api_key=DEV_API_KEY)
    t0 = time.perf_counter()
    long_job = fill(settings, args.jobs, args.long_events, args.seed)
    fill_s = time.perf_counter() - t0
    port = free_port()
    proc = start_server(env, port, tmp / "broker.log")
    try:
        url = f"http://127.0.0.1:{port}"
        api = time_api(url, long_job, args.requests)
        pages = time_pages(url, long_job, args.loads)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        make_engine(settings).dispose()
        if pg is not None:
            pg.stop()
    result = {"db": args.db, "jobs": args.jobs, "fill_seconds": round(fill_s, 1), "api": api, "pages": pages}
    if args.json:
        print(json.dumps(result))
        return
    print(f"\n{args.jobs} jobs on {args.db} (filled in {fill_s:.1f} s)\n")
    print(f"{'API endpoint':32} {'status':>6} {'bytes':>9} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for r in api:
        print(f"{r['endpoint']:32} {r['status']:>6} {r['bytes']:>9} {r['p50_ms']:>8} {r['p95_ms']:>8} {r['max_ms']:>8}")
    print(f"\n{'page (Chromium, fresh navigation)':34} {'DOMContentLoaded':>16} {'rendered p50':>13} {'max':>8} rows")
    for r in pages:
        print(
            f"{r['page']:34} {r['dom_content_loaded_ms']:>13} ms {r['rendered_p50_ms']:>10} ms "
            f"{r['rendered_max_ms']:>5} ms {r['rows_drawn']}"
        )


if __name__ == "__main__":
    main()
