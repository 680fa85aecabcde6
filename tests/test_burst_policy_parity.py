"""One burst policy: the live loop (broker.loop.onprem_burst) decides what `overspill simulate` scores.

On the real cluster (tests/slurm_cluster.py) every GPU is taken by two 30-minute jobs and four opted-in jobs of
different sizes and lengths queue behind them. The live tick decides with the economic rule (the default); the
cluster simulator (`federation.simulate.cluster.ClusterSim.decide`) is then handed the same inputs: the same
jobs in the same order, the waits the live loop's queue model gave each, the same price book, burst parameters and
on-prem GPU count. Both must burst the same jobs, and the case is chosen so that some burst and some stay
(short jobs whose wait costs more than the cloud premium burst; long ones stay).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from broker.loop.onprem_burst import _params
from broker.loop.tick import tick
from broker.store.tables import Job
from federation.burst import BurstParams
from federation.simulate.cluster import BurstPolicy, ClusterSim
from federation.simulate.traces import TraceJob
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud
from tests.test_e2e_slurm_burst import _runtime
from tests.test_provider_slurm import fill_gpus, job, sbatch, wait_until

JOBS = (  # (GPUs, hours of work): the short ones' wait costs more than the cloud premium, the long ones' less
    (1, "0.25"),
    (2, "4"),
    (4, "0.5"),
    (1, "6"),
)


@pytest.fixture
def slurm(cluster: Any) -> Iterator[Any]:
    cluster.cancel_all()
    yield cluster
    cluster.cancel_all()


class RecordingModel:
    """The queue model, recording every wait the live loop asks of it (its inputs to the burst decision)."""

    def __init__(self, inner: Any, log: list[tuple[int, float]]) -> None:
        self.inner, self.log = inner, log

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def expected_wait_hours(self, gpu_type: str, gpus: int, now: datetime, **kw: Any) -> float:
        wait = self.inner.expected_wait_hours(gpu_type, gpus, now, **kw)
        if "partition" not in kw:  # the burst step's question (the offerings feed asks per partition)
            self.log.append((gpus, wait))
        return wait


@pytest.mark.integration
def test_live_loop_and_simulator_burst_the_same_jobs(slurm: Any, tmp_path: Path) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("2.10"), "z2": Decimal("2.50")}
    rt = _runtime(slurm, tmp_path, cloud, burst_value_usd_per_gpu_hour=2.0)
    assert rt.settings.burst_policy == "economic"
    provider = rt.providers["onprem-slurm"]
    asked: list[tuple[int, float]] = []
    factory = provider.queue_model  # type: ignore[attr-defined]
    provider.queue_model = lambda *a, **kw: RecordingModel(factory(*a, **kw), asked)  # type: ignore[attr-defined]

    fill_gpus(slurm, minutes=30)
    ids = []
    for gpus, hours in JOBS:
        comment = {"image": "ghcr.io/example/train:1", "runtime_hours": hours}
        minutes = int(Decimal(hours) * 60)
        ids.append(
            sbatch(
                slurm,
                f"--gres=gpu:a100:{gpus}",
                f"--time={minutes}",
                f"--comment=overspill-burst {json.dumps(comment)}",
                "--wrap=sleep 1",
            )
        )
    for i in ids:
        wait_until(lambda i=i: job(provider, i).state_reason in ("Resources", "Priority"), "the jobs to pend")

    tick(rt, clock())
    with Session(rt.engine) as s:
        origins = s.exec(select(Job.origin).where(col(Job.origin).startswith("onprem-slurm:"))).all()
    live = {int(str(o).split(":", 1)[1]) for o in origins}

    assert [g for g, _ in asked] == [g for g, _ in JOBS]  # one wait per candidate, in queue order
    waits = [w for _, w in asked]
    q = next(q for q in provider.queued_jobs() if q.job.job_id in ids)  # type: ignore[attr-defined]
    params = _params(rt, provider, q)
    simulated = simulate_decisions(rt, clock(), params, waits, provider.partition_gpus("gpu"))  # type: ignore[attr-defined]
    sim = {ids[i] for i in simulated}

    assert live == sim
    assert 0 < len(live) < len(JOBS), f"the case should mix bursts and stays; burst {sorted(live)} of {ids}"


def simulate_decisions(rt: Any, now: datetime, params: BurstParams, waits: Sequence[float], gpus: int) -> set[int]:
    """Which of JOBS the cluster simulator's decision step bursts, given the live loop's inputs."""
    trace = [TraceJob(str(i), 0.0, g, float(Decimal(h) * 3600)) for i, (g, h) in enumerate(JOBS)]
    sim = ClusterSim(trace, gpus, rt.catalog.book(now), BurstPolicy("overspill", params=params), accelerator="A100")
    sim.start_at = now
    ceiling = Decimal(rt.settings.slurm_accounts["acme"].max_job_usd)
    for j in sim.jobs:  # the live job's spec: its account's ceiling, and (a Slurm burst) preemptible
        j.spec = replace(j.spec, max_total_usd=ceiling, preemptible=True)
        sim.enqueue(j, 0.0)
    sim.decide(0.0, list(sim.queue), list(waits))
    return {j.idx for j in sim.jobs if j.where == "cloud"}
