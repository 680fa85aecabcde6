"""Exactly once, on the real cluster with the broker as a non-root Slurm operator: a burst job runs either in Slurm
or in the cloud, never both, however Slurm's scheduler races the broker's hold; array tasks burst one at a time and
each is settled alone; after a cloud success the held job ends so that its `afterok` dependents run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import Job
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, admin_api
from tests.test_e2e_slurm_burst import _runtime
from tests.test_metrics_burst import decisions
from tests.test_provider_slurm import job, sbatch, wait_until

RACE_ROUNDS = 6  # two per injection point
REST_RACE_ROUNDS = 3  # one per injection point through slurmrestd (the race is the broker's, not the transport's)


@pytest.fixture
def slurm(cluster: Any) -> Iterator[Any]:
    cluster.cancel_all()
    yield cluster
    cluster.cancel_all()


def _cloud(clock: MovableClock) -> ScriptedCloud:
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    return cloud


def _opt_in(slurm: Any, marker: Path, *extra: str, seconds: int = 3) -> int:
    spec = '{"max_total_usd": "40", "image": "ghcr.io/example/train:1", "work_gpu_hours": "2"}'
    return sbatch(
        slurm,
        "--gres=gpu:a100:1",
        "--time=60",
        f"--comment=overspill-burst {spec}",
        *extra,
        f"--wrap=echo ran $SLURM_ARRAY_TASK_ID >> {marker}; sleep {seconds}",
    )


def _filler(slurm: Any, gpus: int) -> int:
    return sbatch(slurm, "--job-name=fill", f"--gres=gpu:a100:{gpus}", "--time=60", "--wrap=sleep 600")


def _running(slurm: Any, ids: list[int]) -> Callable[[], bool]:
    return lambda: (
        all(str(j["job_state"]) == "RUNNING" for j in slurm.jobs() if int(str(j["job_id"])) in ids)
        and len([j for j in slurm.jobs() if int(str(j["job_id"])) in ids]) == len(ids)
    )


def _burst(rt: Runtime, target: str) -> Job | None:
    with Session(rt.engine) as s:
        return s.exec(select(Job).where(Job.origin == f"onprem-slurm:{target}")).first()


def _lines(marker: Path) -> list[str]:
    return marker.read_text().splitlines() if marker.exists() else []


class RacingTransport:
    """The broker's Slurm transport (tools or slurmrestd), which at one point of the hold lets Slurm start the job
    first: it cancels a filler and waits until Slurm has started the job, then makes the broker's request ("mark":
    before the Comment mark is written, i.e. right after the broker's read; "hold": between the mark and the hold;
    "after": right after the hold landed, when Slurm can no longer start it). Everything else passes through."""

    def __init__(self, inner: Any, slurm: Any, target: int, filler: int, point: str) -> None:
        self.inner, self.slurm, self.target, self.filler, self.point = inner, slurm, target, filler, point
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _let_slurm_start_it(self) -> None:
        self.fired = True
        self.slurm.run(["scancel", str(self.filler)], check=True)
        if self.point != "after":
            wait_until(lambda: self._state() != "PENDING", "Slurm to start the job first", timeout=20)

    def _state(self) -> str:
        return next(str(j["job_state"]) for j in self.slurm.jobs() if int(str(j["job_id"])) == self.target)

    def update_job(self, target: str, **fields: Any) -> None:
        if not self.fired and self.point == "mark" and target == str(self.target) and fields.get("comment"):
            self._let_slurm_start_it()
        self.inner.update_job(target, **fields)

    def hold(self, target: str) -> None:
        racing = not self.fired and self.point in ("hold", "after") and target == str(self.target)
        if racing and self.point == "hold":
            self._let_slurm_start_it()
        self.inner.hold(target)
        if racing and self.point == "after":
            self._let_slurm_start_it()


@pytest.mark.integration
def test_the_hold_race_never_runs_a_job_twice(slurm: Any, tmp_path: Path, slurm_transport: str) -> None:
    """Many rounds; in each, Slurm starts the job at one point of the broker's hold (or just after it landed)."""
    shared = slurm.root / "shared"
    outcomes: list[tuple[str, str]] = []
    rounds = RACE_ROUNDS if slurm_transport == "cli" else REST_RACE_ROUNDS
    for rnd in range(rounds):
        point = ("mark", "hold", "after")[rnd % 3]
        clock = MovableClock(datetime.now(UTC))
        cloud = _cloud(clock)
        (tmp_path / f"r{rnd}").mkdir()
        rt = _runtime(slurm, tmp_path / f"r{rnd}", cloud, transport=slurm_transport)
        fillers = [_filler(slurm, 4), _filler(slurm, 4)]
        wait_until(_running(slurm, fillers), "fillers to run")
        marker = shared / f"race-{uuid.uuid4().hex[:8]}"
        target = _opt_in(slurm, marker)
        provider = rt.providers["onprem-slurm"]
        wait_until(lambda t=target, p=provider: job(p, t).state_reason in ("Resources", "Priority"), "the job to pend")
        racing = RacingTransport(provider.transport, slurm, target, fillers[0], point)  # type: ignore[attr-defined]
        provider.transport = racing  # type: ignore[attr-defined]
        tick(rt, clock())
        assert racing.fired, point
        burst = _burst(rt, str(target))
        if point == "after":  # the hold won: it runs in the cloud only, and Slurm never starts it
            assert burst is not None
            time.sleep(2)  # a GPU is free: Slurm would start it now if it could
            assert job(provider, target).state_reason == "JobHeldAdmin" and _lines(marker) == []
            tick(rt, clock())  # placed
            clock.advance(hours=3)
            tick(rt, clock())
            tick(rt, clock())
            assert _burst(rt, str(target)).state == "succeeded"  # type: ignore[union-attr]
            wait_until(lambda t=target, p=provider: job(p, t).state == "CANCELLED", "the held job to end")
            assert _lines(marker) == [] and len(cloud.requests) == 1
            outcomes.append((point, "cloud"))
        else:  # Slurm won: nothing recorded, the hold undone, the job runs on-prem once
            assert burst is None and cloud.requests == []
            wait_until(lambda t=target, p=provider: job(p, t).state == "COMPLETED", "the on-prem run to finish", 20)
            after = job(provider, target)
            assert after.priority != 0 and "overspill-hold" not in after.comment and _lines(marker) == ["ran"]
            assert decisions(rt)[("drop", "started_on_prem")] == 1
            outcomes.append((point, "on-prem"))
        slurm.cancel_all()
    assert len(outcomes) == rounds


@pytest.mark.integration
def test_an_array_bursts_only_its_pending_tasks_each_settled_alone(
    slurm: Any, tmp_path: Path, slurm_transport: str
) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = _cloud(clock)
    rt = _runtime(slurm, tmp_path, cloud, transport=slurm_transport)
    provider = rt.providers["onprem-slurm"]
    fillers = [_filler(slurm, 4), _filler(slurm, 2)]  # 2 GPUs stay free: tasks 0 and 1 run, 2 and 3 wait
    wait_until(_running(slurm, fillers), "fillers to run")
    marker = slurm.root / "shared" / f"array-{uuid.uuid4().hex[:8]}"
    array = _opt_in(slurm, marker, "--array=0-3", seconds=30)

    def split() -> bool:
        tasks = {j.array_task_id: j for j in provider.squeue() if j.array_job_id == array}  # type: ignore[attr-defined]
        pending = [j for j in provider.squeue() if j.array_job_id == array and j.pending]  # type: ignore[attr-defined]
        running = [t for t, j in tasks.items() if t is not None and j.state == "RUNNING"]
        return sorted(running) == [0, 1] and all(j.state_reason in ("Resources", "Priority") for j in pending)

    wait_until(split, "tasks 0 and 1 to run, 2 and 3 to wait")
    tick(rt, clock())
    bursts = {t: _burst(rt, f"{array}_{t}") for t in range(4)}
    assert bursts[0] is None and bursts[1] is None  # running tasks untouched
    assert bursts[2] is not None and bursts[3] is not None and bursts[2].id != bursts[3].id
    tasks = {j.array_task_id: j for j in provider.squeue() if j.array_job_id == array}  # type: ignore[attr-defined]
    assert tasks[2].state_reason == tasks[3].state_reason == "JobHeldAdmin"
    assert tasks[0].state == tasks[1].state == "RUNNING" and "overspill-hold" not in tasks[0].comment
    assert all(b.spec["gpu_count"] == 1 for b in (bursts[2], bursts[3]))  # one task's GPUs, not the array's

    tick(rt, clock())  # both placed in the cloud
    assert admin_api(rt).post(f"/v1/jobs/{bursts[2].id}/cancel").status_code in (200, 202)  # task 2 gives up
    clock.advance(hours=3)
    tick(rt, clock())
    tick(rt, clock())
    assert _burst(rt, f"{array}_3").state == "succeeded"  # type: ignore[union-attr]
    assert _burst(rt, f"{array}_2").origin_settled  # type: ignore[union-attr]

    def settled() -> bool:
        tasks = {j.array_task_id: j for j in provider.squeue() if j.array_job_id == array}  # type: ignore[attr-defined]
        return tasks[3].state == "CANCELLED" and tasks[2].state_reason != "JobHeldAdmin"

    wait_until(settled, "task 3 ended and task 2 released")
    tasks = {j.array_task_id: j for j in provider.squeue() if j.array_job_id == array}  # type: ignore[attr-defined]
    assert tasks[0].state in ("RUNNING", "COMPLETED") and tasks[1].state in ("RUNNING", "COMPLETED")
    slurm.run(["scancel", *map(str, fillers)], check=True)
    wait_until(
        lambda: sorted(_lines(marker)) == ["ran 0", "ran 1", "ran 2"], "tasks 0-2 to run on-prem once", timeout=60
    )


@pytest.mark.integration
def test_after_a_cloud_success_afterok_dependents_run_and_afternotok_ones_never(
    slurm: Any, tmp_path: Path, slurm_transport: str
) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = _cloud(clock)
    rt = _runtime(slurm, tmp_path, cloud, transport=slurm_transport)
    provider = rt.providers["onprem-slurm"]
    fillers = [_filler(slurm, 4), _filler(slurm, 4)]
    wait_until(_running(slurm, fillers), "fillers to run")
    shared = slurm.root / "shared"
    marker = shared / f"dep-{uuid.uuid4().hex[:8]}"
    target = _opt_in(slurm, marker)
    ok = sbatch(slurm, f"--dependency=afterok:{target}", f"--wrap=echo afterok >> {marker}")
    notok = sbatch(slurm, f"--dependency=afternotok:{target}", f"--wrap=echo afternotok >> {marker}")
    wait_until(lambda: job(provider, target).state_reason in ("Resources", "Priority"), "the job to pend")
    tick(rt, clock())
    assert _burst(rt, str(target)) is not None
    tick(rt, clock())
    clock.advance(hours=3)
    tick(rt, clock())
    tick(rt, clock())
    assert _burst(rt, str(target)).state == "succeeded"  # type: ignore[union-attr]
    wait_until(lambda: job(provider, ok).state == "COMPLETED", "the afterok dependent to run", timeout=20)
    assert job(provider, target).state == "CANCELLED"
    late = sbatch(slurm, f"--dependency=afterok:{target}", f"--wrap=echo late >> {marker}")
    tick(rt, clock())  # a dependent submitted after the end is rewritten too
    wait_until(lambda: job(provider, late).state == "COMPLETED", "the late dependent to run", timeout=20)
    assert job(provider, notok).pending and job(provider, notok).state_reason == "DependencyNeverSatisfied"
    assert sorted(_lines(marker)) == ["afterok", "late"]  # the burst job itself never ran on-prem
