"""Wire schemas of the finance API (costs, budgets, report schedules and runs). Unknown fields are refused;
money travels as decimal strings; times are ISO 8601 with a zone."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from broker.api.free_text import FreeText
from broker.api.schemas import Label, Page, aware_utc
from broker.finance.notify import check_emails
from broker.finance.outbound import check_url_shape
from broker.finance.reports.deliver import validate_destination

Usd = Annotated[Decimal, Field(gt=0, max_digits=18, decimal_places=6)]


def _aware(value: datetime | None) -> datetime | None:
    # a zone, and years 1970-9998 once in UTC (a database cannot store year 10000: found by fuzzing)
    return aware_utc(value)


Aware = Annotated[datetime, AfterValidator(_aware)]


def _thresholds(values: list[int]) -> list[int]:
    return sorted(set(values))


def _emails(values: list[str]) -> list[str]:
    return check_emails(values, "email_to")


def _url(value: str) -> str:
    return check_url_shape(value, "webhook_url") if value else value


Thresholds = Annotated[list[Annotated[int, Field(ge=1, le=1000)]], Field(max_length=20), AfterValidator(_thresholds)]
Emails = Annotated[list[str], Field(max_length=20), AfterValidator(_emails)]
Url = Annotated[str, Field(max_length=500), AfterValidator(_url)]


class BudgetCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scope: Literal["team", "project"]
    name: Label
    period: Literal["monthly", "custom"] = "monthly"
    starts_at: Aware | None = None
    ends_at: Aware | None = None
    amount_usd: Usd
    hard: bool = False
    thresholds: Thresholds = Field(default_factory=lambda: [50, 80, 100])
    webhook_url: Url = ""
    email_to: Emails = Field(default_factory=list)

    @model_validator(mode="after")
    def _custom_needs_dates(self) -> BudgetCreate:
        check_period(self.period, self.starts_at, self.ends_at)
        return self


def check_period(period: str, starts_at: datetime | None, ends_at: datetime | None) -> None:
    if period == "custom":
        if starts_at is None or ends_at is None:
            raise ValueError("starts_at and ends_at are required for a custom period")
        if ends_at <= starts_at:
            raise ValueError("ends_at must be after starts_at")


class BudgetUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Label | None = None
    period: Literal["monthly", "custom"] | None = None
    starts_at: Aware | None = None
    ends_at: Aware | None = None
    amount_usd: Usd | None = None
    hard: bool | None = None
    thresholds: Thresholds | None = None
    webhook_url: Url | None = None
    email_to: Emails | None = None


class BudgetPublic(BaseModel):
    id: str
    scope: str
    name: str
    period: str
    starts_at: datetime | None
    ends_at: datetime | None
    amount_usd: str
    hard: bool
    thresholds: list[int]
    webhook_url: str
    email_to: list[str]
    spent_usd: str
    forecast_usd: str
    fired: list[int]
    period_start: datetime
    period_end: datetime


class ScheduleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: FreeText = Field(min_length=1, max_length=128)
    cron: FreeText = Field(min_length=9, max_length=120, examples=["0 6 1 * *"])
    timezone: FreeText = Field(default="UTC", max_length=64, examples=["Europe/Paris"])
    format: Literal["csv", "focus", "html", "pdf"] = "csv"
    period: Literal["previous_month", "previous_week", "previous_day", "month_to_date"] = "previous_month"
    destination: dict[str, Any] = Field(default_factory=dict)
    enabled: bool = True

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: dict[str, Any]) -> dict[str, Any]:
        return validate_destination(value)


class ScheduleUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: FreeText | None = Field(default=None, min_length=1, max_length=128)
    cron: FreeText | None = Field(default=None, min_length=9, max_length=120)
    timezone: FreeText | None = Field(default=None, max_length=64)
    format: Literal["csv", "focus", "html", "pdf"] | None = None
    period: Literal["previous_month", "previous_week", "previous_day", "month_to_date"] | None = None
    destination: dict[str, Any] | None = None
    enabled: bool | None = None

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else validate_destination(value)


class SchedulePublic(BaseModel):
    id: str
    name: str
    cron: str
    timezone: str
    format: str
    period: str
    destination: dict[str, Any]
    enabled: bool
    next_run_at: datetime
    last_run_at: datetime | None


class RunCreate(BaseModel):
    """Run a report now: a named period (`2026-10`, `2026-10-05`) or `from`/`to`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    period: FreeText | None = Field(default=None, max_length=10, examples=["2026-10"])
    from_: Aware | None = Field(default=None, alias="from")
    to: Aware | None = None
    format: Literal["csv", "focus", "html", "pdf"] = "csv"
    destination: dict[str, Any] = Field(default_factory=dict)

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: dict[str, Any]) -> dict[str, Any]:
        return validate_destination(value)


class RunPublic(BaseModel):
    id: str
    schedule_id: str | None
    format: str
    period_start: datetime
    period_end: datetime
    period_title: str = Field(
        description='the period for people: "November 2026", "1-25 November 2026 (month to date)" for a month not '
        "over when the run was made"
    )
    data_as_of: datetime | None = Field(
        description="the ledger's latest accrued time in the period, as the report says (null: no entries)"
    )
    state: str
    filename: str
    content_type: str
    sha256: str
    size_bytes: int
    entries: int
    delivered_to: str
    error: str
    created_at: datetime
    finished_at: datetime | None
    download_url: str
    delivery_state: str = Field(
        description="'' (no destination), pending (the control loop delivers it), delivered or failed"
    )
    delivery_attempts: int


class CorrectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entry_id: int = Field(ge=1, le=2**63 - 1)  # a database integer (found by fuzzing)
    usd: Annotated[Decimal, Field(max_digits=18, decimal_places=10)]
    note: FreeText = Field(default="", max_length=500)


# answers of /v1/costs (the services build dicts; these type them for the OpenAPI document and generated clients)


class MoneyColumns(BaseModel):
    """Exact amounts (decimal strings, no exponent): cost, cost of compute that was wasted (preempted work
    redone), the on-demand equivalent and the savings against it."""

    cost_usd: str
    wasted_usd: str
    on_demand_usd: str
    savings_usd: str


class CostLine(MoneyColumns):
    """One group (only the `group_by` keys are present) or the total (no key)."""

    team: str | None = None
    project: str | None = None
    job: str | None = None
    placement: str | None = Field(default=None, description="a placement id: one attempt of a job")
    provider: str | None = None
    region: str | None = None
    capacity_type: str | None = None
    kind: str | None = None
    day: str | None = None
    month: str | None = None
    entries: int
    display: MoneyColumns = Field(description="the same amounts rounded to cents so that the rows add up to the total")


class CostSummary(BaseModel):
    from_: datetime = Field(alias="from")
    to: datetime
    title: str = Field(description='the window for people ("1-25 November 2026 (month to date)")')
    as_of: datetime | None = Field(description="the latest accrued time among the entries")
    group_by: list[str]
    currency: Literal["USD"]
    rows: list[CostLine]
    total: CostLine

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class CorrectionPublic(BaseModel):
    id: int
    corrects_id: int
    usd: str
    job_id: str
    note: str


class BillImportPublic(BaseModel):
    id: str
    provider: str
    rows: int
    resources: int
    skipped_without_resource: int
    billed_usd: str
    reconciliation_url: str


class ReconciliationRow(BaseModel):
    resource_id: str
    ledger_usd: str
    billed_usd: str
    difference_usd: str = Field(description="billed - ledger")
    status: Literal["match", "differs", "only_in_bill", "only_in_ledger"]


class Reconciliation(BaseModel):
    import_id: str
    provider: str
    filename: str
    from_: datetime = Field(alias="from")
    to: datetime
    billed_usd: str
    ledger_usd: str
    difference_usd: str
    bill_total_usd: str = Field(description="the bill's whole total, rows without a resource (tax, support) included")
    rows: list[ReconciliationRow]

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class BudgetPage(Page[BudgetPublic]):
    pass


class SchedulePage(Page[SchedulePublic]):
    pass


class RunPage(Page[RunPublic]):
    pass
