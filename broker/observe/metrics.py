"""Prometheus metrics: the broker's state read from the database at scrape time, plus the loop's own events.

Two sources, one registry per `Runtime` (`rt.metrics.registry`), served by `GET /metrics`:
- `StateCollector` queries the database on each scrape, so every replica reports the same truth and nothing is
  lost on restart: jobs by tenant and state, live placements by provider / capacity type / state, placements made
  and preemptions (monotonic counts of placement rows), on-prem queue pressure per source and GPU type, price
  feed age and failure per feed, spend rate (USD/h of running placements) and month-to-date spend per tenant
  and team.
- `LoopMetrics` counts what happens in this process: tick step durations (a histogram labelled by step), step
  failures, items a step failed on and skipped (`overspill_tick_item_errors_total{step}`) or quarantined, burst
  decisions by decision and reason code, the time of the last completed tick.

Label sets are bounded: no job, placement or instance ids ever become labels. Steps, states, decisions and reason
codes are fixed sets; providers, feeds and pressure sources come from configuration; tenants from API keys. Teams
are chosen freely per job, so each tenant reports at most `MAX_TEAMS_PER_TENANT` teams by name (the largest) and
folds the rest into `team="_other"`. Money is summed as Decimal and converted to a float only for exposition.

`GET /metrics` (broker/api/routes/metrics.py) serves the registry.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from decimal import Decimal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import and_, func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from broker.store.tables import CostEntryRow, FeedStatus, Job, Placement, PressureRow
from providers.model import JobState, PlacementState

MAX_TEAMS_PER_TENANT = 50
OTHER_TEAM = "_other"
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LIVE = (PlacementState.LAUNCHING.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value)


class BurstReason:
    """The bounded reason codes of burst decisions (`overspill_burst_decisions_total{decision, reason}`)."""

    LONG_WAIT = "long_onprem_wait"  # decision burst (the fixed wait threshold, or the wait costs more than the cloud)
    DEADLINE = "deadline_at_risk"  # decision burst: on-prem would miss the job's deadline, the cloud makes it
    PREMIUM = "cloud_premium_above_wait_cost"  # decision stay: waiting is cheaper than the cloud premium
    SHORT_WAIT = "short_onprem_wait"  # decision stay
    NO_CLOUD_POOL = "no_cloud_pool_within_ceiling"  # decision stay
    UNUSABLE_SPEC = "unusable_spec"  # decision stay
    CLOUD_SUCCEEDED = "cloud_succeeded"  # decision cancel_onprem
    CLOUD_ENDED = "cloud_job_"  # + failed/paused/cancelled, decision release
    GAVE_UP = "no_cloud_placement_in_time"  # decision release
    STARTED_ON_PREM = "started_on_prem"  # decision drop: Slurm started it before the hold landed
    # decision withdraw: the held job ended on-prem (its user cancelled it) or was started there (someone released
    # the hold) while its burst was in the cloud: the cloud run is cancelled
    ENDED_ON_PREM = "ended_on_prem"
    ORPHAN_HOLD = "orphaned_hold"  # decision release: held, never committed (a crash), given back
    # decision refuse: the account's governance says no (OVERSPILL_SLURM_ACCOUNTS)
    ACCOUNT_NOT_MAPPED = "account_not_mapped"
    ACCOUNT_NOT_ALLOWED = "account_not_allowed"
    USER_NOT_ALLOWED = "user_not_allowed"
    QOS_NOT_ALLOWED = "qos_not_allowed"
    CEILING_ABOVE_POLICY = "ceiling_above_policy"
    IMAGE_NOT_ALLOWED = "image_not_allowed"
    FIELD_NOT_ALLOWED = "comment_field_not_allowed"
    PROVIDER_NOT_ALLOWED = "provider_not_allowed"
    ACCOUNT_BUDGET = "account_monthly_budget_spent"
    HARD_BUDGET = "hard_budget_spent"
    JOB_NOT_RUNNABLE = "job_not_runnable_in_cloud"  # its script, environment, directory or container cannot go


class LoopMetrics:
    """In-process counters and histograms of the control loop, in this runtime's own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.step_seconds = Histogram(
            "overspill_tick_step_duration_seconds",
            "Time one control-loop step took, per step.",
            ["step"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.step_failures = Counter(
            "overspill_tick_step_failures",
            "Control-loop steps that raised (the next step still ran).",
            ["step"],
            registry=self.registry,
        )
        self.item_errors = Counter(
            "overspill_tick_item_errors",
            "Items (placements, mailbox entries, feeds, report runs...) a control-loop step failed on and skipped "
            "(the step went on with the others), by step.",
            ["step"],
            registry=self.registry,
        )
        self.items_quarantined = Counter(
            "overspill_tick_items_quarantined",
            "Items a step quarantined after they failed `tick_item_quarantine_after` ticks in a row, by step.",
            ["step"],
            registry=self.registry,
        )
        self.last_tick = Gauge(
            "overspill_tick_last_completed_timestamp_seconds",
            "Unix time (wall clock) at which this process last completed a tick.",
            registry=self.registry,
        )
        self.burst_decisions = Counter(
            "overspill_burst_decisions",
            "Decisions about opted-in on-prem jobs: burst, stay, release back on-prem, cancel on-prem; by reason.",
            ["decision", "reason"],
            registry=self.registry,
        )
        self._state: StateCollector | None = None

    def observe_step(self, step: str, seconds: float, failed: bool) -> None:
        self.step_seconds.labels(step).observe(seconds)
        if failed:
            self.step_failures.labels(step).inc()

    def tick_completed(self) -> None:
        self.last_tick.set_to_current_time()

    def burst_decision(self, decision: str, reason: str) -> None:
        self.burst_decisions.labels(decision, reason).inc()

    def attach_state(self, engine: Engine, clock: Callable[[], datetime]) -> None:
        """Add the database-backed collector reading `engine` at `clock()` (once; later calls do nothing)."""
        if self._state is None:
            self._state = StateCollector(engine, clock)
            self.registry.register(self._state)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _f(value: Decimal) -> float:
    return float(value)


def _month_start(now: datetime) -> datetime:
    now = now.astimezone(UTC)
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def fold_teams(values: dict[tuple[str, str], Decimal]) -> dict[tuple[str, str], Decimal]:
    """Keep each tenant's `MAX_TEAMS_PER_TENANT` largest teams by name; sum the rest into `_other`."""
    by_tenant: dict[str, list[tuple[str, Decimal]]] = defaultdict(list)
    for (tenant, team), value in values.items():
        by_tenant[tenant].append((team, value))
    out: dict[tuple[str, str], Decimal] = {}
    for tenant, teams in by_tenant.items():
        teams.sort(key=lambda tv: (-tv[1], tv[0]))
        for i, (team, value) in enumerate(teams):
            key = (tenant, team if i < MAX_TEAMS_PER_TENANT and team != OTHER_TEAM else OTHER_TEAM)
            out[key] = out.get(key, Decimal("0")) + value
    return out


class StateCollector(Collector):
    """Reads the broker's durable state on every scrape (see the module docstring for the metrics)."""

    def __init__(self, engine: Engine, clock: Callable[[], datetime]) -> None:
        self.engine = engine
        self.clock = clock

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []  # nothing to declare up front; do not touch the database at registration

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily("overspill_state_scrape_ok", "1 when the database answered this scrape.")
        try:
            families = list(self._collect(self.clock()))
        except SQLAlchemyError:
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families

    def _collect(self, now: datetime) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with Session(self.engine) as session:
            yield from self._jobs(session)
            yield from self._placements(session)
            yield from self._pressure(session)
            yield from self._feeds(session, now)
            yield from self._spend(session, now)

    def _jobs(self, session: Session) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "overspill_jobs", "Jobs by tenant and state (the API's: `starting` until the instance is up).",
            labels=["tenant", "state"],
        )  # fmt: skip
        not_up = and_(col(Placement.id).is_not(None), col(Placement.started_at).is_(None))
        rows = session.exec(
            select(Job.tenant, Job.state, not_up, func.count())
            .outerjoin(Placement, col(Placement.id) == Job.current_placement_id)
            .group_by(Job.tenant, Job.state, not_up)
        ).all()
        counts: dict[tuple[str, str], int] = {}
        for tenant, state, starting, n in rows:
            label = "starting" if state == JobState.RUNNING.value and starting else state
            counts[(tenant, label)] = counts.get((tenant, label), 0) + n
        for (tenant, label), n in sorted(counts.items()):
            jobs.add_metric([tenant, label], float(n))
        yield jobs

    def _placements(self, session: Session) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        live = GaugeMetricFamily(
            "overspill_placements_active",
            "Placements launching, queued or running, by provider, capacity type and state.",
            labels=["provider", "capacity_type", "state"],
        )
        made = CounterMetricFamily(
            "overspill_placements",
            "Placements ever made, by provider and capacity type.",
            labels=["provider", "capacity_type"],
        )
        preempted = CounterMetricFamily(
            "overspill_preemptions",
            "Placements reclaimed by their provider (spot interruptions, on-prem preemptions).",
            labels=["provider", "capacity_type"],
        )
        rows = session.exec(
            select(Placement.provider, Placement.capacity_type, Placement.state, func.count()).group_by(
                Placement.provider, Placement.capacity_type, Placement.state
            )
        ).all()
        totals: dict[tuple[str, str], int] = defaultdict(int)
        reclaimed: dict[tuple[str, str], int] = defaultdict(int)
        for provider, capacity_type, state, n in rows:
            totals[(provider, capacity_type)] += n
            if state == PlacementState.PREEMPTED.value:
                reclaimed[(provider, capacity_type)] += n
            if state in _LIVE:
                live.add_metric([provider, capacity_type, state], float(n))
        for key, n in sorted(totals.items()):
            made.add_metric(list(key), float(n))
            preempted.add_metric(list(key), float(reclaimed.get(key, 0)))
        yield live
        yield made
        yield preempted

    def _pressure(self, session: Session) -> Iterator[GaugeMetricFamily]:
        labels = ["source", "accelerator"]
        families = {
            "pending_gpus": GaugeMetricFamily(
                "overspill_onprem_pending_gpus", "GPUs requested by jobs queued on-prem.", labels=labels
            ),
            "pending_jobs": GaugeMetricFamily(
                "overspill_onprem_pending_jobs", "Jobs queued on-prem for this GPU type.", labels=labels
            ),
            "free_gpus": GaugeMetricFamily("overspill_onprem_free_gpus", "Idle on-prem GPUs.", labels=labels),
            "total_gpus": GaugeMetricFamily("overspill_onprem_gpus", "On-prem GPUs in the fleet.", labels=labels),
            "wait": GaugeMetricFamily(
                "overspill_onprem_expected_wait_seconds",
                "Expected queue wait for a new one-GPU job on-prem.",
                labels=labels,
            ),
            "pressure": GaugeMetricFamily(
                "overspill_onprem_queue_pressure_ratio",
                "Queued GPU demand over fleet size (above 1: more waiting than the fleet holds).",
                labels=labels,
            ),
            "age": GaugeMetricFamily(
                "overspill_onprem_pressure_age_seconds", "Age of the last pressure sample.", labels=labels
            ),
        }
        now = self.clock()
        for r in session.exec(select(PressureRow)).all():
            values = [r.source, r.accelerator]
            families["pending_gpus"].add_metric(values, float(r.pending_gpus))
            families["pending_jobs"].add_metric(values, float(r.pending_jobs))
            families["free_gpus"].add_metric(values, float(r.free_gpus))
            families["total_gpus"].add_metric(values, float(r.total_gpus))
            families["wait"].add_metric(values, r.expected_wait_hours * 3600.0)
            families["pressure"].add_metric(values, r.pending_gpus / r.total_gpus if r.total_gpus else 0.0)
            families["age"].add_metric(values, max(0.0, (now - r.observed_at).total_seconds()))
        yield from families.values()

    def _feeds(self, session: Session, now: datetime) -> Iterator[GaugeMetricFamily]:
        age = GaugeMetricFamily(
            "overspill_price_feed_age_seconds", "Time since the feed's last successful refresh.", labels=["feed"]
        )
        failing = GaugeMetricFamily(
            "overspill_price_feed_failing",
            "1 when the feed's latest refresh failed (last good prices in use).",
            labels=["feed"],
        )
        items = GaugeMetricFamily(
            "overspill_price_feed_offerings", "Pools the feed's last successful refresh returned.", labels=["feed"]
        )
        for f in session.exec(select(FeedStatus)).all():
            if f.last_success_at is not None:
                age.add_metric([f.name], max(0.0, (now - f.last_success_at).total_seconds()))
            failed = f.last_error_at is not None and (f.last_success_at is None or f.last_error_at > f.last_success_at)
            failing.add_metric([f.name], 1.0 if failed else 0.0)
            items.add_metric([f.name], float(f.items))
        yield age
        yield failing
        yield items

    def _spend(self, session: Session, now: datetime) -> Iterator[GaugeMetricFamily]:
        rate = GaugeMetricFamily(
            "overspill_spend_rate_usd_per_hour",
            "What running placements cost per hour now, by tenant and team.",
            labels=["tenant", "team"],
        )
        mtd = GaugeMetricFamily(
            "overspill_spend_month_to_date_usd",
            "Ledger spend since the start of the calendar month (UTC), by tenant and team.",
            labels=["tenant", "team"],
        )
        running = session.exec(
            select(Job.tenant, Job.team, Placement.hourly_usd, Placement.price_segment_hourly_usd)
            .join(Job, col(Job.id) == col(Placement.job_id))
            .where(Placement.state == PlacementState.RUNNING.value)
        ).all()
        per_team: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        for tenant, team, hourly, current in running:
            per_team[(tenant, team)] += current if current is not None else hourly
        for (tenant, team), usd in sorted(fold_teams(per_team).items()):
            rate.add_metric([tenant, team], _f(usd))
        month = session.exec(
            select(CostEntryRow.tenant, CostEntryRow.team, func.sum(CostEntryRow.usd))
            .where(col(CostEntryRow.period_start_at) >= _month_start(now))
            .group_by(CostEntryRow.tenant, CostEntryRow.team)
        ).all()
        spent = {(tenant, team): Decimal(str(usd or 0)) for tenant, team, usd in month}
        for (tenant, team), usd in sorted(fold_teams(spent).items()):
            mtd.add_metric([tenant, team], _f(usd))
        yield rate
        yield mtd
