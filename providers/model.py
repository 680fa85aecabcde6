"""Domain model shared by every layer: offerings, job specs, placements, checkpoints, cost entries, and the jobs and
nodes of an on-prem batch scheduler's queue (`BatchJob`, `BatchNode`: what `providers.slurm.json_api` parses Slurm's
JSON into and what `federation.pressure` models queue pressure from), and how a finished job ended (`Outcome`).

Pure dataclasses with no I/O. Money is `Decimal` in USD (fields end in `_usd`), times are tz-aware UTC
(fields end in `_at`), durations are hours as `Decimal` where they feed money and `float` only inside scoring.
Enums are `StrEnum` whose lowercase values are also the wire values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum

ZERO_USD = Decimal("0")
CENT = Decimal("0.01")


class CapacityType(StrEnum):
    """How a pool's capacity is bought."""

    ON_PREM = "on_prem"
    SPOT = "spot"
    ON_DEMAND = "on_demand"
    RESERVED = "reserved"


class JobState(StrEnum):
    """Life of a job in the broker.

    pending: waiting to be placed (the job's `wait_reason` says why it is not running yet);
    running: a placement is launching or running; paused: stopped because its budget cannot finish it;
    succeeded / failed / cancelled: terminal.
    """

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class PlacementState(StrEnum):
    """Life of one attempt to run a job on one offering."""

    LAUNCHING = "launching"  # recorded, launch requested (idempotent on the launch token)
    QUEUED = "queued"  # accepted by the pool but not started (on-prem queue)
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # terminated by the broker (cancel, ceiling, re-placement)

    @property
    def terminal(self) -> bool:
        return self in (
            PlacementState.PREEMPTED,
            PlacementState.SUCCEEDED,
            PlacementState.FAILED,
            PlacementState.STOPPED,
        )


class CostKind(StrEnum):
    """What a ledger entry pays for."""

    COMPUTE = "compute"
    WASTED = "wasted"  # compute whose work was lost to a preemption (already counted once as compute)
    EGRESS = "egress"
    STORAGE = "storage"  # checkpoint storage (object storage)
    DISK = "disk"  # a cloud instance's boot disk, billed beside its compute while the instance exists
    PUBLIC_IP = "public_ip"  # a cloud instance's public IPv4 address
    CORRECTION = "correction"


@dataclass(frozen=True, slots=True)
class Price:
    """An hourly price with its provenance."""

    hourly_usd: Decimal
    source: str
    observed_at: datetime
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class Offering:
    """One pool: an instance type in a zone at a capacity type, with its current price.

    `key` identifies the pool across price refreshes. `gpu_memory_gib` is per GPU. `interruption_rate_per_hour`
    is the expected number of reclaims per running hour (0 for on-demand and on-prem), `interruption_basis` says
    where that figure comes from. `expected_wait_hours` is how long a job would queue
    before starting (on-prem pressure; 0 for clouds). `available` is False when the provider knows the pool has no
    capacity right now.
    """

    provider: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    accelerator_count: int
    gpu_memory_gib: int
    vcpus: int
    memory_gib: Decimal
    capacity_type: CapacityType
    price: Price
    interruption_rate_per_hour: float = 0.0
    egress_usd_per_gb: Decimal = ZERO_USD
    expected_wait_hours: float = 0.0
    available: bool = True
    simulated: bool = False
    interruption_basis: str = ""

    @property
    def key(self) -> str:
        return offering_key(self.provider, self.region, self.zone, self.instance_type, self.capacity_type)

    @property
    def hourly_usd(self) -> Decimal:
        return self.price.hourly_usd

    @property
    def usd_per_gpu_hour(self) -> Decimal:
        """The price normalised per GPU-hour, so pools of different sizes compare on one scale."""
        return self.price.hourly_usd / self.accelerator_count if self.accelerator_count else self.price.hourly_usd


def offering_key(provider: str, region: str, zone: str, instance_type: str, capacity_type: str) -> str:
    """The stable identity of a pool, e.g. `aws/us-east-1/us-east-1a/p4d.24xlarge/spot`."""
    return f"{provider}/{region}/{zone}/{instance_type}/{capacity_type}"


@dataclass(frozen=True, slots=True)
class SecretReference:
    """A secret the job's workload receives as environment variable `env` (empty for a registry secret): where it
    is (`source`: aws-secretsmanager, gcp-secretmanager or azure-keyvault; `ref`: its ARN, resource name or URL)
    and, for a JSON secret, which `field`. Never the value: the instance's agent reads it at run time."""

    env: str
    source: str
    ref: str
    field: str | None = None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user asks for. Validated at the API edge; here it is trusted.

    Work is given either as `work_gpu_hours` (divided over `gpu_count` GPUs) or as `runtime_hours` of wall time;
    `work_hours` gives the wall-clock hours the job needs on `gpu_count` GPUs. `max_total_usd` is a promise: the
    sum of every attempt's spend never exceeds it. `max_hourly_usd` caps the price of any pool the job runs on.
    """

    tenant: str
    team: str
    project: str
    name: str
    image: str
    command: tuple[str, ...]
    accelerators: tuple[str, ...]
    gpu_count: int
    max_total_usd: Decimal
    min_gpu_memory_gib: int = 0
    cpus: int = 0
    memory_gib: Decimal = ZERO_USD
    work_gpu_hours: Decimal | None = None
    runtime_hours: Decimal | None = None
    deadline_at: datetime | None = None
    max_hourly_usd: Decimal | None = None
    checkpoint_uri: str | None = None
    checkpoint_size_gb: Decimal = ZERO_USD
    allowed_providers: tuple[str, ...] = ()
    allowed_regions: tuple[str, ...] = ()
    priority: int = 0
    preemptible: bool = True
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[SecretReference, ...] = ()
    registry_secret: SecretReference | None = None
    shm_size_gb: Decimal | None = None  # None: the container shares the host's IPC namespace
    max_infra_retries: int = 3

    @property
    def work_hours(self) -> Decimal:
        if self.runtime_hours is not None:
            return self.runtime_hours
        assert self.work_gpu_hours is not None, "a JobSpec needs work_gpu_hours or runtime_hours"
        return self.work_gpu_hours / Decimal(self.gpu_count)


@dataclass(frozen=True, slots=True)
class Placement:
    """One attempt to run a job on one offering. `launch_token` makes the launch idempotent."""

    id: str
    job_id: str
    offering_key: str
    provider: str
    region: str
    zone: str
    instance_type: str
    capacity_type: CapacityType
    hourly_usd: Decimal
    on_demand_hourly_usd: Decimal
    launch_token: str
    state: PlacementState
    created_at: datetime
    instance_id: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A saved state of a job: where it lives and how much work it holds."""

    job_id: str
    uri: str
    size_gb: Decimal
    progress_hours: Decimal
    provider: str
    region: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class CostEntry:
    """One append-only ledger line. `on_demand_usd` is what the same usage would have cost on-demand."""

    job_id: str
    placement_id: str | None
    tenant: str
    team: str
    project: str
    provider: str
    capacity_type: CapacityType
    kind: CostKind
    period_start_at: datetime
    period_end_at: datetime
    hourly_usd: Decimal
    usd: Decimal
    on_demand_usd: Decimal


@dataclass(frozen=True, slots=True)
class PressureSample:
    """On-prem queue pressure for one GPU type at one moment."""

    accelerator: str
    total_gpus: int
    free_gpus: int
    pending_jobs: int
    pending_gpus: int
    expected_wait_hours: float
    observed_at: datetime
    source: str = "simulated"


def hours_between(start: datetime, end: datetime) -> Decimal:
    """Exact hours between two instants as Decimal (microsecond resolution)."""
    delta: timedelta = end - start
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return Decimal(micros) / Decimal(3_600_000_000)


# Tag names every adapter writes on what it launches (one place, so `list` can always find ours).
BROKER_TAG = "overspill:broker"
JOB_TAG = "overspill:job"
PLACEMENT_TAG = "overspill:placement"
LAUNCH_TOKEN_TAG = "overspill:launch-token"
OFFERING_TAG = "overspill:offering"


@dataclass(frozen=True, slots=True)
class Tags:
    """The tags every instance the broker launches carries, so `list` can find ours and only ours."""

    broker_id: str
    job_id: str
    placement_id: str
    extra: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, str]:
        return {BROKER_TAG: self.broker_id, JOB_TAG: self.job_id, PLACEMENT_TAG: self.placement_id, **self.extra}


# ---- on-prem batch queues ------------------------------------------------------------------------------------

MAX_ARRAY_TASKS = 1_000_000  # Slurm's MaxArraySize is at most 4000001; refuse absurd ranges before expanding
_ARRAY_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_USABLE_NODE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
_UNUSABLE_NODE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "MAINTENANCE",
        "NOT_RESPONDING",
        "NO_RESPOND",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "REBOOT_ISSUED",
        "REBOOT_REQUESTED",
        "INVALID_REG",
        "RESERVED",
    }
)


def expand_task_ids(text: str) -> list[int]:
    """Task ids of an array task string such as `0-3`, `1,4-9:2` or `0-99%10` (the `%` limit is dropped).

    Raises `ValueError` naming the part it cannot read, or a range larger than `MAX_ARRAY_TASKS`."""
    text = text.split("%", 1)[0]
    out: list[int] = []
    for part in text.split(","):
        m = _ARRAY_RANGE.match(part.strip())
        if m is None:
            raise ValueError(f"cannot read {part!r}")
        first, last, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        if last - first > MAX_ARRAY_TASKS:
            raise ValueError(f"range {part!r} is too large")
        out.extend(range(first, last + 1, max(step, 1)))
    return out


@dataclass(frozen=True, slots=True)
class BatchJob:
    """One job (or array record, or array task) of an on-prem batch queue, as the scheduler reports it.

    Conventions: times are tz-aware UTC, None when unset; `time_limit` is minutes, None when unlimited or unset;
    `gpus` counts the job's GPUs over all its nodes per scheduler GPU type name ("a100"; "" for an untyped request),
    array tasks not multiplied in (`array_tasks` says how many tasks a pending array record stands for).
    `state` is the base state ("PENDING", "RUNNING", "COMPLETED"...) or, in Slurm's older string shape, the flag
    reported instead (e.g. "COMPLETING", "CONFIGURING", "REQUEUED"); `state_flags` the extra flags.
    `state_reason` is "" when the scheduler says "None". `start_time` of a pending job is the scheduler's estimated
    start when it has one; `end_time` of a running job its start plus its time limit. `exit_code` is the return
    code, `exit_signal` the signal that killed it (None when not signalled or unknown). `het_job_id` /
    `het_job_offset` are set for the components of a heterogeneous job.
    """

    job_id: int
    name: str
    state: str
    state_reason: str
    partition: str
    user: str
    gpus: dict[str, int]
    node_count: int
    submit_time: datetime | None
    start_time: datetime | None
    time_limit: int | None
    comment: str
    state_flags: frozenset[str] = frozenset()
    end_time: datetime | None = None
    nodes: tuple[str, ...] = ()
    admin_comment: str = ""
    priority: int | None = None
    restart_count: int = 0
    exit_code: int | None = None
    array_tasks: int = 1
    account: str = ""
    qos: str = ""
    dependency: str = ""
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_task_string: str = ""
    exit_signal: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None

    @property
    def array_task_ids(self) -> tuple[int, ...]:
        """The task ids a pending array record stands for (`array_task_string`, `%` limit dropped); () otherwise.

        Raises `ValueError` when the string is unreadable (parsers check it first)."""
        if self.array_job_id is None or self.array_task_id is not None or not self.array_task_string:
            return ()
        return tuple(expand_task_ids(self.array_task_string))

    @property
    def target(self) -> str:
        """How scheduler commands address this record: `<array job>_<task>` for one array task, else the job id."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)

    @property
    def partitions(self) -> tuple[str, ...]:
        """A job submitted to several partitions (`-p a,b`) lists them comma-separated."""
        return tuple(p for p in self.partition.split(",") if p)

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def holds_resources(self) -> bool:
        """Running, starting, suspended or still ending: its nodes are not free yet."""
        if self.state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING"):
            return True
        return "COMPLETING" in self.state_flags or "CONFIGURING" in self.state_flags


@dataclass(frozen=True, slots=True)
class BatchNode:
    """One node of an on-prem cluster. `gres` / `gres_used` count GPUs per scheduler type ("" for untyped).

    `state` is the upper-case base state ("IDLE", "MIXED", "ALLOCATED", "DOWN"...), `flags` the rest ("DRAIN",
    "NOT_RESPONDING", "CLOUD"...). `cpus` and `real_memory_mib` are 0 when not reported.
    """

    name: str
    state: str
    partitions: tuple[str, ...]
    gres: dict[str, int]
    gres_used: dict[str, int]
    flags: frozenset[str] = frozenset()
    cpus: int = 0
    real_memory_mib: int = 0

    @property
    def usable(self) -> bool:
        """Can take new jobs now: up and not draining, failing, powered down, in maintenance or reserved."""
        return self.state in _USABLE_NODE_STATES and not (self.flags & _UNUSABLE_NODE_FLAGS)

    @property
    def gpu_count(self) -> int:
        return sum(self.gres.values())

    def free_gpus(self, gpu_type: str) -> int:
        if not self.usable:
            return 0
        return max(0, self.gres.get(gpu_type, 0) - self.gres_used.get(gpu_type, 0))


class Outcome(StrEnum):
    """How a finished attempt ended, classified as the instance agent classifies its workload's exit.

    succeeded: exit 0. user_failed: the job itself failed (non-zero exit, its own signal, out of memory, its time
    limit or deadline): final for the job. infra_failed: the site failed it (node failure, boot failure): run it
    again. preempted: taken back by the scheduler: run it again. cancelled: ended by someone (not an outcome of
    the work): the broker decides.
    """

    SUCCEEDED = "succeeded"
    USER_FAILED = "user_failed"
    INFRA_FAILED = "infra_failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
