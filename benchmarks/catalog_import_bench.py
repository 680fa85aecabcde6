"""Catalog import and cheapest-pool lookup on the real GCP and Azure SkyPilot-format catalogs.

What it measures
  1. `pricing.catalog_import.import_catalog` over the GCP and Azure vms catalogs in `<data>/catalog/` (the gzip
     bootstrap / raw files and the GPU extracts, ~95,000 rows): wall seconds per file and in total, and the
     process's peak RSS (`resource.getrusage` ru_maxrss). Targets: < 5 s and < 300 MiB.
  2. `PriceBook.build` over every imported offering (the extracts repeat the big files' pools: same keys).
  3. `federation.placement.place` for `--decisions` random job shapes (accelerator lists, GPU counts, GPU memory,
     CPU needs, total and hourly ceilings, preemptible or not), timed one by one: p50 / p99 / max in ms.
     Target: p99 < 1 ms. A sample is checked against `quote().best` (the full, unpruned ranking).

With `--cli sqlite|postgresql` it measures instead what an operator sees: `overspill prices import-catalog` of
the four files run end to end in a subprocess (interpreter start, parsing, upserts into the database, price
history) on a fresh database, then a second time on the now-full database (every pool unchanged). It prints wall
seconds and the subprocess's peak RSS (`os.wait4`) for each run. PostgreSQL is a throw-away server from
`tests.pg.start_postgres()`. `--code DIR` runs the CLI of another checkout (e.g. `git archive main | tar -x -C
DIR`) for before/after figures.

The data folder is `--data`, else `$OVERSPILL_SHARED_DATA`, else `../shared/data` next to the repository. Without
it the benchmark says so and exits 0.

Run (from the repository root):
    python benchmarks/catalog_import_bench.py
    python benchmarks/catalog_import_bench.py --decisions 20000 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from federation.placement import PlacementContext, place, quote
from pricing.book import PriceBook
from pricing.catalog_import import import_catalog
from providers.model import JobSpec, Offering

REPO_ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "gcp_vms_skypilot_bootstrap_2026-04-02.csv.gz",
    "gcp_vms_skypilot_2026-04-02_gpu_and_hosts.csv",
    "azure_vms_anycloud_first_2026-04-02.csv.gz",
    "azure_vms_anycloud_2026-04-02_gpu.csv",
)
NOW = datetime(2026, 4, 2, 12, 0, tzinfo=UTC)
TARGET_IMPORT_S = 5.0
TARGET_RSS_MIB = 300.0
TARGET_P99_MS = 1.0


def find_catalog_dir(data: str | None) -> Path | None:
    folders = [data] if data else [os.environ.get("OVERSPILL_SHARED_DATA"), str(REPO_ROOT.parent / "shared/data")]
    for folder in folders:
        if folder and all((Path(folder) / "catalog" / f).is_file() for f in FILES):
            return Path(folder) / "catalog"
    return None


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def percentile_ms(ordered_ns: Sequence[int], p: float) -> float:
    idx = max(0, min(len(ordered_ns) - 1, math.ceil(p / 100 * len(ordered_ns)) - 1))  # nearest rank
    return ordered_ns[idx] / 1e6


def random_jobs(n: int, seed: int, book: PriceBook) -> list[tuple[JobSpec, PlacementContext]]:
    """`n` job shapes over the accelerators the book holds. Total ceilings are 0.5x to 30x the work priced at the
    cheapest GPU-hour of the job's accelerators (0.5x never fits: the no-pool path is measured too)."""
    rng = random.Random(seed)
    accelerators = sorted(book.by_accelerator)
    cheapest_gpu_hour = {
        acc: min(float(i.offering.usd_per_gpu_hour) for i in items) for acc, items in book.by_accelerator.items()
    }
    jobs: list[tuple[JobSpec, PlacementContext]] = []
    for i in range(n):
        accs = tuple(rng.sample(accelerators, min(len(accelerators), rng.choice((1, 1, 1, 2, 3)))))
        gpus = rng.choice((1, 1, 2, 4, 8))
        work = Decimal(rng.choice((1, 4, 10, 24, 100, 500)))
        typical = min(cheapest_gpu_hour[a] for a in accs) * float(work)
        ceiling = Decimal(repr(round(typical * rng.choice((0.5, 1.5, 3.0, 10.0, 30.0)) + 1, 2)))
        hourly = None
        if rng.random() < 0.3:
            hourly = Decimal(repr(round(min(cheapest_gpu_hour[a] for a in accs) * gpus * rng.uniform(1, 4), 4)))
        spec = JobSpec(
            tenant="bench",
            team="bench",
            project="bench",
            name=f"job-{i}",
            image="ghcr.io/acme/train:1.0",
            command=("python", "train.py"),
            accelerators=accs,
            gpu_count=gpus,
            max_total_usd=ceiling,
            min_gpu_memory_gib=rng.choice((0, 0, 16, 24, 80)),
            cpus=rng.choice((0, 0, 8, 32)),
            work_gpu_hours=work,
            max_hourly_usd=hourly,
            preemptible=rng.random() < 0.8,
        )
        jobs.append((spec, PlacementContext(now=NOW, remaining_work_hours=spec.work_hours)))
    return jobs


def run(catalog: Path, decisions: int, seed: int, say: Any) -> dict[str, Any]:
    rss_before = peak_rss_mib()
    offerings: list[Offering] = []
    files: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for name in FILES:
        t = time.perf_counter()
        result = import_catalog(catalog / name, observed_at=NOW)
        seconds = time.perf_counter() - t
        offerings.extend(result.offerings)
        files.append(
            {
                "file": name,
                "rows": result.rows,
                "skipped": result.skipped,
                "offerings": len(result.offerings),
                "seconds": round(seconds, 3),
            }
        )
        say(
            f"  {name:<48} {result.rows:>7,} rows -> {len(result.offerings):>6,} offerings "
            f"({result.skipped:,} rows skipped) in {seconds:.3f} s"
        )
    import_s = time.perf_counter() - t_all
    rss_import = peak_rss_mib()
    rows = sum(f["rows"] for f in files)
    say(f"import: {rows:,} rows, {len(offerings):,} offerings in {import_s:.2f} s; peak RSS {rss_import:.1f} MiB")

    t = time.perf_counter()
    book = PriceBook.build(offerings, NOW)
    build_ms = (time.perf_counter() - t) * 1000
    groups = {acc: len(items) for acc, items in book.by_accelerator.items()}
    say(f"PriceBook.build: {len(book):,} pools, {len(groups)} accelerators in {build_ms:.1f} ms")

    jobs = random_jobs(decisions, seed, book)
    for spec, ctx in jobs[:100]:  # warm-up
        place(spec, book, ctx)
    gc.collect()
    found: list[int] = []
    none: list[int] = []
    for spec, ctx in jobs:
        t0 = time.perf_counter_ns()
        best = place(spec, book, ctx)
        (found if best is not None else none).append(time.perf_counter_ns() - t0)
    samples = sorted(found + none)
    found.sort()
    none.sort()
    placed = len(found)
    disagree = 0
    checked = jobs[: min(200, len(jobs))]
    for spec, ctx in checked:
        fast, full = place(spec, book, ctx), quote(spec, book, ctx).best
        disagree += (fast.offering.key if fast else None) != (full.offering.key if full else None)
    p50, p99, worst = percentile_ms(samples, 50), percentile_ms(samples, 99), samples[-1] / 1e6
    say(f"place(): {decisions:,} decisions: p50 {p50:.3f} ms, p99 {p99:.3f} ms, max {worst:.3f} ms")
    for label, part in (("found a pool", found), ("no pool", none)):
        if part:
            p50_part, p99_part = percentile_ms(part, 50), percentile_ms(part, 99)
            say(f"  {label:<13} {len(part):>6,}: p50 {p50_part:.3f} ms, p99 {p99_part:.3f} ms")
    say(f"place() vs quote().best: {disagree} disagreements in {len(checked)} checked")
    rss_end = peak_rss_mib()
    say(f"peak RSS: {rss_end:.1f} MiB (before import {rss_before:.1f} MiB)")
    met = {
        "import_under_5s": import_s < TARGET_IMPORT_S,
        "rss_under_300mib": rss_import < TARGET_RSS_MIB,
        "place_p99_under_1ms": p99 < TARGET_P99_MS,
    }
    say("targets: " + ", ".join(f"{k} {'OK' if v else 'MISSED'}" for k, v in met.items()))
    return {
        "python": platform.python_version(),
        "files": files,
        "rows": rows,
        "offerings": len(offerings),
        "import_s": round(import_s, 3),
        "peak_rss_mib_before_import": round(rss_before, 1),
        "peak_rss_mib_after_import": round(rss_import, 1),
        "peak_rss_mib": round(rss_end, 1),
        "book_pools": len(book),
        "book_accelerators": groups,
        "build_ms": round(build_ms, 1),
        "place": {
            "decisions": decisions,
            "placed": placed,
            "p50_ms": round(p50, 4),
            "p99_ms": round(p99, 4),
            "max_ms": round(worst, 4),
            "found_p99_ms": round(percentile_ms(found, 99), 4) if found else None,
            "none_p99_ms": round(percentile_ms(none, 99), 4) if none else None,
            "quote_disagreements": disagree,
            "quote_checked": len(checked),
        },
        "targets_met": met,
    }


def run_cli(catalog: Path, db: str, code: Path, say: Any) -> dict[str, Any]:
    """`overspill prices import-catalog` end to end, twice (fresh database, then unchanged re-import)."""
    pg = None
    if db == "postgresql":
        sys.path.insert(0, str(REPO_ROOT))
        from tests.pg import start_postgres

        pg = start_postgres()
        url = pg.create_database()
    else:
        url = f"sqlite:///{tempfile.mkdtemp(prefix='catalog-bench-')}/broker.store.db"
    env = {**os.environ, "OVERSPILL_DATABASE_URL": url, "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-c", "from broker.cli.main import main; main()", "prices", "import-catalog", "--json"]
    cmd += [str(catalog / name) for name in FILES]
    runs: list[dict[str, Any]] = []
    try:
        for label in ("fresh database", "re-import, unchanged"):
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as errout:
                t = time.perf_counter()
                proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=out, stderr=errout)
                _, status, usage = os.wait4(proc.pid, 0)  # reaps the child: its own rusage, not the process tree's
                seconds = time.perf_counter() - t
                proc.returncode = os.waitstatus_to_exitcode(status)
                out.seek(0)
                errout.seek(0)
                stdout, stderr = out.read().decode(), errout.read().decode()
            if proc.returncode != 0:
                raise SystemExit(f"import-catalog failed ({proc.returncode}): {stderr[-2000:]}")
            rss = usage.ru_maxrss / 1024  # KiB on Linux
            summaries = json.loads(stdout.strip().splitlines()[-1])
            pools = sum(s["offerings"] for s in summaries)
            changes = sum(s["price_changes"] for s in summaries)
            say(
                f"  {label:<22} {pools:>6,} pools, {changes:>6,} price changes: {seconds:.2f} s, peak RSS {rss:.0f} MiB"
            )
            runs.append(
                {
                    "run": label,
                    "pools": pools,
                    "price_changes": changes,
                    "seconds": round(seconds, 3),
                    "peak_rss_mib": round(rss, 1),
                }
            )
    finally:
        if pg is not None:
            pg.stop()
    met = {
        "import_under_5s": all(r["seconds"] < TARGET_IMPORT_S for r in runs),
        "rss_under_300mib": all(r["peak_rss_mib"] < TARGET_RSS_MIB for r in runs),
    }
    say("targets: " + ", ".join(f"{k} {'OK' if v else 'MISSED'}" for k, v in met.items()))
    return {"python": platform.python_version(), "db": db, "code": str(code), "runs": runs, "targets_met": met}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", help="shared data folder (default $OVERSPILL_SHARED_DATA or ../shared/data)")
    parser.add_argument("--decisions", type=int, default=5_000, help="timed place() calls (default 5000)")
    parser.add_argument("--seed", type=int, default=7, help="random seed for the job shapes (default 7)")
    parser.add_argument("--json", action="store_true", help="print one JSON object of figures")
    parser.add_argument("--cli", choices=("sqlite", "postgresql"), help="time the CLI end to end on this database")
    parser.add_argument("--code", type=Path, default=REPO_ROOT, help="checkout whose CLI --cli runs (default this one)")
    args = parser.parse_args(argv)
    if args.decisions < 1:
        parser.error("--decisions must be at least 1")
    catalog = find_catalog_dir(args.data)
    if catalog is None:
        message = f"catalog files not found ({', '.join(FILES)}); pass --data or set OVERSPILL_SHARED_DATA"
        print(json.dumps({"skipped": message}) if args.json else f"catalog_import_bench: skipped: {message}")
        return
    say = (lambda *_: None) if args.json else print
    say(f"catalog_import_bench: python {platform.python_version()}, {os.cpu_count()} CPUs, catalog {catalog}")
    if args.cli:
        say(f"overspill prices import-catalog end to end on {args.cli} ({args.code}):")
        result = run_cli(catalog, args.cli, args.code.resolve(), say)
    else:
        result = run(catalog, args.decisions, args.seed, say)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
