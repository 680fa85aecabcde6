"""The on-prem queue-pressure model: how backed up a Slurm cluster's GPU queue is, per GPU type. Pure, no I/O.

Input: the domain model's `BatchJob`s and `BatchNode`s (`providers.model`, which the Slurm parser yields) and
`now`; nothing here knows a provider. GPU types are canonical accelerator
names (`providers.accelerators.canonical`: Slurm's "a100" -> "A100"). A request without a GPU type is charged to
the type its partition(s) hold the most GPUs of.

Pending reasons: only `Resources` and `Priority` are pressure (the job would run if there were more GPUs: bursting
helps). `Dependency`, `BeginTime`, `JobHeld*`, `QOS*Limit`, `AssocGrp*`, `ReqNodeNotAvail`, `PartitionDown`... are
policy or admin states more capacity cannot fix: they are reported apart as blocked, with per-reason counts. A
pending job whose reason is still "None" (submitted, not yet looked at by the scheduler) is neither, but it is
queued ahead of a new job, so the wait estimate counts it.

Expected wait (`QueueModel.expected_wait_hours(gpu_type, gpus, now)`) for a job of `gpus` GPUs on one node,
submitted now, assumed too long to be backfilled (offerings do not know the job's length):
1. Each usable node holding that type starts with its free GPUs (`gres` - `gres_used`). Every running job frees
   its GPUs on its nodes at its end: Slurm's `end_time` (start + time limit) or start + time limit, at least now.
2. The eligible pending jobs of that type (Resources, Priority or not yet evaluated) go first, in Slurm's order:
   those with an estimated start time by that time, then by priority and submit time. A job with Slurm's own
   estimate starts at max(now, estimate); one without starts at the earliest time, not before the job ahead of it,
   when enough nodes have its GPUs free for its whole time limit (FIFO, no backfill). Each then holds its GPUs for
   its time limit.
3. The new job starts at the earliest time, not before the last job ahead, when one node has `gpus` free from
   then on. The answer is hours from now; `math.inf` when no usable node of that type is big enough or the GPUs
   never free up (jobs without a time limit are assumed to run `unlimited_job_hours` from their start).
Beyond the first `MAX_SIMULATED_QUEUE` jobs (tasks) ahead, the rest are not placed one by one: their GPU-hours,
spread over the type's GPUs, are added to the wait (a queue of 10,000 costs what one of 500 does). Steps 1 and 2
are computed once per GPU type, partition and `now` and shared by every question to the same model.
It is conservative: with backfill, short jobs may start earlier; CPU and memory limits are ignored; a
multifactor priority may put the new job ahead of older jobs. `sbatch --test-only` asks slurmctld itself for one
concrete job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from providers.accelerators import canonical
from providers.model import BatchJob, BatchNode, PressureSample

BURSTABLE_REASONS = frozenset({"Resources", "Priority"})
UNEVALUATED_REASONS = frozenset({"", "None"})
DEFAULT_UNLIMITED_JOB_HOURS = 24.0
UNKNOWN_GPU_TYPE = "GPU"
MAX_SIMULATED_ARRAY_TASKS = 256  # a pending array record is simulated as at most this many tasks
MAX_SIMULATED_QUEUE = 500  # jobs (or tasks) ahead placed one by one; the rest are charged as GPU-hours


@dataclass(frozen=True, slots=True)
class GpuDemand:
    """One pending job's GPU request, classified.

    `burstable` is True for the pressure reasons (Resources, Priority). `gpus` counts every array task the record
    stands for; `gpus_per_node` is what each of its nodes needs.
    """

    job: BatchJob
    accelerator: str
    gpus: int
    gpus_per_node: int
    reason: str
    burstable: bool

    @property
    def eligible(self) -> bool:
        """Waiting only for the scheduler or for GPUs: it will take GPUs ahead of a job submitted now."""
        return self.burstable or self.reason in UNEVALUATED_REASONS


@dataclass(frozen=True, slots=True)
class GpuPressure:
    """Pressure on one GPU type. `pending_*` are burstable jobs only; `blocked_*` the other pending GPU jobs."""

    accelerator: str
    total_gpus: int
    free_gpus: int
    running_jobs: int
    running_gpus: int
    pending_jobs: int
    pending_gpus: int
    blocked_jobs: int
    blocked_gpus: int
    blocked_reasons: dict[str, int]
    expected_wait_hours: float

    def sample(self, observed_at: datetime, source: str = "slurm") -> PressureSample:
        return PressureSample(
            accelerator=self.accelerator,
            total_gpus=self.total_gpus,
            free_gpus=self.free_gpus,
            pending_jobs=self.pending_jobs,
            pending_gpus=self.pending_gpus,
            expected_wait_hours=self.expected_wait_hours,
            observed_at=observed_at,
            source=source,
        )


def is_burstable_reason(reason: str) -> bool:
    return reason in BURSTABLE_REASONS


@dataclass(slots=True)
class _Timeline:
    """Free GPUs of one type on one node over time: `free` now plus (time, delta) changes."""

    capacity: int
    free: int
    changes: list[tuple[datetime, int]] = field(default_factory=list)

    def free_at(self, at: datetime) -> int:
        return self.free + sum(d for t, d in self.changes if t <= at)

    def fits(self, gpus: int, start: datetime, end: datetime | None) -> bool:
        """`gpus` free at every moment of [start, end) (end None: for ever)."""
        if self.free_at(start) < gpus:
            return False
        level = self.free_at(start)
        for t, d in sorted(self.changes):
            if t <= start:
                continue
            if end is not None and t >= end:
                break
            level += d
            if level < gpus:
                return False
        return True

    def hold(self, gpus: int, start: datetime, end: datetime | None) -> None:
        self.changes.append((start, -gpus))
        if end is not None:
            self.changes.append((end, gpus))


@dataclass(slots=True)
class _Ahead:
    """The queue ahead of a new job, simulated: timelines after it started, the last start, and the hours the
    jobs beyond `MAX_SIMULATED_QUEUE` add (their GPU-hours over the type's GPUs)."""

    lines: dict[str, _Timeline]
    cursor: datetime
    backlog_hours: float


class QueueModel:
    """Jobs and nodes of one snapshot; per-type pressure and wait estimates (see the module docstring).

    `partitions`, when given, limits the model to nodes in those partitions and to jobs submitted to them.
    `accelerator_of` maps a Slurm GPU type to the canonical name.
    """

    def __init__(
        self,
        jobs: Sequence[BatchJob],
        nodes: Sequence[BatchNode],
        *,
        partitions: Iterable[str] | None = None,
        unlimited_job_hours: float = DEFAULT_UNLIMITED_JOB_HOURS,
        accelerator_of: Callable[[str], str] = canonical,
    ) -> None:
        self.partitions = frozenset(partitions) if partitions is not None else None
        self.unlimited = timedelta(hours=unlimited_job_hours)
        self.accelerator_of = accelerator_of
        self.nodes = [n for n in nodes if self._in_scope(n.partitions)]
        self.jobs = [j for j in jobs if self._in_scope(j.partitions)]
        self._demands: tuple[GpuDemand, ...] | None = None
        self._ahead: dict[tuple[str, str | None, datetime], _Ahead | None] = {}
        self._partition_types: dict[str, dict[str, int]] = {}
        for node in self.nodes:
            for part in node.partitions:
                per = self._partition_types.setdefault(part, {})
                for gpu_type, count in node.gres.items():
                    acc = self._acc(gpu_type)
                    per[acc] = per.get(acc, 0) + count

    def _in_scope(self, partitions: Iterable[str]) -> bool:
        return self.partitions is None or bool(self.partitions.intersection(partitions))

    def _acc(self, gpu_type: str) -> str:
        return self.accelerator_of(gpu_type) if gpu_type else UNKNOWN_GPU_TYPE

    def job_accelerators(self, job: BatchJob) -> dict[str, int]:
        """The job's GPUs per canonical type; an untyped request goes to its partitions' main GPU type."""
        out: dict[str, int] = {}
        for gpu_type, count in job.gpus.items():
            acc = self._acc(gpu_type) if gpu_type else self._default_type(job)
            out[acc] = out.get(acc, 0) + count
        return out

    def _default_type(self, job: BatchJob) -> str:
        totals: dict[str, int] = {}
        for part in job.partitions:
            for acc, count in self._partition_types.get(part, {}).items():
                if acc != UNKNOWN_GPU_TYPE:
                    totals[acc] = totals.get(acc, 0) + count
        if not totals:
            return UNKNOWN_GPU_TYPE
        return min(totals, key=lambda acc: (-totals[acc], acc))

    # ---- classification ---------------------------------------------------------------------------------------

    def demands(self) -> list[GpuDemand]:
        """Every pending GPU job, one entry per GPU type it asks for."""
        if self._demands is not None:
            return list(self._demands)
        out: list[GpuDemand] = []
        for job in self.jobs:
            if not job.pending:
                continue
            for acc, count in self.job_accelerators(job).items():
                out.append(
                    GpuDemand(
                        job=job,
                        accelerator=acc,
                        gpus=count * job.array_tasks,
                        gpus_per_node=max(1, math.ceil(count / max(job.node_count, 1))),
                        reason=job.state_reason,
                        burstable=is_burstable_reason(job.state_reason),
                    )
                )
        self._demands = tuple(out)
        return out

    def accelerators(self) -> list[str]:
        """GPU types present on the nodes in scope."""
        return sorted({self._acc(t) for n in self.nodes for t, c in n.gres.items() if c > 0})

    def pressure(self, now: datetime) -> list[GpuPressure]:
        demands = self.demands()
        types = sorted(set(self.accelerators()) | {d.accelerator for d in demands})
        out: list[GpuPressure] = []
        for acc in types:
            total = free = 0
            for node in self.nodes:
                for gpu_type, count in node.gres.items():
                    if self._acc(gpu_type) == acc:
                        total += count
                        free += node.free_gpus(gpu_type)
            running = [(j, self.job_accelerators(j).get(acc, 0)) for j in self.jobs if j.holds_resources]
            running = [(j, g) for j, g in running if g > 0]
            mine = [d for d in demands if d.accelerator == acc]
            pending = [d for d in mine if d.burstable]
            blocked = [d for d in mine if not d.burstable and d.reason not in UNEVALUATED_REASONS]
            reasons: dict[str, int] = {}
            for d in blocked:
                reasons[d.reason] = reasons.get(d.reason, 0) + 1
            out.append(
                GpuPressure(
                    accelerator=acc,
                    total_gpus=total,
                    free_gpus=free,
                    running_jobs=len(running),
                    running_gpus=sum(g for _, g in running),
                    pending_jobs=len(pending),
                    pending_gpus=sum(d.gpus for d in pending),
                    blocked_jobs=len(blocked),
                    blocked_gpus=sum(d.gpus for d in blocked),
                    blocked_reasons=dict(sorted(reasons.items())),
                    expected_wait_hours=self.expected_wait_hours(acc, 1, now),
                )
            )
        return out

    def samples(self, now: datetime, source: str = "slurm") -> list[PressureSample]:
        return [p.sample(now, source) for p in self.pressure(now)]

    # ---- waiting ----------------------------------------------------------------------------------------------

    def expected_wait_hours(
        self,
        gpu_type: str,
        gpus: int,
        now: datetime,
        *,
        partition: str | None = None,
        work_hours: float | None = None,
    ) -> float:
        """Hours until a `gpus`-GPU one-node job of `gpu_type` submitted `now` would start (see module docstring).

        `partition` narrows the nodes and the queue to one partition; `work_hours` lets the new job fit into gaps
        that close later (by default it is assumed to run for ever, the conservative answer).
        """
        if gpus <= 0:
            raise ValueError("gpus must be positive")
        acc = canonical(gpu_type)
        ahead = self._simulate_ahead(acc, partition, now)
        if ahead is None or max(line.capacity for line in ahead.lines.values()) < gpus:
            return math.inf
        own = timedelta(hours=work_hours) if work_hours is not None else None
        start = _earliest(ahead.lines, gpus, 1, ahead.cursor, own)
        if start is None:
            return math.inf
        return round((start - now).total_seconds() / 3600.0 + ahead.backlog_hours, 4)

    def _simulate_ahead(self, acc: str, partition: str | None, now: datetime) -> _Ahead | None:
        """Steps 1 and 2 of the module docstring for one GPU type (and partition): the nodes' timelines once the
        queue ahead has started, computed once per (type, partition, now) and shared by every question. None when
        no usable node has that type or a job ahead can never start."""
        key = (acc, partition, now)
        if key in self._ahead:
            return self._ahead[key]
        self._ahead[key] = found = self._run_queue(acc, partition, now)
        return found

    def _run_queue(self, acc: str, partition: str | None, now: datetime) -> _Ahead | None:
        nodes = [n for n in self.nodes if partition is None or partition in n.partitions]
        lines: dict[str, _Timeline] = {}
        for node in nodes:
            if not node.usable:
                continue
            cap = sum(c for t, c in node.gres.items() if self._acc(t) == acc)
            if cap <= 0:
                continue
            free = sum(node.free_gpus(t) for t in node.gres if self._acc(t) == acc)
            lines[node.name] = _Timeline(capacity=cap, free=free)
        if not lines:
            return None
        for job in self.jobs:
            if not job.holds_resources:
                continue
            count = self.job_accelerators(job).get(acc, 0)
            on = [name for name in job.nodes if name in lines]
            if count <= 0 or not on:
                continue
            end = self._running_end(job, now)
            per_node = max(1, count // max(len(job.nodes), 1))
            for name in on:
                lines[name].changes.append((end, per_node))
        for line in lines.values():  # never more free than the node has, whatever the snapshot says
            line.changes = _clamped(line, now)
        cursor = now
        simulated = 0
        backlog_gpu_hours = 0.0
        for demand in self._queue_ahead(acc, partition):
            job = demand.job
            duration = self._limit(job)
            per_node, count = demand.gpus_per_node, max(job.node_count, 1)
            tasks = min(job.array_tasks, MAX_SIMULATED_ARRAY_TASKS)
            if simulated >= MAX_SIMULATED_QUEUE:  # deep in the queue: charged as GPU-hours, not placed one by one
                backlog_gpu_hours += per_node * count * tasks * duration.total_seconds() / 3600.0
                continue
            for _ in range(tasks):
                simulated += 1
                earliest = max(now, job.start_time) if job.start_time is not None else cursor
                start = _earliest(lines, per_node, count, earliest, duration)
                if start is None:
                    return None
                chosen = [n for n in lines.values() if n.fits(per_node, start, _end(start, duration))][:count]
                for line in chosen:
                    line.hold(per_node, start, _end(start, duration))
                cursor = max(cursor, start)
        total = sum(line.capacity for line in lines.values())
        return _Ahead(lines, cursor, backlog_gpu_hours / total if total else 0.0)

    def _queue_ahead(self, acc: str, partition: str | None) -> list[GpuDemand]:
        ahead = [
            d
            for d in self.demands()
            if d.accelerator == acc and d.eligible and (partition is None or partition in d.job.partitions)
        ]

        def order(d: GpuDemand) -> tuple[int, float, int, float, int]:
            est = d.job.start_time.timestamp() if d.job.start_time is not None else math.inf
            submit = d.job.submit_time.timestamp() if d.job.submit_time is not None else math.inf
            return (0 if d.job.start_time is not None else 1, est, -(d.job.priority or 0), submit, d.job.job_id)

        return sorted(ahead, key=order)

    def _limit(self, job: BatchJob) -> timedelta:
        return timedelta(minutes=job.time_limit) if job.time_limit is not None else self.unlimited

    def _running_end(self, job: BatchJob, now: datetime) -> datetime:
        if job.end_time is not None and job.time_limit is not None:
            end = job.end_time
        elif job.start_time is not None:
            end = job.start_time + self._limit(job)
        else:
            end = now + self._limit(job)
        return max(end, now)


def _end(start: datetime, duration: timedelta | None) -> datetime | None:
    return start + duration if duration is not None else None


def _clamped(line: _Timeline, now: datetime) -> list[tuple[datetime, int]]:
    """Release events, dropping any that would take a node above its capacity (stale or unknown holders)."""
    level, out = line.free, []
    for t, d in sorted(line.changes):
        step = min(d, line.capacity - level) if d > 0 else d
        if step:
            out.append((max(t, now), step))
            level += step
    return out


def _earliest(
    lines: Mapping[str, _Timeline], per_node: int, count: int, after: datetime, duration: timedelta | None
) -> datetime | None:
    """The earliest time >= `after` when `count` nodes each have `per_node` GPUs free for `duration`."""
    candidates = sorted({after, *(t for line in lines.values() for t, _ in line.changes if t > after)})
    for at in candidates:
        end = _end(at, duration)
        if sum(1 for line in lines.values() if line.fits(per_node, at, end)) >= count:
            return at
    return None
