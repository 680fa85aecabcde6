"""Wire schemas of the REST API: what clients send (`*Create`) and what they get back (`*Public`).

Unknown fields are refused (a typo must not silently drop a ceiling). Money travels as decimal strings.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from providers.accelerators import canonical
from providers.images import validate_image

Usd = Annotated[Decimal, Field(gt=0, max_digits=18, decimal_places=6)]
Hours = Annotated[Decimal, Field(gt=0, le=100_000, max_digits=14, decimal_places=6)]
Label = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


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


class JobCreate(BaseModel):
    """A training job to run somewhere within its cost ceiling."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    team: Label = "default"
    project: Label = "default"
    image: Annotated[
        str,
        Field(
            min_length=1,
            max_length=300,
            examples=["ghcr.io/acme/train:1.4"],
            description="OCI image reference: [registry[:port]/]path[:tag][@algorithm:hex]",
        ),
        AfterValidator(validate_image),
    ]
    command: list[Annotated[str, Field(max_length=1000)]] = Field(default_factory=list, max_length=64)
    accelerators: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=32)]],
        Field(min_length=1, max_length=16),
        AfterValidator(_canonical_list),
    ] = Field(examples=[["A100", "A100-80GB"]])
    gpu_count: int = Field(ge=1, le=64)
    min_gpu_memory_gib: int = Field(default=0, ge=0, le=1024)
    cpus: int = Field(default=0, ge=0, le=1024)
    memory_gib: Decimal = Field(default=Decimal("0"), ge=0, le=65536, max_digits=10, decimal_places=3)
    work_gpu_hours: Hours | None = None
    runtime_hours: Hours | None = None
    deadline: Annotated[datetime | None, AfterValidator(aware_utc)] = None
    max_total_usd: Usd
    max_hourly_usd: Usd | None = None
    checkpoint_uri: str | None = Field(default=None, max_length=500)
    checkpoint_size_gb: Decimal = Field(default=Decimal("0"), ge=0, le=1_000_000, max_digits=12, decimal_places=3)
    allowed_providers: list[Label] = Field(default_factory=list, max_length=32)
    allowed_regions: list[Label] = Field(default_factory=list, max_length=128)
    priority: int = Field(default=0, ge=-1000, le=1000)
    preemptible: bool = True

    @model_validator(mode="after")
    def _one_work_estimate(self) -> JobCreate:
        if (self.work_gpu_hours is None) == (self.runtime_hours is None):
            raise ValueError("give exactly one of work_gpu_hours or runtime_hours")
        return self


class JobUpdate(BaseModel):
    """New limits or priority for a job that has not ended. Only the fields sent change; `null` removes
    `max_hourly_usd` or `deadline`. A paused job goes back to pending, to be placed under the new limits. A running
    placement keeps its pool: the new `max_total_usd` binds it at once (the ceiling guard), the other limits apply
    from the job's next placement."""

    model_config = ConfigDict(extra="forbid")

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


class JobPublic(BaseModel):
    id: str
    tenant: str
    name: str
    team: str
    project: str
    state: str
    wait_reason: str
    spent_usd: Decimal
    max_total_usd: Decimal
    max_hourly_usd: Decimal | None
    work_hours: Decimal
    remaining_work_hours: Decimal
    deadline: datetime | None
    attempts: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    placement: PlacementPublic | None
    spec: dict[str, Any]


class JobPage(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None


class EventPublic(BaseModel):
    id: int
    at: datetime
    kind: str
    message: str
    data: dict[str, Any]


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


class PricePoint(BaseModel):
    offering_key: str
    hourly_usd: Decimal
    price_source: str
    estimated: bool
    feed: str
    observed_at: datetime


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


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(pattern="^(admin|submitter|finance)$")
    name: str = Field(default="", max_length=128)


class KeyCreated(BaseModel):
    id: str
    tenant: str
    role: str
    name: str
    key: str = Field(description="shown once; store it now")
