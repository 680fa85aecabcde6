"""Wire schemas of the REST API: what clients send (`*Create`) and what they get back (`*Public`).

Unknown fields are refused (a typo must not silently drop a ceiling). Money travels as decimal strings.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from broker.api.free_text import Argument, FreeText, UriText
from providers.accelerators import canonical
from providers.images import validate_image

T = TypeVar("T")
Usd = Annotated[Decimal, Field(gt=0, max_digits=18, decimal_places=6)]
Hours = Annotated[Decimal, Field(gt=0, le=100_000, max_digits=14, decimal_places=6)]
Label = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


CPU_SLOTS = "CPU"  # the accelerator name of CPU slots (providers.local.pool.CPU)


def _image_or_none(ref: str) -> str:
    return validate_image(ref) if ref else ref


def _canonical_list(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        c = canonical(n)
        if c not in out:
            out.append(c)
    return out


def aware_utc(value: datetime | None) -> datetime | None:
    """A client's instant as UTC: it must carry a time zone and fall within years 1970-9998 once in UTC (so no
    later arithmetic or comparison overflows: `9999-12-31T23:59:59-14:00` is in year 10000). `ValueError` says why.
    """
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must include a time zone, e.g. 2026-12-01T00:00:00Z")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range: must fall within years 1970-9998 in UTC") from None
    if not 1970 <= utc.year <= 9998:
        raise ValueError("out of range: must fall within years 1970-9998 in UTC")
    return utc


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
RESERVED_ENV_PREFIX = "OVERSPILL_"
MAX_ENV_ENTRIES = 128
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_BYTES = 256 * 1024  # every name and value together
MAX_SECRETS = 32


def _env_name_refusal(name: str) -> str | None:
    if not re.fullmatch(ENV_NAME, name):
        return f"name {name[:64]!r} must be a letter or '_' then up to 127 letters, digits or '_'"
    if name.upper().startswith(RESERVED_ENV_PREFIX):
        return f"name {name!r}: names starting with {RESERVED_ENV_PREFIX} are the agent's own"
    return None


def _env_name(name: str) -> str:
    refusal = _env_name_refusal(name)
    if refusal:
        raise ValueError(refusal)
    return name


def _check_env(env: dict[str, str]) -> dict[str, str]:
    if len(env) > MAX_ENV_ENTRIES:
        raise ValueError(f"at most {MAX_ENV_ENTRIES} variables (got {len(env)})")
    total = 0
    for name, value in env.items():
        refusal = _env_name_refusal(name)
        if refusal:
            raise ValueError(refusal)
        if "\x00" in value:
            raise ValueError(f"{name}: the value contains NUL, which no process environment can hold")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"{name}: the value is not valid UTF-8 (a lone surrogate)") from None
        if size > MAX_ENV_VALUE_BYTES:
            raise ValueError(f"{name}: the value is {size} bytes, over {MAX_ENV_VALUE_BYTES}")
        total += len(name) + size
    if total > MAX_ENV_BYTES:
        raise ValueError(f"names and values add up to {total} bytes, over {MAX_ENV_BYTES}")
    return env


SecretSourceName = Literal["aws-secretsmanager", "gcp-secretmanager", "azure-keyvault"]


class SecretLocation(BaseModel):
    """Where a secret is: a reference, never its value (the instance's agent reads it at run time with the
    instance's identity). The reference must lie under one of the tenant's secret prefixes, which the operator sets
    in `OVERSPILL_TENANT_SECRET_PREFIXES`."""

    model_config = ConfigDict(extra="forbid")

    source: SecretSourceName = Field(description="the secret service")
    ref: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^[A-Za-z0-9:/._@+=,-]+$",
        description="aws-secretsmanager: the secret's ARN; gcp-secretmanager: projects/<p>/secrets/<s>[/versions/<v>]; "
        "azure-keyvault: https://<vault>.vault.azure.net/secrets/<name>[/<version>]",
        examples=["arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/acme/wandb-AbCdEf"],
    )
    field: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="for a JSON secret: the key whose value to use (default: the whole secret)",
    )


class JobSecret(SecretLocation):
    """A secret the workload receives as the environment variable `env`."""

    env: Annotated[str, AfterValidator(_env_name)] = Field(
        max_length=128, description="the variable the workload reads it from", examples=["WANDB_API_KEY"]
    )


class JobCreate(BaseModel):
    """A training job to run somewhere within its cost ceiling."""

    model_config = ConfigDict(extra="forbid")

    name: FreeText = Field(min_length=1, max_length=128)
    team: Label = "default"
    project: Label = "default"
    image: Annotated[
        str,
        Field(
            max_length=300,
            examples=["ghcr.io/acme/train:1.4"],
            description="OCI image reference: [registry[:port]/]path[:tag][@algorithm:hex]; may be left out for a "
            "job that runs only where the agent runs commands on the host itself (the `process` runtime, the local "
            "pool's default): a container runtime refuses to launch it",
        ),
        AfterValidator(_image_or_none),
    ] = ""
    command: list[Annotated[Argument, Field(max_length=1000)]] = Field(default_factory=list, max_length=64)
    gpu_count: int = Field(
        ge=0, le=64, description="GPUs the job needs; 0 for a CPU job, which then gives `cpus` and `runtime_hours`"
    )
    accelerators: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=32)]],
        Field(max_length=16),
        AfterValidator(_canonical_list),
    ] = Field(
        default_factory=list,
        validate_default=True,
        examples=[["A100", "A100-80GB"]],
        description="the GPU types the job can run on (at least one); a CPU job (gpu_count 0) runs on CPU slots "
        'and may leave it out (it is then ["CPU"])',
    )
    min_gpu_memory_gib: int = Field(default=0, ge=0, le=1024)
    cpus: int = Field(default=0, ge=0, le=1024, validate_default=True)
    memory_gib: Decimal = Field(default=Decimal("0"), ge=0, le=65536, max_digits=10, decimal_places=3)
    work_gpu_hours: Hours | None = None
    runtime_hours: Hours | None = None
    deadline: Annotated[datetime | None, AfterValidator(aware_utc)] = None
    max_total_usd: Usd
    max_hourly_usd: Usd | None = None
    checkpoint_uri: UriText | None = Field(default=None, max_length=500)
    checkpoint_size_gb: Decimal = Field(default=Decimal("0"), ge=0, le=1_000_000, max_digits=12, decimal_places=3)
    allowed_providers: list[Label] = Field(default_factory=list, max_length=32)
    allowed_regions: list[Label] = Field(default_factory=list, max_length=128)
    priority: int = Field(default=0, ge=-1000, le=1000)
    preemptible: bool = True
    env: Annotated[dict[str, str], AfterValidator(_check_env)] = Field(
        default_factory=dict,
        max_length=MAX_ENV_ENTRIES,
        description=f"environment of the workload: at most {MAX_ENV_ENTRIES} variables, names {ENV_NAME} not starting "
        f"with {RESERVED_ENV_PREFIX}, values up to {MAX_ENV_VALUE_BYTES} bytes without NUL ({MAX_ENV_BYTES} bytes in "
        "all). Passed as data, never through a shell; not for secrets (they show in the job's spec): use `secrets`",
        examples=[{"WANDB_PROJECT": "atlas", "NCCL_DEBUG": "WARN"}],
    )
    secrets: list[JobSecret] = Field(
        default_factory=list,
        max_length=MAX_SECRETS,
        description="secrets the workload receives as environment variables, by reference (the broker stores and "
        "shows only the reference); each `ref` must lie under one of the tenant's secret prefixes",
        examples=[
            [
                {
                    "env": "WANDB_API_KEY",
                    "source": "aws-secretsmanager",
                    "ref": "arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/acme/wandb-AbCdEf",
                }
            ]
        ],
    )
    registry_secret: SecretLocation | None = Field(
        default=None,
        description='a secret holding {"username": ..., "password": ...} for a private registry; by default the '
        "instance's own identity logs in to ECR, Artifact Registry/GCR or ACR images, and other images are pulled "
        "anonymously",
    )
    shm_size_gb: Decimal | None = Field(
        default=None,
        gt=0,
        le=1024,
        max_digits=8,
        decimal_places=3,
        description="size of the container's /dev/shm in GB; absent: the container shares the host's IPC namespace "
        "(--ipc=host), as multi-GPU training usually needs",
    )
    max_infra_retries: int = Field(
        default=3,
        ge=0,
        le=20,
        description="attempts that failed through no fault of the job (image pull, GPU driver, a broken instance) "
        "retried elsewhere before the job fails",
    )

    @model_validator(mode="after")
    def _one_work_estimate(self) -> JobCreate:
        if (self.work_gpu_hours is None) == (self.runtime_hours is None):
            raise ValueError("give exactly one of work_gpu_hours or runtime_hours")
        return self

    @field_validator("accelerators")
    @classmethod
    def _accelerators_of_gpu_jobs(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if value:
            return value
        if info.data.get("gpu_count") == 0:
            return [CPU_SLOTS]
        raise ValueError('name at least one GPU type (e.g. ["A100"]); a CPU job gives gpu_count 0 instead')

    @field_validator("cpus")
    @classmethod
    def _cpus_of_cpu_jobs(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("gpu_count") == 0 and value < 1:
            raise ValueError("a CPU job (gpu_count 0) gives the CPUs it needs: cpus >= 1")
        return value

    @field_validator("work_gpu_hours")
    @classmethod
    def _no_gpu_hours_without_gpus(cls, value: Decimal | None, info: ValidationInfo) -> Decimal | None:
        if value is not None and info.data.get("gpu_count") == 0:
            raise ValueError("a CPU job (gpu_count 0) gives its wall time as runtime_hours")
        return value


class JobUpdate(BaseModel):
    """New limits or priority for a job that has not ended. Only the fields sent change; `null` removes
    `max_hourly_usd` or `deadline`. A paused job goes back to pending, to be placed under the new limits. A running
    placement keeps its pool: the new `max_total_usd` binds it at once (the ceiling guard), the other limits apply
    from the job's next placement."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    max_total_usd: Usd | None = None
    max_hourly_usd: Usd | None = None
    deadline: Annotated[datetime | None, AfterValidator(aware_utc)] = None
    priority: int | None = Field(default=None, ge=-1000, le=1000)

    @model_validator(mode="after")
    def _something_to_change(self) -> JobUpdate:
        if not self.model_fields_set:
            raise ValueError("give at least one of max_total_usd, max_hourly_usd, deadline, priority")
        for name in ("max_total_usd", "priority"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} cannot be removed, only changed")
        return self


class PlacementPublic(BaseModel):
    id: str
    offering_key: str
    provider: str
    region: str
    zone: str
    instance_type: str
    capacity_type: str
    hourly_usd: Decimal
    expected_cost_usd: Decimal
    cost_usd: Decimal
    state: str
    simulated: bool
    instance_id: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


class ProgressPublic(BaseModel):
    """What the job's workload last reported through its progress file (units of its whole work, any unit)."""

    done: float = Field(description="units of work done")
    total: float = Field(description="units of work in the whole job")
    fraction: float = Field(description="done / total, at most 1")
    reported_at: datetime = Field(description="when the broker received the report")


class CheckpointPublic(BaseModel):
    """The job's last durable checkpoint: stored in its checkpoint store, where its next attempt resumes from."""

    fraction: float = Field(description="the share of the job's work it holds")
    work_hours: Decimal = Field(description="the hours of the job's work it holds")
    units: float | None = Field(description="its position in the workload's units, when the workload reports it")
    placement_id: str = Field(description="the attempt that stored it")


class JobPublic(BaseModel):
    id: str
    tenant: str
    name: str
    team: str
    project: str
    state: str = Field(
        description="pending, starting (placed; its instance is launching or queued), running, paused, succeeded, "
        "failed or cancelled"
    )
    wait_reason: str
    spent_usd: Decimal
    max_total_usd: Decimal
    max_hourly_usd: Decimal | None
    work_hours: Decimal
    remaining_work_hours: Decimal = Field(
        description="work left: from the reported progress when the job reports it, else an estimate that goes "
        "down with the time it runs"
    )
    progress: ProgressPublic | None = Field(
        default=None, description="the progress the job's workload last reported (null: it reports none)"
    )
    checkpoint: CheckpointPublic | None = Field(
        default=None, description="the last durable checkpoint (null: none reported yet)"
    )
    deadline: datetime | None
    attempts: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    placement: PlacementPublic | None = Field(
        description="where it runs; for a job that ended (or is paused), where it ran last"
    )
    spec: dict[str, Any]


class AttemptPublic(BaseModel):
    """One attempt of a job: a placement, numbered from 1 in the order the attempts were made."""

    number: int = Field(description="1 for the first attempt; pass it as `attempt` to read that attempt's log")
    placement_id: str
    pool: str = Field(description="the offering it ran on")
    provider: str
    region: str
    zone: str
    instance_type: str
    capacity_type: str
    state: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    cost_usd: Decimal
    end_reason: str = Field(description="why it ended ('' while it runs)")
    has_log: bool = Field(description="it ran the instance agent, which stores its log")


class Page(BaseModel, Generic[T]):
    """Every list answer: `items`, and `next_cursor` to send back as `cursor` for the next page (null: no more).
    Lists that are not paged (bounded by `limit` or small by nature) always answer `next_cursor: null`."""

    items: list[T]
    next_cursor: str | None = None


class JobPage(Page[JobPublic]):
    pass


class AttemptPage(Page[AttemptPublic]):
    pass


class EventPublic(BaseModel):
    id: int
    at: datetime
    kind: str
    message: str
    data: dict[str, Any]


class EventPage(BaseModel):
    """A page of a job's timeline, in time order; `next_cursor` (an event id) is passed back as `after`."""

    items: list[EventPublic]
    next_cursor: str | None


class OfferingPublic(BaseModel):
    key: str
    provider: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    accelerator_count: int
    gpu_memory_gib: int
    vcpus: int
    memory_gib: Decimal
    capacity_type: str
    hourly_usd: Decimal
    usd_per_gpu_hour: Decimal
    price_source: str
    feed: str
    observed_at: datetime
    age_seconds: float
    stale: bool = Field(description="the price is older than the staleness limit, or its feed's last refresh failed")
    estimated: bool
    interruption_rate_per_hour: float
    interruption_basis: str
    egress_usd_per_gb: Decimal
    expected_wait_hours: float
    available: bool
    simulated: bool


class PoolPage(Page[OfferingPublic]):
    pass


class PricePoint(BaseModel):
    offering_key: str
    hourly_usd: Decimal
    price_source: str
    estimated: bool
    feed: str
    observed_at: datetime


class PricePage(Page[PricePoint]):
    pass


class QuoteCandidate(BaseModel):
    rank: int
    offering: OfferingPublic
    expected_cost_usd: Decimal
    expected_run_hours: float
    expected_wait_hours: float
    expected_finish_at: datetime
    checkpoint_transfer_usd: Decimal


class QuoteRejection(BaseModel):
    offering_key: str
    provider: str
    capacity_type: str
    hourly_usd: Decimal
    reason: str
    message: str


class QuoteResponse(BaseModel):
    feasible: bool
    placeable_now: bool
    wait_reason: str
    candidates: list[QuoteCandidate]
    candidates_total: int
    rejections: list[QuoteRejection]
    rejections_total: int
    other_accelerator_pools: int


class PressurePublic(BaseModel):
    source: str
    accelerator: str
    total_gpus: int
    free_gpus: int
    pending_jobs: int
    pending_gpus: int
    expected_wait_hours: float
    observed_at: datetime


class PressurePage(Page[PressurePublic]):
    pass


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(pattern="^(admin|submitter|finance)$")
    name: FreeText = Field(default="", max_length=128)


class KeyCreated(BaseModel):
    id: str
    tenant: str
    role: str
    name: str
    key: str = Field(description="shown once; store it now")
