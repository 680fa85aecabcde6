"""What the per-key rate limiter costs per request: off, local (in-process buckets) and shared (the database).

Two measurements:
  1. Load: `submit_load_bench.py`'s `POST /v1/jobs` run (fresh database, seeding tick, `uvicorn --factory
     broker.app:app_from_env --workers W`, wrk) once per store, with the limit on at a rate no client reaches
     (`OVERSPILL_RATE_LIMIT_PER_SECOND` and `_BURST` 1,000,000, so nothing is refused) and
     `OVERSPILL_RATE_LIMIT_STORE` set, or with the limit off (`0`). That benchmark turns the limit off itself; this
     script only changes the environment it gives the server (`--rate` and `--burst` set a limit that is reached
     instead: a flood of one key, mostly answered 429). `--rounds N` interleaves the stores N times (the
     machine's other load moves the figures) and prints each run and the medians: requests/s, p50/p99 latency,
     uvicorn CPU ms per request and database CPU ms per request.
  2. Takes (`--takes N`, default 5000): `SharedBuckets.take` awaited N times in this process (16 in flight, 64
     keys) against a migrated database of each backend: wall and client CPU microseconds per take (PostgreSQL:
     the throw-away server's own CPU per take too).

Run from the repository root with the project's Python (needs wrk and the PostgreSQL server binaries, as
submit_load_bench.py does):
    python benchmarks/ratelimit_bench.py --db postgresql --workers 3 --duration 8 --rounds 2
    python benchmarks/ratelimit_bench.py --db sqlite --stores off,shared --rounds 3
    python benchmarks/ratelimit_bench.py --stores local,shared --rate 20 --burst 60 --takes 0   # a flood
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import submit_load_bench as load  # noqa: E402  (beside this file)

UNREACHED_RATE = "1000000"
FIGURES = ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_request", "db_cpu_ms_per_request")


def env_for(store: str, rate: str = UNREACHED_RATE, burst: str = UNREACHED_RATE) -> Any:
    """`submit_load_bench.broker_env` with the rate limit set for `store` ("off", "local" or "shared")."""
    original = load.broker_env

    def broker_env(database_url: str, data_dir: Path) -> dict[str, str]:
        env = original(database_url, data_dir)
        if store == "off":
            env["OVERSPILL_RATE_LIMIT_PER_SECOND"] = "0"
        else:
            env["OVERSPILL_RATE_LIMIT_PER_SECOND"] = rate
            env["OVERSPILL_RATE_LIMIT_BURST"] = burst
            env["OVERSPILL_RATE_LIMIT_STORE"] = store
        return env

    return broker_env


def load_run(
    store: str, argv: Sequence[str], rate: str = UNREACHED_RATE, burst: str = UNREACHED_RATE
) -> list[dict[str, Any]]:
    """One submit_load_bench run (its own argv) with the limiter set for `store`; its results as dicts."""
    saved = load.broker_env
    load.broker_env = env_for(store, rate, burst)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            load.main([*argv, "--json"])
    finally:
        load.broker_env = saved
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    return list(report["results"])


def takes(backend: str, n: int, concurrency: int = 16) -> dict[str, float]:
    """Wall and CPU microseconds per `SharedBuckets.take` against a fresh, migrated database of `backend`, with
    `concurrency` takes in flight on one event loop (as a busy API process has)."""
    import asyncio

    from broker.api.ratelimit import SharedBuckets
    from broker.config.settings import Settings
    from broker.store import migrate
    from broker.store.db import make_engine

    server = None
    workdir = Path(tempfile.mkdtemp(prefix="ratelimit-bench-"))
    if backend == "postgresql":
        from tests.pg import start_postgres

        server = start_postgres()
        url = server.create_database()
    else:
        url = f"sqlite:///{workdir / 'rl.db'}"
    try:
        engine = make_engine(Settings(database_url=url, data_dir=workdir))
        migrate.upgrade(engine)
        engine.dispose()
        buckets = SharedBuckets.open(url, float(UNREACHED_RATE), int(UNREACHED_RATE))

        async def many(count: int) -> None:
            gate = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with gate:
                    await buckets.take(b"kbench%d" % (i % 64))

            await asyncio.gather(*(one(i) for i in range(count)))

        async def measure() -> dict[str, float]:
            await many(200)  # connect, let psycopg prepare the statement
            db_pids = load.process_tree(_postmaster(server)) if server is not None and server.data_dir else []
            db0 = load.cpu_seconds(db_pids) if db_pids else None
            wall0, cpu0 = time.perf_counter(), time.process_time()
            await many(n)
            wall1, cpu1 = time.perf_counter(), time.process_time()
            db1 = load.cpu_seconds(load.process_tree(_postmaster(server))) if db_pids else None
            await buckets.aclose()
            figures = {"wall_us_per_take": (wall1 - wall0) * 1e6 / n, "client_cpu_us_per_take": (cpu1 - cpu0) * 1e6 / n}
            if db0 is not None and db1 is not None:
                figures["db_cpu_us_per_take"] = (db1 - db0) * 1e6 / n
            return {k: round(v, 1) for k, v in figures.items()}

        return asyncio.run(measure())
    finally:
        if server is not None:
            server.stop()


def _postmaster(server: Any) -> int:
    return int((server.data_dir / "postmaster.pid").read_text().split()[0])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="off,local,shared", help="comma-separated: off, local, shared")
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved runs per store (default 1)")
    parser.add_argument("--takes", type=int, default=5000, help="SharedBuckets.take calls timed in-process (0: skip)")
    parser.add_argument(
        "--rate", default=UNREACHED_RATE, help="OVERSPILL_RATE_LIMIT_PER_SECOND (default: never reached)"
    )
    parser.add_argument("--burst", default=UNREACHED_RATE, help="OVERSPILL_RATE_LIMIT_BURST (default: never reached)")
    parser.add_argument("--json", action="store_true", help="print one JSON object of figures")
    args = parser.parse_args(argv)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or any(s not in ("off", "local", "shared") for s in stores) or args.rounds < 1:
        parser.error("--stores takes off, local and/or shared; --rounds at least 1")
    bench_argv = [
        "--db",
        args.db,
        "--workers",
        str(args.workers),
        "--duration",
        str(args.duration),
        "--connections",
        str(args.connections),
    ]
    say = (lambda *_: None) if args.json else print
    say(f"ratelimit_bench: {os.cpu_count()} CPUs, {args.db}, {args.workers} workers, stores {stores} x {args.rounds}")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in stores}
    for rnd in range(1, args.rounds + 1):
        for store in stores:
            for result in load_run(store, bench_argv, args.rate, args.burst):
                runs[store].append(result)
                if result.get("error"):
                    say(f"  round {rnd} {store:<7} FAILED: {result['error']}")
                    continue
                bad = {k: v for k, v in result["statuses"].items() if k not in ("202", "429")}
                refused = result["statuses"].get("429", 0)
                say(
                    f"  round {rnd} {store:<7} {result['requests_per_s']:8.1f} req/s  p50 {result['p50_ms']:6.1f} ms"
                    f"  p99 {result['p99_ms']:6.1f} ms  uvicorn {result['server_cpu_ms_per_request']} ms/req"
                    f"  db {result['db_cpu_ms_per_request']} ms/req  other load {result['other_cores_busy']}"
                    + (f"  429: {refused}" if refused else "")
                    + (f"  NOT 202/429: {bad}" if bad else "")
                )
    medians: dict[str, dict[str, float]] = {}
    for store, results in runs.items():
        ok = [r for r in results if not r.get("error")]
        if ok:
            medians[store] = {
                f: round(statistics.median(r[f] for r in ok if r.get(f) is not None), 3)
                for f in FIGURES
                if any(r.get(f) is not None for r in ok)
            }
    take_figures = {}
    if args.takes > 0:
        for backend in ("postgresql", "sqlite"):
            take_figures[backend] = takes(backend, args.takes)
    if args.json:
        report = {"cpus": os.cpu_count(), "db": args.db, "runs": runs, "medians": medians, "takes": take_figures}
        print(json.dumps(report))
        return 0
    print()
    print(f"{'store':<8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'uvicorn ms/req':>16}{'db ms/req':>11}   (medians)")
    for store, m in medians.items():
        db_ms = m.get("db_cpu_ms_per_request")
        print(
            f"{store:<8}{m.get('requests_per_s', 0):>9.1f}{m.get('p50_ms', 0):>9.1f}{m.get('p99_ms', 0):>9.1f}"
            f"{m.get('server_cpu_ms_per_request', 0):>16.3f}{'-' if db_ms is None else f'{db_ms:.3f}':>11}"
        )
    for backend, f in take_figures.items():
        print(f"SharedBuckets.take on {backend}: " + ", ".join(f"{k} {v}" for k, v in f.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
