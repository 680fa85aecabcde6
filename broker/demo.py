"""`overspill demo`: a self-contained simulated run of the real broker.

It runs the broker with the simulated market and on-prem cluster, submits a deterministic mix of training jobs
(cost ceilings, some deadlines) through the same service the REST API calls, then drives the real `tick()`
through simulated time in 10-minute steps until every job has ended. It reports what ran where, what it cost,
and the saving against running every job on the cheapest on-demand cloud pool.

Contract:
- `run_demo(settings=...)` writes into that (persistent) database, in the bootstrap tenant, with simulated time
  ending before the present, so `overspill serve` afterwards shows the history in the console and reports. It
  refuses (`DemoRefused`) a database that already holds jobs: a second history would interleave with the first.
- `run_demo()` without settings uses a throw-away SQLite database and a fixed start (the same figures each run).
- Log records during the run go to `demo.log` in the data directory, not to the terminal (the progress line
  stays readable); the result counts the warnings.
"""

from __future__ import annotations

import logging
import random
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlmodel import Session, col, select

from broker.api.schemas import JobCreate
from broker.config.settings import Settings
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.services.jobs import spec_of, submit_job
from broker.store.tables import CostEntryRow, Job, Placement
from federation.placement import Candidate, PlacementContext, evaluate
from pricing.book import PriceBook
from providers.model import CENT, CapacityType, JobState
from providers.simulated.market import SimulatedCloud

DEMO_START = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
STEP = timedelta(minutes=10)
HOUR = timedelta(hours=1)
# the demo never touches a real cloud or cluster, whatever the environment configures
SIMULATED_ONLY: dict[str, Any] = {
    "simulated": True,
    "aws_regions": [],
    "gcp_project": "",
    "azure_regions": [],
    "aws_launch": False,
    "gcp_launch": False,
    "azure_launch": False,
    "slurm_partitions": {},
    "libcloud_provider": "",
}


class SimClock:
    """A clock the demo moves by hand."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@dataclass
class DemoResult:
    jobs: list[dict[str, Any]] = field(default_factory=list)
    simulated_hours: float = 0.0
    spent_usd: Decimal = Decimal("0")
    on_demand_usd: Decimal = Decimal("0")
    preemptions: int = 0
    database: str = ""  # where the history is kept ("" for a throw-away run)
    warnings: int = 0  # log records at WARNING or above, written to `log_path`
    log_path: str = ""

    @property
    def saving_usd(self) -> Decimal:
        return self.on_demand_usd - self.spent_usd

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "simulated_hours": self.simulated_hours,
            "spent_usd": str(self.spent_usd),
            "all_on_demand_usd": str(self.on_demand_usd),
            "saving_usd": str(self.saving_usd),
            "preemptions": self.preemptions,
            "database": self.database,
            "warnings": self.warnings,
            "log": self.log_path,
        }


def job_mix(n: int, seed: int, now: datetime) -> list[dict[str, Any]]:
    """A deterministic mix of training jobs: fine-tunes, sweeps and a few large runs, some with deadlines."""
    rng = random.Random(seed)
    kinds = [
        ("finetune", ["A100", "A100-80GB"], [1, 2], (4, 16)),
        ("sweep", ["V100", "A10G", "L4", "T4"], [1], (2, 6)),
        ("pretrain", ["A100", "A100-80GB", "H100"], [8], (64, 160)),
        ("eval", ["V100", "A100"], [1, 4], (1, 8)),
    ]
    jobs = []
    for i in range(n):
        name, accs, counts, (lo, hi) = kinds[rng.randrange(len(kinds)) if i >= 4 else i]
        gpus = rng.choice(counts)
        work = Decimal(rng.randint(lo, hi))
        spec: dict[str, Any] = {
            "name": f"{name}-{i:02d}",
            "team": rng.choice(["vision", "nlp", "speech"]),
            "project": rng.choice(["atlas", "hermes"]),
            "image": f"ghcr.io/example/{name}:1.0",
            "command": ["python", "train.py"],
            "accelerators": accs,
            "gpu_count": gpus,
            "work_gpu_hours": str(work),
            "max_total_usd": str((work * Decimal(rng.choice([3, 4, 6]))).quantize(CENT)),
            # no checkpoint_uri: the demo configures no checkpoint store, and a job's checkpoint_uri must lie under
            # one of its tenant's store prefixes
            "checkpoint_size_gb": str(rng.choice([2, 10, 40])),
        }
        if rng.random() < 0.4:
            spec["deadline"] = (now + timedelta(hours=float(work) / gpus * 2 + rng.randint(2, 8))).isoformat()
        jobs.append(spec)
    return jobs


def _cheapest_on_demand(book: PriceBook, job: Job, now: datetime) -> Decimal:
    """What the job would cost on the cheapest on-demand cloud pool that fits (the counterfactual)."""
    spec = replace(spec_of(job), max_total_usd=Decimal("1e12"), max_hourly_usd=None, deadline_at=None)
    ctx = PlacementContext(now=now, remaining_work_hours=job.work_hours)
    best: Decimal | None = None
    for group in book.for_accelerators(spec.accelerators):
        for item in group:
            if item.offering.capacity_type is not CapacityType.ON_DEMAND:
                continue
            verdict = evaluate(spec, item.offering, ctx)
            if isinstance(verdict, Candidate) and (best is None or verdict.expected_cost_usd < best):
                best = verdict.expected_cost_usd
    return best or Decimal("0")


class DemoRefused(Exception):
    """The demo will not write into this database (it already holds jobs)."""


class _Counting(logging.FileHandler):
    """Writes the run's log records to a file and counts the warnings."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, mode="w", encoding="utf-8", delay=True)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.warnings = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.warnings += 1
        super().emit(record)


@contextmanager
def _logs_to(path: Path) -> Iterator[_Counting]:
    """Route every log record to `path` (and none to the terminal) for the duration of the run."""
    root = logging.getLogger()
    handler = _Counting(path)
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.handlers, root.level = saved_handlers, saved_level
        handler.close()


def demo_start(now: datetime, hours: float) -> datetime:
    """Where a persistent demo's simulated time starts: `hours` before the hour that contains `now`."""
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours)


def run_demo(
    n_jobs: int = 24,
    hours: float = 36.0,
    seed: int = 7,
    progress: bool = True,
    *,
    settings: Settings | None = None,
    now: datetime | None = None,
) -> DemoResult:
    """Run the demo on `settings`' database (persistent), or on a throw-away one when `settings` is None."""
    if settings is None:
        with tempfile.TemporaryDirectory(prefix="overspill-demo-") as tmp:
            throwaway = Settings(data_dir=Path(tmp), database_url=f"sqlite:///{tmp}/demo.db")
            return _run(throwaway, DEMO_START, n_jobs, hours, seed, progress, keep=False)
    start = demo_start(now or datetime.now(UTC), hours)
    return _run(settings, start, n_jobs, hours, seed, progress, keep=True)


def _run(
    settings: Settings, start: datetime, n_jobs: int, hours: float, seed: int, progress: bool, *, keep: bool
) -> DemoResult:
    settings = settings.model_copy(update={**SIMULATED_ONLY, "seed": seed, "tick_interval_seconds": STEP.seconds})
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log_path = settings.data_dir / "demo.log"
    clock = SimClock(start)
    with _logs_to(log_path) as logs:
        rt = build_runtime(settings, clock=clock)
        for source in rt.offering_sources:
            if isinstance(source, SimulatedCloud):
                # its prices and capacity change only on the hour, and the demo's steps start on the hour: asking
                # every step (6 times an hour) rewrote the same rows and took a third of the run
                source.refresh_seconds = HOUR.total_seconds()  # type: ignore[attr-defined]
        with Session(rt.engine) as session:
            existing = len(session.exec(select(Job.id).limit(1)).all())
        if keep and existing:
            raise DemoRefused(
                f"the database {settings.resolved_database_url} already holds jobs; the demo writes a day of "
                "simulated history into an empty one (use --throwaway, or set OVERSPILL_DATA_DIR to a new folder)"
            )
        tick(rt, clock())
        book_at_start = rt.catalog.book(clock())
        _submit(rt, job_mix(n_jobs, seed, clock()), clock())
        _drive(rt, clock, hours, progress)
        result = _collect(rt.engine, book_at_start, start, clock.now)
        rt.engine.dispose()
    result.warnings = logs.warnings
    result.log_path = str(log_path) if keep else ""
    result.database = settings.resolved_database_url if keep else ""
    return result


def _submit(rt: Runtime, specs: list[dict[str, Any]], now: datetime) -> None:
    """Submit each job as the API would, for the bootstrap tenant (the development key's)."""
    for spec in specs:
        submit_job(
            rt.engine,
            rt.catalog,
            tenant=rt.settings.bootstrap_tenant,
            create=JobCreate(**spec),
            idempotency_key=None,
            now=now,
            checkpoints=rt.checkpoint_stores,
            settings=rt.settings,
        )


def _drive(rt: Runtime, clock: SimClock, hours: float, progress: bool) -> None:
    """Tick in `STEP`s until every job has ended (or `hours` have passed), with a progress line."""
    steps = int(hours * 3600 / STEP.total_seconds())
    with Progress(
        TextColumn("[bold]simulating[/bold] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} ticks"),
        TimeElapsedColumn(),
        disable=not progress,
    ) as bar:
        task = bar.add_task("", total=steps)
        for _ in range(steps):
            clock.now += STEP
            tick(rt, clock())
            with Session(rt.engine) as session:
                live = session.exec(
                    select(Job.id).where(col(Job.state).in_([JobState.PENDING.value, JobState.RUNNING.value]))
                ).first()
            bar.update(task, advance=1, description=clock.now.strftime("%a %H:%M"))
            if live is None:
                break


def _collect(engine: Any, book: PriceBook, start: datetime, now: datetime) -> DemoResult:
    result = DemoResult(simulated_hours=(now - start).total_seconds() / 3600)
    with Session(engine) as session:
        jobs = session.exec(select(Job).order_by(col(Job.id))).all()
        for job in jobs:
            placements = session.exec(
                select(Placement).where(Placement.job_id == job.id).order_by(col(Placement.created_at))
            ).all()
            spent = sum(
                (e.usd for e in session.exec(select(CostEntryRow).where(CostEntryRow.job_id == job.id)).all()),
                Decimal("0"),
            )
            od = _cheapest_on_demand(book, job, start)
            ran = [p for p in placements if p.started_at is not None]
            preempted = sum(1 for p in placements if p.state == "preempted")
            result.preemptions += preempted
            result.spent_usd += spent
            if job.state == JobState.SUCCEEDED.value:
                result.on_demand_usd += od
            else:
                result.on_demand_usd += spent
            result.jobs.append(
                {
                    "id": job.id,
                    "name": job.name,
                    "state": job.state,
                    "where": [f"{p.provider}/{p.zone} {p.capacity_type}" for p in ran],
                    "preemptions": preempted,
                    "spent_usd": str(spent.quantize(CENT)),
                    "ceiling_usd": str(job.max_total_usd),
                    "all_on_demand_usd": str(od),
                    "note": job.wait_reason,
                }
            )
    return result


def print_summary(result: DemoResult, console: Console) -> None:
    table = Table("job", "state", "ran on", "preempted", "spent", "ceiling", "on-demand")
    for j in result.jobs:
        table.add_row(
            j["name"],
            j["state"],
            "\n".join(j["where"]) or j["note"][:50],
            str(j["preemptions"]),
            f"${j['spent_usd']}",
            f"${j['ceiling_usd']}",
            f"${j['all_on_demand_usd']}",
        )
    console.print(table)
    spent = result.spent_usd.quantize(CENT)
    od = result.on_demand_usd.quantize(CENT)
    pct = (result.saving_usd / result.on_demand_usd * 100).quantize(Decimal("0.1")) if od else Decimal("0")
    done = sum(1 for j in result.jobs if j["state"] == "succeeded")
    over = [j["name"] for j in result.jobs if Decimal(j["spent_usd"]) > Decimal(j["ceiling_usd"])]
    ceilings = f"[red]over ceiling: {', '.join(over)}[/red]" if over else "No job exceeded its ceiling."
    console.print(
        f"[bold]{done}/{len(result.jobs)} jobs finished[/bold] in {result.simulated_hours:.1f} simulated hours, "
        f"{result.preemptions} spot preemptions handled.\n"
        f"Spent [bold]${spent}[/bold]; the same jobs on the cheapest on-demand cloud pools: ${od}; "
        f"saving [bold green]${result.saving_usd.quantize(CENT)} ({pct}%)[/bold green]. {ceilings}"
    )
