"""`overspill demo`: a self-contained simulated run of the real broker.

It starts the broker on a throw-away SQLite database with the simulated market and on-prem cluster, submits a
deterministic mix of training jobs through the REST API (cost ceilings, some deadlines), then drives the real
`tick()` through simulated time in 10-minute steps until every job has ended. It reports what ran where, what
it cost, and the saving against running every job on the cheapest on-demand cloud pool.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlmodel import Session, col, select

from broker.app import create_app
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.services.jobs import spec_of
from broker.settings import DEV_API_KEY, Settings
from broker.tables import CostEntryRow, Job, Placement
from federation.placement import Candidate, PlacementContext, evaluate
from pricing.book import PriceBook
from providers.model import CENT, CapacityType, JobState

DEMO_START = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
STEP = timedelta(minutes=10)


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


def run_demo(n_jobs: int = 24, hours: float = 36.0, seed: int = 7, progress: bool = True) -> DemoResult:
    with tempfile.TemporaryDirectory(prefix="overspill-demo-") as tmp:
        clock = SimClock(DEMO_START)
        settings = Settings(
            data_dir=Path(tmp),
            database_url=f"sqlite:///{tmp}/demo.db",
            seed=seed,
            tick_interval_seconds=STEP.total_seconds(),
            bootstrap_api_key=DEV_API_KEY,
        )
        rt = build_runtime(settings, clock=clock)
        tick(rt, clock())
        book_at_start = rt.catalog.book(clock())
        with TestClient(create_app(runtime=rt)) as client:
            headers = {"Authorization": f"Bearer {DEV_API_KEY}"}
            for spec in job_mix(n_jobs, seed, clock()):
                resp = client.post("/v1/jobs", json=spec, headers=headers)
                resp.raise_for_status()
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
        return _collect(rt.engine, book_at_start, clock.now)


def _collect(engine: Any, book: PriceBook, now: datetime) -> DemoResult:
    result = DemoResult(simulated_hours=(now - DEMO_START).total_seconds() / 3600)
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
            od = _cheapest_on_demand(book, job, DEMO_START)
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
