"""Many replicas against one PostgreSQL: `tick_procs` control-loop processes (tests/replica_worker.py) and
`api_procs` uvicorn API processes (`broker.app:app_from_env`), with `jobs` jobs submitted concurrently over HTTP
(httpx, `concurrency` requests in flight, spread over the API processes, each with an Idempotency-Key) to the
built-in simulated market. Then every job must be placed exactly once, with no step error (deadlock, serialisation
failure) in any replica and no lost update.

Checks (`check_exactly_once`): every 202 answer is one job row and no more; every job placed; at most one live
placement per job and no two of a job's placements overlapping in time; `job.attempts` equals the job's placement
count (a lost update of the counter would break it); launch tokens unique; one simulated instance per token and
none without a placement; each job's `spent_usd` equals the sum of its ledger entries.

Every process writes its output to a file in the run's work directory (never to a pipe nobody reads while the
run lasts: a replica blocked on a full pipe would hold its row locks and stall the others). `progress`, when
given, is called every few seconds with a one-line status (jobs submitted, placed, running).

Used by tests/test_replicas.py (4 + 2 processes, 300 jobs) and benchmarks/replicas_bench.py (5,000 jobs).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
from sqlmodel import Session, col, func, select

from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.store.tables import CostEntryRow, Job, Placement, SimInstanceRow
from tests.api_process import start_api, wait_healthy
from tests.builders import job_body

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ReplicaReport:
    jobs: int
    accepted: int
    submit_seconds: float
    all_placed_seconds: float
    placements: int
    worker_placed: list[int]
    worker_ticks: list[int]
    step_errors: list[str]
    violations: list[str] = field(default_factory=list)
    placing_tick_seconds: list[float] = field(default_factory=list)  # every replica's ticks while placing
    steady_tick_seconds: list[float] = field(default_factory=list)  # every replica's ticks once all were placed
    worker_shards: list[int] = field(default_factory=list)  # shards each tick replica held at its last tick
    live_placements_at_end: int = 0
    running_at_end: int = 0  # of those, instances started (the simulated clouds take 3 minutes to start one)
    workdir: Path | None = None

    @property
    def submits_per_second(self) -> float:
        return self.accepted / self.submit_seconds if self.submit_seconds else 0.0

    @property
    def placements_per_second(self) -> float:
        return self.placements / self.all_placed_seconds if self.all_placed_seconds else 0.0

    def table(self, tick_procs: int, api_procs: int) -> str:
        rows = [
            ("processes", f"{tick_procs} tick + {api_procs} API, one PostgreSQL"),
            ("jobs submitted concurrently / accepted (202)", f"{self.jobs} / {self.accepted}"),
            ("submission throughput", f"{self.submits_per_second:.0f} jobs/s ({self.submit_seconds:.1f} s)"),
            ("placements (first submit -> every job placed)", f"{self.placements} in {self.all_placed_seconds:.1f} s"),
            ("placement throughput", f"{self.placements_per_second:.0f} placements/s"),
            ("placements per tick replica", " / ".join(str(n) for n in self.worker_placed)),
            ("ticks per replica", " / ".join(str(n) for n in self.worker_ticks)),
            ("shards held at the last tick (of 64)", " / ".join(str(n) for n in self.worker_shards)),
            ("tick duration while placing (p50 / max)", _spread(self.placing_tick_seconds)),
            (
                f"tick duration at full load, {self.live_placements_at_end} live placements, "
                f"{self.running_at_end} running at the end (p50 / max)",
                _spread(self.steady_tick_seconds),
            ),
            ("step errors (deadlocks, serialisation failures)", str(len(self.step_errors))),
            ("exactly-once violations", str(len(self.violations))),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _spread(seconds: list[float]) -> str:
    if not seconds:
        return "-"
    return f"{statistics.median(seconds):.1f} s / {max(seconds):.1f} s over {len(seconds)} ticks"


def _env(db_url: str, workdir: Path, tick_seconds: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        {
            "OVERSPILL_DATABASE_URL": db_url,
            "OVERSPILL_DATA_DIR": str(workdir),
            "OVERSPILL_BOOTSTRAP_API_KEY": DEV_API_KEY,
            "OVERSPILL_TICK_INTERVAL_SECONDS": str(tick_seconds),
            "OVERSPILL_RATE_LIMIT_PER_SECOND": "0",  # one client key floods on purpose
            "OVERSPILL_LOG_LEVEL": "warning",  # not one access-log line per request
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


async def _submit_all(urls: list[str], jobs: int, concurrency: int, counts: _Counts) -> tuple[int, list[str]]:
    sem = asyncio.Semaphore(concurrency)
    accepted = 0
    problems: list[str] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        headers={"Authorization": f"Bearer {DEV_API_KEY}"}, timeout=120, limits=limits
    ) as client:

        async def one(i: int) -> None:
            nonlocal accepted
            body = job_body(
                name=f"r{i}",
                accelerators=["A100", "V100", "A10G", "L4", "H100"],
                gpu_count=[1, 1, 2, 4, 8][i % 5],
                work_gpu_hours=str(2 + i % 7),
                max_total_usd="500",
            )
            async with sem:
                for attempt in range(3):
                    try:
                        r = await client.post(
                            f"{urls[i % len(urls)]}/v1/jobs", json=body, headers={"Idempotency-Key": f"replica-{i}"}
                        )
                    except httpx.TransportError as exc:  # retried with the same key: never a second job
                        if attempt == 2:
                            problems.append(f"job {i}: {exc!r}")
                        continue
                    if r.status_code == 202:
                        accepted += 1
                    else:
                        problems.append(f"job {i}: {r.status_code} {r.text[:200]}")
                    counts.answered += 1
                    return

        await asyncio.gather(*(one(i) for i in range(jobs)))
    return accepted, problems


def run_replicas(
    *,
    db_url: str,
    jobs: int,
    tick_procs: int = 4,
    api_procs: int = 2,
    concurrency: int = 64,
    tick_seconds: float = 0.5,
    steady_ticks: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ReplicaReport:
    workdir = Path(tempfile.mkdtemp(prefix="replicas-"))
    env = _env(db_url, workdir, tick_seconds)
    rt = build_runtime(Settings(database_url=db_url, data_dir=workdir, bootstrap_api_key=DEV_API_KEY))
    tick(rt, rt.clock())  # migrated, key installed, prices loaded before the replicas start
    done = workdir / "submissions-done"
    apis: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[bytes]] = []
    outputs = [workdir / f"tick-{i}.out" for i in range(tick_procs)]
    stop_watch = threading.Event()
    watcher = None
    try:
        urls = []
        for i in range(api_procs):
            url, proc = start_api(env, log=workdir / f"api-{i}.log")
            urls.append(url)
            apis.append(proc)
        for url, proc in zip(urls, apis, strict=True):
            wait_healthy(url, proc)
        for i, out in enumerate(outputs):
            with open(out, "wb") as stdout, open(workdir / f"tick-{i}.err", "wb") as stderr:
                cmd = [sys.executable, "-m", "tests.replica_worker", str(done), str(steady_ticks)]
                workers.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=stdout, stderr=stderr))
        started = time.perf_counter()
        counts = _Counts()
        if progress is not None:
            watcher = threading.Thread(
                target=_watch, args=(rt.engine, jobs, counts, started, progress, stop_watch), daemon=True
            )
            watcher.start()
        accepted, problems = asyncio.run(_submit_all(urls, jobs, concurrency, counts))
        submit_seconds = time.perf_counter() - started
        done.touch()
        all_placed = _wait_placed(rt.engine, accepted, workers, timeout=3600)
        all_placed = (all_placed or time.perf_counter()) - started
        for w in workers:
            w.wait(timeout=3600)
    finally:
        stop_watch.set()
        if watcher is not None:
            watcher.join(timeout=10)
        for proc in apis:
            proc.terminate()
        for proc in apis:
            proc.wait(timeout=30)
        for w in workers:
            if w.poll() is None:
                w.kill()
    summaries: list[dict[str, Any]] = []
    errors = list(problems)
    for i, (w, out) in enumerate(zip(workers, outputs, strict=True)):
        text = out.read_text().strip()
        if w.returncode != 0 or not text:
            err = (workdir / f"tick-{i}.err").read_text()[-2000:]
            errors.append(f"tick worker {i} exited {w.returncode}: {err}")
            summaries.append({"ticks": 0, "placed": 0, "errors": []})
            continue
        summary = json.loads(text.splitlines()[-1])
        summaries.append(summary)
        errors.extend(summary["errors"])
    violations = check_exactly_once(rt.engine, accepted)
    with Session(rt.engine) as s:
        placements = len(s.exec(select(Placement.id)).all())
        live = len(s.exec(select(Placement.id).where(col(Placement.ended_at).is_(None))).all())
        running = len(s.exec(select(Placement.id).where(Placement.state == "running")).all())
    rt.engine.dispose()
    shutil.rmtree(workdir, ignore_errors=True)
    return ReplicaReport(
        jobs=jobs,
        accepted=accepted,
        submit_seconds=submit_seconds,
        all_placed_seconds=all_placed,
        placements=placements,
        worker_placed=[s["placed"] for s in summaries],
        worker_ticks=[s["ticks"] for s in summaries],
        worker_shards=[s.get("shards", 0) for s in summaries],
        step_errors=errors,
        violations=violations,
        placing_tick_seconds=[t for s in summaries for t in s.get("placing_tick_seconds", [])],
        steady_tick_seconds=[t for s in summaries for t in s.get("steady_tick_seconds", [])],
        live_placements_at_end=live,
        running_at_end=running,
        workdir=workdir,
    )


@dataclass
class _Counts:
    answered: int = 0


def _placed_jobs(engine: Any) -> int:
    with Session(engine) as s:
        return int(s.exec(select(func.count(func.distinct(Placement.job_id)))).one())


def _wait_placed(engine: Any, accepted: int, workers: list[subprocess.Popen[bytes]], timeout: float) -> float | None:
    """The moment every accepted job has a placement (polled), or None if the replicas all exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _placed_jobs(engine) >= accepted:
            return time.perf_counter()
        if all(w.poll() is not None for w in workers):
            return None
        time.sleep(0.5)
    raise TimeoutError(f"not every job was placed within {timeout:.0f} s")


def _watch(
    engine: Any,
    jobs: int,
    counts: _Counts,
    started: float,
    progress: Callable[[str], None],
    stop: threading.Event,
) -> None:
    while not stop.wait(10):
        with Session(engine) as s:
            placed = _placed_jobs(engine)
            running = len(s.exec(select(Placement.id).where(Placement.state == "running")).all())
        elapsed = time.perf_counter() - started
        progress(f"{elapsed:6.0f} s: {counts.answered}/{jobs} submitted, {placed} placed, {running} running")


def check_exactly_once(engine: Any, accepted: int) -> list[str]:
    bad: list[str] = []
    with Session(engine) as s:
        jobs = s.exec(select(Job)).all()
        placements = s.exec(select(Placement)).all()
        sims = s.exec(select(SimInstanceRow)).all()
        entries = s.exec(select(CostEntryRow)).all()
    if len(jobs) != accepted:
        bad.append(f"{accepted} submissions accepted but {len(jobs)} jobs stored")
    by_job: dict[str, list[Placement]] = defaultdict(list)
    for p in placements:
        by_job[p.job_id].append(p)
    spent: dict[str, Decimal] = defaultdict(Decimal)
    for e in entries:
        spent[e.job_id] += e.usd
    for job in jobs:
        ps = sorted(by_job[job.id], key=lambda p: (p.created_at, p.id))
        if not ps:
            bad.append(f"job {job.id} never placed ({job.state}: {job.wait_reason})")
        live = [p for p in ps if p.ended_at is None]
        if len(live) > 1:
            bad.append(f"job {job.id} has {len(live)} live placements")
        for a, b in pairwise(ps):
            if a.ended_at is None or a.ended_at > b.created_at:
                bad.append(f"job {job.id}: placements {a.id} and {b.id} overlap")
        if job.attempts != len(ps):
            bad.append(f"job {job.id}: attempts {job.attempts} but {len(ps)} placements (a lost update)")
        if spent[job.id] != job.spent_usd:
            bad.append(f"job {job.id}: spent {job.spent_usd} but ledger {spent[job.id]}")
    tokens = [p.launch_token for p in placements]
    if len(tokens) != len(set(tokens)):
        bad.append("a launch token was used twice")
    launched = [(r.provider, r.launch_token) for r in sims]
    if len(launched) != len(set(launched)):
        bad.append("two simulated instances for one launch token")
    orphans = {t for _, t in launched} - set(tokens)
    if orphans:
        bad.append(f"{len(orphans)} simulated instances without a placement")
    return bad
