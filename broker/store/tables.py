"""SQLModel tables: the broker's durable state. Schema changes go through Alembic migrations.

Every row that belongs to a user carries its `tenant`. Ledger rows (`cost_entry`) are append-only; a job's
`spent_usd` is the sum of its ledger rows, updated in the same transaction as each append.

A job's and a placement's `state` is also their version (`_STATE_IS_VERSION`): every ORM write of either row is
`UPDATE ... WHERE id = ? AND state = <the state it was read in>` and checks the row count, so a transition decided
on a state that changed meanwhile (a cancel committed between a PATCH's read and its write; SQLite takes no row
lock, `FOR UPDATE` is a no-op there) writes nothing and raises `sqlalchemy.orm.exc.StaleDataError` instead of
overwriting: the caller re-reads, or leaves the row to its next look. Core statements that set `state` must carry
the same condition themselves.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Index, LargeBinary, Text, UniqueConstraint
from sqlalchemy.orm import declared_attr
from sqlmodel import Field, SQLModel

from broker.store.db import Money, UTCDateTime


def _state_is_version(cls: Any) -> dict[str, Any]:
    """Mapper options making the table's `state` column its version: the ORM's UPDATE and DELETE of a row say
    `AND state = <as read>` and raise `StaleDataError` when no row matched; the application sets the new value
    (`version_id_generator=False`), so a write that does not change the state still checks it."""
    return {"version_id_col": cls.__table__.c.state, "version_id_generator": False}


def _money(default: Decimal | None = Decimal("0"), *, nullable: bool = False) -> Any:
    return Field(default=default, sa_type=Money, nullable=nullable)


def _at(*, nullable: bool = True, index: bool = False) -> Any:
    return Field(default=None, sa_type=UTCDateTime, nullable=nullable, index=index)


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_key"

    id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(index=True, max_length=64)
    role: str = Field(max_length=16)
    name: str = Field(default="", max_length=128)
    salt: str = Field(max_length=64)
    secret_hash: str = Field(max_length=128)
    created_at: datetime = _at(nullable=False)
    revoked_at: datetime | None = _at()


class Job(SQLModel, table=True):
    __tablename__ = "job"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_job_tenant_idempotency_key"),
        Index("ix_job_state_priority", "state", "priority", "id"),
        Index("ix_job_tenant_id", "tenant", "id"),
    )

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=64)
    team: str = Field(max_length=64)
    project: str = Field(max_length=64)
    name: str = Field(max_length=128)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    state: str = Field(max_length=16)
    wait_reason: str = Field(default="", max_length=500)
    priority: int = 0
    idempotency_key: str | None = Field(default=None, max_length=128)
    request_hash: str | None = Field(default=None, max_length=64)
    request_id: str | None = Field(default=None, max_length=128)  # the submitting request's X-Request-ID
    max_total_usd: Decimal = _money()
    max_hourly_usd: Decimal | None = _money(None, nullable=True)
    spent_usd: Decimal = _money()
    work_hours: Decimal = _money()
    remaining_work_hours: Decimal = _money()
    deadline_at: datetime | None = _at()
    checkpoint_uri: str | None = Field(default=None, max_length=500)
    checkpoint_provider: str | None = Field(default=None, max_length=64)
    checkpoint_region: str | None = Field(default=None, max_length=64)
    current_placement_id: str | None = Field(default=None, max_length=40)
    attempts: int = 0
    origin: str | None = Field(default=None, unique=True, max_length=120)  # e.g. "onprem-slurm:1234" when burst
    origin_settled: bool = False  # the on-prem side (held Slurm job) has been cancelled or released
    created_at: datetime = _at(nullable=False)
    updated_at: datetime = _at(nullable=False)
    finished_at: datetime | None = _at()

    @declared_attr  # type: ignore[misc]
    def __mapper_args__(cls) -> dict[str, Any]:
        return _state_is_version(cls)


class Placement(SQLModel, table=True):
    __tablename__ = "placement"
    __table_args__ = (Index("ix_placement_state", "state"),)

    @declared_attr  # type: ignore[misc]
    def __mapper_args__(cls) -> dict[str, Any]:
        return _state_is_version(cls)

    id: str = Field(primary_key=True, max_length=40)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=40)
    tenant: str = Field(max_length=64)
    offering_key: str = Field(max_length=200)
    provider: str = Field(max_length=64)
    region: str = Field(max_length=64)
    zone: str = Field(max_length=64)
    instance_type: str = Field(max_length=64)
    capacity_type: str = Field(max_length=16)
    accelerator: str = Field(max_length=32)
    accelerator_count: int
    hourly_usd: Decimal = _money()
    on_demand_hourly_usd: Decimal = _money()
    expected_cost_usd: Decimal = _money()
    launch_token: str = Field(unique=True, max_length=64)
    launch_attempts: int = 0  # calls to the provider's launch with this token (ambiguous failures retried)
    instance_id: str | None = Field(default=None, max_length=128)
    state: str = Field(max_length=16)
    simulated: bool = False
    work_hours_at_start: Decimal = _money()
    created_at: datetime = _at(nullable=False)
    started_at: datetime | None = _at()
    ended_at: datetime | None = _at()
    accrued_until: datetime | None = _at()
    price_segment_started_at: datetime | None = _at()
    price_segment_hourly_usd: Decimal | None = _money(None, nullable=True)
    cost_usd: Decimal = _money()
    exit_code: int | None = None  # reported by the instance itself through the completion callback
    saved_work_hours: Decimal | None = _money(None, nullable=True)  # work its last checkpoint kept, once ended
    detail: str = Field(default="", max_length=500)
    # the instance agent's attempt prefix (`<store>tenants/T/jobs/<job>/attempts/<placement>/`: spec, logs), set once
    # its spec is written; None for providers that run no agent (simulated clouds, Slurm)
    attempt_uri: str | None = Field(default=None, max_length=1024)
    # the start-up script the instance boots with, rendered once so a retried launch sends the same bytes (EC2
    # ClientToken, Azure's PUT refuse a changed UserData/customData); holds no secret (tests/test_attempt_secrets.py)
    user_data: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # from the instance agent's reports (broker.services.agent_reports): the outcome of its `final` report (the
    # sync step turns it into the verdict), the work its last durable checkpoint holds (hours of this placement's
    # work), when it last reported, and the deadline of an interruption notice it is working to
    outcome: str | None = Field(default=None, max_length=16)
    checkpointed_work_hours: Decimal | None = _money(None, nullable=True)
    last_report_at: datetime | None = _at()
    notice_deadline_at: datetime | None = _at()


class PlacementReport(SQLModel, table=True):
    """One agent report the broker took, by (placement, seq): a report arriving again, by the mailbox or the
    callback, finds its row and is not applied twice. `data` is the report as parsed (signature dropped)."""

    __tablename__ = "placement_report"

    placement_id: str = Field(primary_key=True, max_length=40)
    seq: int = Field(primary_key=True, sa_type=BigInteger)
    kind: str = Field(max_length=16)
    via: str = Field(max_length=16)
    received_at: datetime = _at(nullable=False)
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class JobEvent(SQLModel, table=True):
    __tablename__ = "job_event"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=40)
    tenant: str = Field(max_length=64)
    at: datetime = _at(nullable=False)
    kind: str = Field(max_length=32)
    message: str = Field(default="", max_length=1000)
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class CostEntryRow(SQLModel, table=True):
    """One append-only ledger line. `kind` is compute, wasted, egress, storage or correction.

    A `wasted` line moves part of a preempted placement's compute (the work since its last checkpoint, redone
    elsewhere) out of `compute`: it is written as a pair, compute -X and wasted +X, so sums stay exact. A
    `correction` names the line it corrects in `corrects_id`. `quantity`/`unit` are what was consumed (hours,
    GB, GB-months); `resource_id` is the provider's instance id, the key for reconciling against a bill.
    """

    __tablename__ = "cost_entry"
    __table_args__ = (Index("ix_cost_entry_tenant_period", "tenant", "period_start_at"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=40)
    placement_id: str | None = Field(default=None, max_length=40, index=True)
    tenant: str = Field(index=True, max_length=64)
    team: str = Field(max_length=64)
    project: str = Field(max_length=64)
    provider: str = Field(max_length=64)
    capacity_type: str = Field(max_length=16)
    kind: str = Field(max_length=16)
    period_start_at: datetime = _at(nullable=False)
    period_end_at: datetime = _at(nullable=False)
    hourly_usd: Decimal = _money()
    usd: Decimal = _money()
    on_demand_usd: Decimal = _money()
    created_at: datetime = _at(nullable=False)
    region: str = Field(default="", max_length=64)
    zone: str = Field(default="", max_length=64)
    instance_type: str = Field(default="", max_length=64)
    resource_id: str = Field(default="", max_length=128, index=True)
    quantity: Decimal = _money()
    unit: str = Field(default="Hours", max_length=16)
    corrects_id: int | None = Field(default=None)
    note: str = Field(default="", max_length=500)


class OfferingRow(SQLModel, table=True):
    """Current price of every pool (the PriceBook's durable form)."""

    __tablename__ = "offering"

    key: str = Field(primary_key=True, max_length=200)
    provider: str = Field(index=True, max_length=64)
    region: str = Field(max_length=64)
    zone: str = Field(max_length=64)
    instance_type: str = Field(max_length=64)
    accelerator: str = Field(max_length=32)
    accelerator_count: int
    gpu_memory_gib: int
    vcpus: int
    memory_gib: Decimal = _money()
    capacity_type: str = Field(max_length=16)
    hourly_usd: Decimal = _money()
    price_source: str = Field(max_length=64)
    observed_at: datetime = _at(nullable=False)
    estimated: bool = False
    interruption_rate_per_hour: float = 0.0
    egress_usd_per_gb: Decimal = _money()
    expected_wait_hours: float = 0.0
    available: bool = True
    simulated: bool = False
    interruption_basis: str = Field(default="", max_length=200)
    feed: str = Field(default="", index=True, max_length=200)
    refreshed_at: datetime = _at(nullable=False)


class FeedStatus(SQLModel, table=True):
    """Health of each price or pressure feed: last success, last error."""

    __tablename__ = "feed_status"

    name: str = Field(primary_key=True, max_length=64)
    last_success_at: datetime | None = _at()
    last_error_at: datetime | None = _at()
    last_error: str = Field(default="", max_length=1000)
    items: int = 0


class PressureRow(SQLModel, table=True):
    __tablename__ = "pressure"

    source: str = Field(primary_key=True, max_length=64)
    accelerator: str = Field(primary_key=True, max_length=32)
    total_gpus: int
    free_gpus: int
    pending_jobs: int
    pending_gpus: int
    expected_wait_hours: float
    observed_at: datetime = _at(nullable=False)


class SimInstanceRow(SQLModel, table=True):
    """State of the built-in simulated clouds (stands in for an external cloud's own records)."""

    __tablename__ = "sim_instance"
    __table_args__ = (Index("ix_sim_instance_provider_instance", "provider", "instance_id"),)

    provider: str = Field(primary_key=True, max_length=64)
    launch_token: str = Field(primary_key=True, max_length=64)
    instance_id: str = Field(max_length=64)
    offering_key: str = Field(max_length=200)
    launched_at: datetime = _at(nullable=False)
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    terminated_at: datetime | None = _at()


class BlockEntry(SQLModel, table=True):
    """A scope (provider, provider/region or provider/region/zone) placement avoids until `until_at`."""

    __tablename__ = "blocklist"

    scope_key: str = Field(primary_key=True, max_length=200)
    until_at: datetime = _at(nullable=False)
    reason: str = Field(default="", max_length=500)


class PriceChange(SQLModel, table=True):
    """Price history: one row per change of a pool's price (not per sample)."""

    __tablename__ = "price_change"
    __table_args__ = (Index("ix_price_change_key_at", "offering_key", "observed_at"),)

    id: int | None = Field(default=None, primary_key=True)
    offering_key: str = Field(max_length=200)
    feed: str = Field(max_length=200)
    hourly_usd: Decimal = _money()
    price_source: str = Field(max_length=64)
    estimated: bool = False
    observed_at: datetime = _at(nullable=False)


class TickShard(SQLModel, table=True):
    """One of the fixed shards live placements are partitioned into (`broker.store.shards`): which tick replica holds
    its lease (`owner`) and until when. A shard whose lease ran out (`until_at` past) or has no owner is free."""

    __tablename__ = "tick_shard"

    shard: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    owner: str | None = Field(default=None, max_length=80)
    until_at: datetime | None = _at()


class TickReplica(SQLModel, table=True):
    """A tick replica's heartbeat (`seen_at`, written at the start of each of its ticks): the live replicas are
    the ones seen within a lease, and each takes about its fair share of the shards."""

    __tablename__ = "tick_replica"

    replica_id: str = Field(primary_key=True, max_length=80)
    seen_at: datetime = _at(nullable=False)


class TickItemFailure(SQLModel, table=True):
    """One item (a placement, a mailbox entry, a feed, a report run...) that raised in a tick step
    (`broker.services.bulkhead`): how many ticks in a row it failed, the last error, and since when it is quarantined
    (skipped by its step until an operator deletes the row). The row goes once the
    item succeeds again."""

    __tablename__ = "tick_item_failure"

    step: str = Field(primary_key=True, max_length=64)
    item: str = Field(primary_key=True, max_length=400)
    failures: int = 0
    last_error: str = Field(default="", max_length=1000)
    first_at: datetime = _at(nullable=False)
    last_at: datetime = _at(nullable=False)
    quarantined_at: datetime | None = _at()


class CheckpointCopyRow(SQLModel, table=True):
    """Resume state of checkpoint copies (`providers.storage.CopyState` as JSON, keyed by copy id) and the lease
    that keeps two replicas from staging one placement's checkpoint at once (`lease_owner`, `lease_until_at`)."""

    __tablename__ = "checkpoint_copy"

    copy_id: str = Field(primary_key=True, max_length=80)
    state: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    lease_owner: str | None = Field(default=None, max_length=80)
    lease_until_at: datetime | None = _at()
    updated_at: datetime = _at(nullable=False)


class BudgetRow(SQLModel, table=True):
    """A spending limit for one team or project of a tenant, per calendar month (UTC) or a custom period."""

    __tablename__ = "budget"

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(index=True, max_length=64)
    scope: str = Field(max_length=16)  # team | project
    name: str = Field(max_length=64)  # the team or project it limits
    period: str = Field(max_length=16)  # monthly | custom
    starts_at: datetime | None = _at()
    ends_at: datetime | None = _at()
    amount_usd: Decimal = _money()
    hard: bool = False
    thresholds: list[int] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    webhook_url: str = Field(default="", max_length=500)
    email_to: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = _at(nullable=False)
    updated_at: datetime = _at(nullable=False)


class BudgetAlertRow(SQLModel, table=True):
    """A threshold that fired, once per budget period: the unique key is what stops two replicas double-sending."""

    __tablename__ = "budget_alert"
    __table_args__ = (UniqueConstraint("budget_id", "period_start_at", "threshold", name="uq_budget_alert_once"),)

    id: int | None = Field(default=None, primary_key=True)
    budget_id: str = Field(foreign_key="budget.id", index=True, max_length=40)
    tenant: str = Field(max_length=64)
    period_start_at: datetime = _at(nullable=False)
    threshold: int
    spent_usd: Decimal = _money()
    amount_usd: Decimal = _money()
    fired_at: datetime = _at(nullable=False)
    delivered_at: datetime | None = _at()
    attempts: int = 0
    last_error: str = Field(default="", max_length=1000)


class ReportScheduleRow(SQLModel, table=True):
    """A cost report that runs on a cron expression in a time zone and is delivered somewhere."""

    __tablename__ = "report_schedule"

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(index=True, max_length=64)
    name: str = Field(max_length=128)
    cron: str = Field(max_length=120)
    timezone: str = Field(max_length=64)
    format: str = Field(max_length=16)  # csv | focus | html | pdf
    period: str = Field(max_length=32)  # previous_month | previous_week | previous_day | month_to_date
    destination: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    enabled: bool = True
    next_run_at: datetime = _at(nullable=False, index=True)
    last_run_at: datetime | None = _at()
    created_at: datetime = _at(nullable=False)
    updated_at: datetime = _at(nullable=False)


class ReportRunRow(SQLModel, table=True):
    """One produced report: its bytes (or where they were written), their sha256 and where they were sent."""

    __tablename__ = "report_run"
    __table_args__ = (
        UniqueConstraint("schedule_id", "scheduled_for", name="uq_report_run_schedule_slot"),
        Index("ix_report_run_tenant_created", "tenant", "created_at"),
        Index("ix_report_run_delivery_state", "delivery_state"),
    )

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=64)
    schedule_id: str | None = Field(default=None, max_length=40)
    scheduled_for: datetime | None = _at()
    format: str = Field(max_length=16)
    period_start_at: datetime = _at(nullable=False)
    period_end_at: datetime = _at(nullable=False)
    state: str = Field(max_length=16)  # running | delivering | succeeded | failed
    filename: str = Field(default="", max_length=200)
    content_type: str = Field(default="", max_length=100)
    content: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    sha256: str = Field(default="", max_length=64)
    size_bytes: int = 0
    entries: int = 0
    delivered_to: str = Field(default="", max_length=500)
    error: str = Field(default="", max_length=1000)
    created_at: datetime = _at(nullable=False)
    finished_at: datetime | None = _at()
    # where it goes, delivered by the control loop (never inside a request): "" none | pending | delivered | failed
    destination: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    delivery_state: str = Field(default="", max_length=16)
    delivery_attempts: int = 0
    # the ledger's latest accrued time in the period (what the file's "data as of" says); None without entries
    data_as_of: datetime | None = _at()


class BillImportRow(SQLModel, table=True):
    """One imported provider billing export (FOCUS columns, CSV or Parquet)."""

    __tablename__ = "bill_import"

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(index=True, max_length=64)
    provider: str = Field(max_length=64)  # the broker's provider name the bill is reconciled against
    filename: str = Field(max_length=200)
    rows: int = 0
    period_start_at: datetime = _at(nullable=False)
    period_end_at: datetime = _at(nullable=False)
    billed_usd: Decimal = _money()
    created_at: datetime = _at(nullable=False)


class BillLineRow(SQLModel, table=True):
    """A billing export's lines, summed per resource and charge day (what reconciliation needs)."""

    __tablename__ = "bill_line"

    id: int | None = Field(default=None, primary_key=True)
    import_id: str = Field(foreign_key="bill_import.id", index=True, max_length=40)
    resource_id: str = Field(max_length=200)
    charge_day: datetime = _at(nullable=False)
    billed_usd: Decimal = _money()
    effective_usd: Decimal = _money()
    list_usd: Decimal = _money()
    rows: int = 0


class AvailabilityChange(SQLModel, table=True):
    """Availability history of spot pools: one row when a feed first lists a pool and whenever it starts or stops
    offering it (not per sample). With the broker's own reclaims it gives each pool's up and down runs."""

    __tablename__ = "availability_change"
    __table_args__ = (Index("ix_availability_change_key_at", "offering_key", "observed_at"),)

    id: int | None = Field(default=None, primary_key=True)
    offering_key: str = Field(max_length=200)
    up: bool
    observed_at: datetime = _at(nullable=False)


class AuditEntry(SQLModel, table=True):
    """One state-changing API request: who (key, tenant, role), what (method, path, status), when, from where.

    Never the body, the key or any header but the request id. Append-only."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_tenant_id", "tenant", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = _at(nullable=False)
    tenant: str = Field(default="", max_length=64)
    key_id: str = Field(default="", max_length=32)
    role: str = Field(default="", max_length=16)
    method: str = Field(max_length=8)
    path: str = Field(max_length=500)
    route: str = Field(default="", max_length=200)
    status: int
    client: str = Field(default="", max_length=100)
    request_id: str = Field(default="", max_length=128)
    detail: str = Field(default="", max_length=500)  # what a route chose to record (e.g. a correction's amount)


class AuditRefused(SQLModel, table=True):
    """State-changing requests refused before any key or callback token was verified (401, 400, 413...), counted
    per minute, client address, method, route template ("" when no route matched) and status. Never attributed to
    a tenant: an unverified request cannot write to a tenant's `audit_log`."""

    __tablename__ = "audit_refused"

    minute: datetime = Field(sa_type=UTCDateTime, primary_key=True)
    client: str = Field(primary_key=True, max_length=100)
    method: str = Field(primary_key=True, max_length=8)
    route: str = Field(primary_key=True, max_length=200)
    status: int = Field(primary_key=True)
    count: int = 1
    last_at: datetime = _at(nullable=False)


class RateLimitBucket(SQLModel, table=True):
    """One API key's or client address's token bucket, shared by every API process (broker/api/ratelimit.py).

    `key` is b"k" + the SHA-256 of a presented API key (never the key), b"a" + a client address (requests with no
    key) or b"u" + a client address (requests with a key not verified yet); `tat` is when
    the bucket is full again (epoch seconds, database clock); `wait` is what the last take was told to wait (0: it
    got a token). A row whose `tat` has passed means a full bucket, so such rows are deleted at will. UNLOGGED on
    PostgreSQL."""

    __tablename__ = "rate_limit_bucket"

    key: bytes = Field(sa_column=Column(LargeBinary, primary_key=True))
    tat: float
    wait: float = 0.0
