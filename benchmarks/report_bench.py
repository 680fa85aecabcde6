"""Monthly cost report over 100,000 ledger entries: how long each format takes (target < 10 s each).

What it measures, on a fresh database (SQLite file by default, or `--database-url postgresql://...`):
  1. Seeding `--entries` ledger entries spread over October 2026 for one tenant (4 teams, 3 projects, 5 pools on
     AWS, GCP, Azure and on-prem; compute with spot savings, wasted work, egress, corrections) plus 10% more for a
     second tenant that the report must skip. Not part of the target.
  2. For each format (csv, focus, html, pdf): `run_report` end to end (read the month's entries, aggregate,
     render, sha256, store the bytes in `report_run`): wall seconds, output size, and the share spent reading the
     ledger. Each format runs twice; the second run must give the same sha256 (determinism) and its time is
     reported as the warm figure.
  3. The `GET /v1/costs?group_by=team,provider` aggregation (`manage.cost_summary`) over the same month.

Run (from the repository root):
    python benchmarks/report_bench.py
    python benchmarks/report_bench.py --entries 100000 --database-url postgresql://user@host/db --json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.config.settings import Settings
from broker.finance import manage
from broker.finance.costs import entries as read_entries
from broker.finance.reports.runs import run_report
from broker.runtime import build_runtime
from tests.finance_data import seed_ledger

OCT = datetime(2026, 10, 1, tzinfo=UTC)
NOV = datetime(2026, 11, 1, tzinfo=UTC)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--database-url", default="", help="default: a SQLite file in a temporary directory")
    ap.add_argument("--formats", default="csv,focus,html,pdf")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        rt = build_runtime(Settings(data_dir=Path(tmp), database_url=url, simulated=False), clock=lambda: NOV)
        t0 = time.perf_counter()
        seed_ledger(rt.engine, "bench", OCT, days=31, entries=args.entries)
        seed_ledger(rt.engine, "noise", OCT, days=31, entries=args.entries // 10, seed=2)
        seeded = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = len(read_entries(rt.engine, "bench", OCT, NOV))
        read_s = time.perf_counter() - t0
        results: dict[str, Any] = {
            "entries": n,
            "database": rt.engine.dialect.name,
            "python": platform.python_version(),
            "seed_seconds": round(seeded, 2),
            "read_ledger_seconds": round(read_s, 3),
            "formats": {},
        }
        for fmt in args.formats.split(","):
            times, digests, size = [], [], 0
            for _ in range(2):
                t0 = time.perf_counter()
                run = run_report(rt, "bench", fmt, OCT, NOV, NOV)
                times.append(time.perf_counter() - t0)
                digests.append(run.sha256)
                size = run.size_bytes
                assert run.entries == n, (run.entries, n)
            results["formats"][fmt] = {
                "cold_seconds": round(times[0], 3),
                "warm_seconds": round(times[1], 3),
                "bytes": size,
                "identical_rerun": digests[0] == digests[1],
            }
        t0 = time.perf_counter()
        manage.cost_summary(rt, "bench", ["team", "provider"], OCT, NOV)
        results["costs_api_group_by_team_provider_seconds"] = round(time.perf_counter() - t0, 3)
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{n:,} ledger entries for one tenant in October 2026 ({results['database']}, Python {results['python']})")
    print(f"seeding: {seeded:.1f} s; reading the month's entries: {read_s:.2f} s")
    print(f"{'format':8} {'cold s':>8} {'warm s':>8} {'bytes':>12}  identical re-run  (target < 10 s)")
    for fmt, r in results["formats"].items():
        print(f"{fmt:8} {r['cold_seconds']:8.2f} {r['warm_seconds']:8.2f} {r['bytes']:12,}  {r['identical_rerun']}")
    print(
        f"GET /v1/costs?group_by=team,provider aggregation: {results['costs_api_group_by_team_provider_seconds']:.2f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
