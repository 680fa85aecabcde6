"""Replay a cluster job trace on an on-prem cluster too small for it, with a bursting policy, on a virtual clock.

Model (event-driven, times in hours from the first arrival):
- on-prem: `onprem_gpus` GPUs pooled, FIFO with EASY backfill (the head gets a reservation; later jobs start
  early only if they cannot delay it; scan depth `backfill_depth`, like Slurm's bf_max_job_test). Job runtimes
  are the trace's actual durations, used as the scheduler's walltime estimates too. Every policy shares it.
- cloud: on-demand pools of `book` (priced from a catalog), unlimited unless a policy sets a quota; a job bursts
  as one gang of `CloudOption.nodes` nodes, billed from launch (`cloud_startup_hours` before it runs) to its end.
- a job's wait is the time from arrival to its start, plus any time it queues again after returning on-prem.
Policies (`BurstPolicy`): `onprem_only`; `fixed_timeout` (SkyPilot's Slurm burst: a job not started on-prem
`timeout_hours` after submission fails over to the cheapest cloud; 2 minutes in SkyPilot); `fixed_order`
(Kueue MultiKueue: workers in a fixed order, on-prem first then the cloud worker; a job runs on the first that
admits it, the cloud admitting while its GPU quota has room); `overspill` (`federation.burst`: every
`decide_every_hours` and at each arrival, queued jobs get an on-prem wait estimate from queue pressure - the
FCFS start the queue implies - and `plan_bursts` decides; `decide_return` brings cloud jobs back when on-prem
has room and nobody waits).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from federation.burst import (
    BurstParams,
    CloudJob,
    CloudOption,
    Verdict,
    WaitingJob,
    decide_return,
    plan_bursts,
    quote_cloud,
)
from federation.simulate.traces import EPOCH, TraceJob
from pricing.book import PriceBook
from providers.model import JobSpec

ARRIVE, END_ONPREM, END_CLOUD, TIMEOUT, TICK, RETURN = range(6)


@dataclass(frozen=True, slots=True)
class BurstPolicy:
    """Which bursting rule to simulate and its knob."""

    kind: str  # onprem_only | fixed_timeout | fixed_order | overspill
    timeout_hours: float = 2 / 60
    cloud_quota_gpus: int = 0
    params: BurstParams = field(default_factory=BurstParams)
    team_budget_usd: Decimal | None = None
    decide_every_hours: float = 0.5

    @property
    def label(self) -> str:
        if self.kind == "fixed_timeout":
            return f"fixed_timeout({self.timeout_hours * 60:g}min)"
        if self.kind == "fixed_order":
            return f"fixed_order(quota {self.cloud_quota_gpus} GPUs)"
        if self.kind == "overspill":
            budget = "" if self.team_budget_usd is None else f", budget ${self.team_budget_usd:.0f}"
            return f"overspill(${self.params.value_usd_per_gpu_hour:g}/GPU-h{budget})"
        return self.kind


@dataclass(frozen=True, slots=True)
class ClusterRun:
    policy: str
    kind: str
    jobs: int
    waits_hours: tuple[float, ...]
    cloud_spend_usd: float
    bursts: int
    returns: int
    deadline_jobs: int
    deadlines_met: int
    makespan_hours: float


@dataclass(slots=True)
class _Job:
    idx: int
    arrival: float
    gpus: int
    work: float  # hours of work left
    deadline: float | None
    spec: JobSpec
    wait: float = 0.0
    queued_at: float = 0.0
    where: str = "new"  # queued | onprem | cloud | done
    cloud: CloudOption | None = None
    cloud_launch: float = 0.0
    cloud_epoch: int = 0  # bumps when a cloud run is cancelled, so its stale END event is ignored
    returning: bool = False
    finish: float | None = None


class ClusterSim:
    def __init__(
        self,
        jobs: Sequence[TraceJob],
        onprem_gpus: int,
        book: PriceBook,
        policy: BurstPolicy,
        accelerator: str = "V100",
        deadline_every: int = 0,
        deadline_factor: float = 2.0,
        backfill_depth: int = 100,
    ) -> None:
        self.policy, self.p = policy, policy.params
        self.G, self.free = onprem_gpus, onprem_gpus
        self.book, self.depth = book, backfill_depth
        self.start_at: datetime = EPOCH
        self.jobs = [self._job(i, t, accelerator, deadline_every, deadline_factor) for i, t in enumerate(jobs)]
        self.queue: list[_Job] = []
        self.running: list[tuple[float, int, int]] = []  # (end, gpus, idx) sorted, on-prem
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.spend = Decimal(0)
        self.cloud_used = 0
        self.bursts = self.returns = 0
        self.budget_left = policy.team_budget_usd
        self._quotes: dict[int, CloudOption | None] = {}

    def _job(self, i: int, t: TraceJob, acc: str, every: int, factor: float) -> _Job:
        work = t.duration_s / 3600
        arrival = t.arrival_s / 3600
        deadline = arrival + factor * work + 0.5 if every and i % every == 0 else None
        spec = JobSpec(
            tenant="sim",
            team="trace",
            project="burst",
            name=t.id,
            image="sim",
            command=(),
            accelerators=(acc,),
            gpu_count=t.gpus,
            max_total_usd=Decimal("1000000000"),
            runtime_hours=Decimal(repr(round(work, 6))),
            deadline_at=None if deadline is None else self.at(deadline),
            preemptible=False,
        )
        return _Job(i, arrival, t.gpus, work, deadline, spec)

    def at(self, hours: float) -> datetime:
        return self.start_at + timedelta(hours=hours)

    def push(self, t: float, kind: int, idx: int, tag: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, idx * 1_000_000 + tag))

    def quote(self, gpus: int) -> CloudOption | None:
        if gpus not in self._quotes:
            spec = replace(self.jobs[0].spec, gpu_count=gpus, deadline_at=None)
            self._quotes[gpus] = quote_cloud(spec, self.book, self.start_at, self.p)
        return self._quotes[gpus]

    # --- on-prem -----------------------------------------------------------------------------------------
    def start_onprem(self, j: _Job, now: float) -> None:
        self.queue.remove(j)
        self.free -= j.gpus
        j.wait += now - j.queued_at
        j.where = "onprem"
        end = now + j.work
        bisect.insort(self.running, (end, j.gpus, j.idx))
        self.push(end, END_ONPREM, j.idx)

    def schedule(self, now: float) -> None:
        while self.queue and self.queue[0].gpus <= self.free:
            self.start_onprem(self.queue[0], now)
        if not self.queue:
            return
        head = self.queue[0]
        avail, shadow = self.free, now
        for end, gpus, _ in self.running:
            avail += gpus
            if avail >= head.gpus:
                shadow = end
                break
        extra = avail - head.gpus
        for j in list(self.queue[1 : 1 + self.depth]):
            if j.gpus > self.free:
                continue
            if now + j.work <= shadow:
                self.start_onprem(j, now)
            elif j.gpus <= extra:
                extra -= j.gpus
                self.start_onprem(j, now)

    def enqueue(self, j: _Job, now: float, front: bool = False) -> None:
        j.where, j.queued_at = "queued", now
        if front:
            self.queue.insert(0, j)
        else:
            self.queue.append(j)

    def fcfs_waits(self, now: float) -> list[float]:
        """The start each queued job would get if the queue ran in order (queue pressure), as hours from now."""
        heap = [(end, gpus) for end, gpus, _ in self.running]
        avail, t, out = self.free, now, []
        for j in self.queue:
            while avail < j.gpus and heap:
                end, gpus = heapq.heappop(heap)
                t, avail = max(t, end), avail + gpus
            out.append(t - now)
            avail -= j.gpus
            heapq.heappush(heap, (t + j.work, j.gpus))
        return out

    # --- cloud -------------------------------------------------------------------------------------------
    def burst(self, j: _Job, now: float, cloud: CloudOption) -> None:
        if j.where == "queued":
            self.queue.remove(j)
            j.wait += now - j.queued_at
        startup = cloud.params.cloud_startup_hours
        j.wait += startup
        j.where, j.cloud, j.cloud_launch = "cloud", cloud, now
        self.cloud_used += cloud.nodes * cloud.offering.accelerator_count
        self.bursts += 1
        self.push(now + startup + j.work, END_CLOUD, j.idx, j.cloud_epoch)

    def stop_cloud(self, j: _Job, now: float) -> None:
        assert j.cloud is not None
        self.spend += j.cloud.hourly_usd * Decimal(repr(max(0.0, now - j.cloud_launch)))
        self.cloud_used -= j.cloud.nodes * j.cloud.offering.accelerator_count
        j.cloud_epoch += 1

    # --- policies ----------------------------------------------------------------------------------------
    def on_arrival(self, j: _Job, now: float) -> None:
        kind = self.policy.kind
        cloud = self.quote(j.gpus)
        if j.gpus > self.G and cloud is not None:
            self.burst(j, now, cloud)  # never fits on-prem: every policy sends it out
            return
        self.enqueue(j, now)
        self.schedule(now)
        if j.where != "queued" or cloud is None:
            return
        if kind == "fixed_timeout":
            self.push(now + self.policy.timeout_hours, TIMEOUT, j.idx)
        elif kind == "fixed_order":
            self.admit_cloud(now)
        elif kind == "overspill":
            self.decide(now, [j], [self.fcfs_waits(now)[-1]])

    def admit_cloud(self, now: float) -> None:
        quota = self.policy.cloud_quota_gpus
        for j in list(self.queue):
            cloud = self.quote(j.gpus)
            if cloud is not None and self.cloud_used + cloud.nodes * cloud.offering.accelerator_count <= quota:
                self.burst(j, now, cloud)

    def decide(self, now: float, jobs: list[_Job], waits: list[float]) -> None:
        waiting = [
            WaitingJob(str(j.idx), j.spec, Decimal(repr(round(j.work, 6))), w) for j, w in zip(jobs, waits, strict=True)
        ]
        budgets = None if self.budget_left is None else {"trace": self.budget_left}
        by_id = {str(j.idx): j for j in jobs}
        plans = plan_bursts(waiting, lambda w: self.quote(w.spec.gpu_count), self.at(now), budgets, self.p, self.G)
        for d in plans:
            j = by_id[d.job_id]
            if d.verdict is Verdict.BURST and d.cloud is not None and j.where == "queued":
                if self.budget_left is not None and d.cloud_cost_usd is not None:
                    self.budget_left -= d.cloud_cost_usd
                self.burst(j, now, d.cloud)

    def periodic(self, now: float) -> None:
        if self.queue:
            self.decide(now, list(self.queue), self.fcfs_waits(now))
        elif self.free > 0:
            room = self.free
            for j in self.jobs:
                if j.where != "cloud" or j.returning or j.cloud is None or j.gpus > room:
                    continue
                ran = now - j.cloud_launch - j.cloud.params.cloud_startup_hours
                job = CloudJob(str(j.idx), j.spec, j.cloud, Decimal(repr(round(j.work - max(0.0, ran), 6))), ran > 0)
                d = decide_return(job, self.at(now), 0.0, self.p)
                if d.verdict is Verdict.RETURN:
                    room -= j.gpus
                    j.returning = True
                    ckpt = j.cloud.params.checkpoint_interval_hours
                    at = now if ran <= 0 or ckpt <= 0 else now + (ckpt - ran % ckpt)
                    self.push(at, RETURN, j.idx, j.cloud_epoch)

    def do_return(self, j: _Job, now: float) -> None:
        assert j.cloud is not None
        ran = max(0.0, now - j.cloud_launch - j.cloud.params.cloud_startup_hours)
        self.stop_cloud(j, now)
        restart = self.p.restart_hours if ran > 0 else 0.0
        j.work = max(0.0, j.work - ran) + restart
        j.returning, j.cloud = False, None
        self.returns += 1
        self.enqueue(j, now, front=True)
        self.schedule(now)

    # --- loop --------------------------------------------------------------------------------------------
    def run(self) -> ClusterRun:
        for j in self.jobs:
            self.push(j.arrival, ARRIVE, j.idx)
        if self.policy.kind == "overspill":
            self.push(self.policy.decide_every_hours, TICK, 0)
        left = len(self.jobs)
        now = 0.0
        while self.events and left:
            now, _, kind, code = heapq.heappop(self.events)
            j = self.jobs[code // 1_000_000]
            tag = code % 1_000_000
            if kind == ARRIVE:
                self.on_arrival(j, now)
            elif kind == END_ONPREM:
                self.free += j.gpus
                self.running.remove((now, j.gpus, j.idx))
                j.where, j.finish, left = "done", now, left - 1
                self.schedule(now)
                if self.policy.kind == "fixed_order":
                    self.admit_cloud(now)
            elif kind == END_CLOUD and j.where == "cloud" and tag == j.cloud_epoch:
                self.stop_cloud(j, now)
                j.where, j.finish, left = "done", now, left - 1
                if self.policy.kind == "fixed_order":
                    self.admit_cloud(now)
            elif kind == TIMEOUT and j.where == "queued":
                cloud = self.quote(j.gpus)
                if cloud is not None:
                    self.burst(j, now, cloud)
            elif kind == TICK:
                self.periodic(now)
                self.push(now + self.policy.decide_every_hours, TICK, 0)
            elif kind == RETURN and j.where == "cloud" and j.returning and tag == j.cloud_epoch:
                self.do_return(j, now)
        with_deadline = [j for j in self.jobs if j.deadline is not None]
        return ClusterRun(
            policy=self.policy.label,
            kind=self.policy.kind,
            jobs=len(self.jobs),
            waits_hours=tuple(j.wait for j in self.jobs),
            cloud_spend_usd=float(self.spend),
            bursts=self.bursts,
            returns=self.returns,
            deadline_jobs=len(with_deadline),
            deadlines_met=sum(1 for j in with_deadline if j.finish is not None and j.finish <= (j.deadline or 0)),
            makespan_hours=now,
        )


def simulate_cluster(
    jobs: Sequence[TraceJob], onprem_gpus: int, book: PriceBook, policy: BurstPolicy, **kw: int | float | str
) -> ClusterRun:
    """Run one policy over `jobs` (see the module docstring)."""
    return ClusterSim(jobs, onprem_gpus, book, policy, **kw).run()  # type: ignore[arg-type]
