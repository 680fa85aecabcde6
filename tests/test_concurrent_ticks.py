"""Two tick processes against one PostgreSQL never place a job twice (asserted on the database)."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest
from sqlmodel import Session, select

from broker.api.schemas import JobCreate
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.services.jobs import submit_job
from broker.store.tables import Job, Placement, SimInstanceRow
from tests.builders import job_body
from tests.conftest import MovableClock

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_two_tick_processes_place_each_job_exactly_once(
    postgres: object, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    url = postgres.create_database()  # type: ignore[attr-defined]
    rt = make_runtime(url)
    tick(rt, clock())
    n_jobs = 120
    for i in range(n_jobs):
        body = job_body(
            name=f"j{i}",
            accelerators=["A100", "V100", "A10G", "L4", "H100"],
            gpu_count=[1, 1, 2, 4, 8][i % 5],
            work_gpu_hours=str(2 + i % 7),
            max_total_usd="500",
        )
        submit_job(rt.engine, rt.catalog, tenant="demo", create=JobCreate(**body), idempotency_key=None, now=clock())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.tick_worker", url, "6", clock().isoformat(), "10"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"tick worker failed: {out}\n{err}"
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement)).all()
        jobs = s.exec(select(Job)).all()
        sims = s.exec(select(SimInstanceRow)).all()
    by_job: dict[str, list[Placement]] = defaultdict(list)
    for p in placements:
        by_job[p.job_id].append(p)
    assert len(by_job) == n_jobs, "every job was placed"
    for job_id, ps in by_job.items():
        ps.sort(key=lambda p: p.created_at)
        live = [p for p in ps if p.ended_at is None]
        assert len(live) <= 1, f"{job_id} has {len(live)} live placements"
        for a, b in pairwise(ps):
            assert a.ended_at is not None and a.ended_at <= b.created_at, f"{job_id}: overlapping placements"
    tokens = [p.launch_token for p in placements]
    assert len(tokens) == len(set(tokens))
    launched = {(r.provider, r.launch_token) for r in sims}
    assert len(launched) == len(sims), "one instance per launch token"
    assert {t for _, t in launched} <= set(tokens), "no instance without a placement"
    assert all(j.state in ("running", "succeeded", "pending") for j in jobs)
