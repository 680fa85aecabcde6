"""Placement: which pool should run a job, at what expected total cost, and why every other pool was rejected.

Expected total cost of running the job's remaining work on a pool:

    run_hours = remaining_work x (1 + rate x (checkpoint_interval / 2 + restart)) + startup
    cost      = hourly x run_hours + egress_per_gb x checkpoint_size (when the checkpoint lives elsewhere)
    hourly    = the pool's price + what its instance bills beside compute (boot disk, public IPv4: `extra_hourly_usd`)

where `rate` is the pool's expected interruptions per hour: each reclaim loses on average half a checkpoint
interval of work plus a restart. Pools are ranked by `cost + wait_hours x gpus x wait_value` (the value of GPU
time lost while queuing; 0 ranks by cost alone), ties broken by finish time and then pool key, so a decision is
deterministic. A pool is rejected with a reason when it does not fit the job (permanent reasons: the job could
never run there) or does not fit right now (price over a ceiling, deadline missed, no capacity, blocklisted, no
launch adapter: the broker has prices for the pool but nothing configured that can launch there, or no checkpoint
store: its instances would run the agent, which needs a store of that provider for the spec, logs and reports).

`quote` explains every relevant pool; `place` is the fast path used per decision: it walks each accelerator's
pools in price order and stops once price alone cannot beat the best candidate. Filters price order cannot stop
on are answered from the book's index instead (see `pricing.book`): a job with a region allow-list walks only
those regions' pools, and a provider allow-list, a non-preemptible job, a CPU, memory or GPU-memory minimum, a
provider nobody can launch on or a blocklisted provider rule out whole lanes before any pool in them is judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum

from pricing.book import GroupSummary, IndexedOffering, Lane, PoolGroup, PriceBook
from providers.model import CENT, CapacityType, JobSpec, Offering


class RejectReason(StrEnum):
    WRONG_ACCELERATOR = "wrong_accelerator"
    TOO_FEW_GPUS = "too_few_gpus"
    GPU_MEMORY = "gpu_memory_too_small"
    TOO_FEW_CPUS = "too_few_cpus"
    TOO_LITTLE_MEMORY = "too_little_memory"
    PROVIDER_NOT_ALLOWED = "provider_not_allowed"
    REGION_NOT_ALLOWED = "region_not_allowed"
    NOT_PREEMPTIBLE = "job_not_preemptible"
    NO_LAUNCH_ADAPTER = "no_launch_adapter"
    NO_CHECKPOINT_STORE = "no_checkpoint_store"
    UNAVAILABLE = "no_capacity"
    BLOCKLISTED = "blocklisted"
    OVER_HOURLY_CEILING = "over_hourly_ceiling"
    OVER_TOTAL_CEILING = "over_total_ceiling"
    MISSES_DEADLINE = "misses_deadline"

    @property
    def permanent(self) -> bool:
        """True when the pool could never run this job, whatever prices or capacity do."""
        return self in _PERMANENT


_PERMANENT = frozenset(
    {
        RejectReason.WRONG_ACCELERATOR,
        RejectReason.TOO_FEW_GPUS,
        RejectReason.GPU_MEMORY,
        RejectReason.TOO_FEW_CPUS,
        RejectReason.TOO_LITTLE_MEMORY,
        RejectReason.PROVIDER_NOT_ALLOWED,
        RejectReason.REGION_NOT_ALLOWED,
        RejectReason.NOT_PREEMPTIBLE,
    }
)


@dataclass(frozen=True, slots=True)
class PlacementParams:
    """Tunables of the cost model. Hours are floats: they only feed scoring."""

    checkpoint_interval_hours: float = 0.5
    restart_hours: float = 0.1
    cloud_startup_hours: float = 0.05
    wait_value_usd_per_gpu_hour: float = 0.0


@dataclass(frozen=True, slots=True)
class PlacementContext:
    """What a decision needs beyond the job and the catalog. `blocklist` holds `provider`, `provider/region`,
        `provider/region/zone` and pool keys to avoid (see `blocked`); `checkpoint_at` is `(provider, region)` of the
        latest checkpoint. `launchable` names the providers something can launch on (None: all); a pool of any other
        provider is rejected `no_launch_adapter`. `no_checkpoint_store` names the providers whose instances run the
    agent but have no checkpoint store anywhere (the agent reads its spec from one and reports through it): their
    pools are rejected `no_checkpoint_store`. `extra_hourly_usd` is what an instance bills per hour beside compute,
        by `provider/capacity_type` (e.g. `{"aws/spot": 0.027}`: a boot disk and a public IPv4), added to the pool's
        price for `max_hourly_usd` and the expected cost."""

    now: datetime
    remaining_work_hours: Decimal
    spent_usd: Decimal = Decimal("0")
    blocklist: frozenset[str] = frozenset()
    checkpoint_at: tuple[str, str] | None = None
    checkpoint_egress_usd_per_gb: Decimal = Decimal("0")  # leaving the checkpoint's provider
    checkpoint_interregion_usd_per_gb: Decimal = Decimal("0")  # to another region of the same provider
    params: PlacementParams = field(default_factory=PlacementParams)
    launchable: frozenset[str] | None = None
    extra_hourly_usd: Mapping[str, Decimal] = field(default_factory=dict)
    no_checkpoint_store: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Candidate:
    offering: Offering
    expected_cost_usd: Decimal
    expected_run_hours: float
    expected_wait_hours: float
    expected_finish_at: datetime
    transfer_usd: Decimal
    score: float


@dataclass(frozen=True, slots=True)
class Rejection:
    """A pool judged unfit, with why. The human `message` is built only when read (a quote over a large catalog
    rejects thousands of pools and shows a few)."""

    offering: Offering
    reason: RejectReason
    job: JobSpec
    ctx: PlacementContext

    @property
    def message(self) -> str:
        return explain(self.reason, self.job, self.offering, self.ctx)


@dataclass(frozen=True, slots=True)
class Quote:
    """Ranked candidates (best first) and a reason for every rejected pool."""

    candidates: tuple[Candidate, ...]
    rejections: tuple[Rejection, ...]
    other_accelerator_pools: int = 0

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    @property
    def ever_feasible(self) -> bool:
        """False when every pool is rejected for a permanent reason: the job can never run anywhere."""
        return bool(self.candidates) or any(not r.reason.permanent for r in self.rejections)

    def wait_reason(self) -> str:
        """Why the job cannot be placed now, naming the cheapest blocked pool."""
        if self.candidates:
            return ""
        transient = [r for r in self.rejections if not r.reason.permanent]
        if not transient:
            return "no pool fits this job's shape and constraints"
        unlaunchable = (RejectReason.NO_LAUNCH_ADAPTER, RejectReason.NO_CHECKPOINT_STORE)
        launchable = [r for r in transient if r.reason not in unlaunchable]
        transient = launchable or transient  # a limit the job could act on says more than a pool nobody launches
        cheapest = min(transient, key=lambda r: (r.offering.price.hourly_usd, r.offering.key))
        return f"{cheapest.reason.value}: {cheapest.message} (cheapest suitable pool {cheapest.offering.key})"


def _shape_reason(job: JobSpec, off: Offering) -> RejectReason | None:
    """Why the pool can never run the job (cheap: no message is built), or None when its shape fits."""
    if off.accelerator not in job.accelerators:
        return RejectReason.WRONG_ACCELERATOR
    if off.accelerator_count < job.gpu_count:
        return RejectReason.TOO_FEW_GPUS
    if off.gpu_memory_gib < job.min_gpu_memory_gib:
        return RejectReason.GPU_MEMORY
    if off.vcpus < job.cpus:
        return RejectReason.TOO_FEW_CPUS
    if off.memory_gib < job.memory_gib:
        return RejectReason.TOO_LITTLE_MEMORY
    if job.allowed_providers and off.provider not in job.allowed_providers:
        return RejectReason.PROVIDER_NOT_ALLOWED
    if job.allowed_regions and off.region not in job.allowed_regions:
        return RejectReason.REGION_NOT_ALLOWED
    if off.capacity_type is CapacityType.SPOT and not job.preemptible:
        return RejectReason.NOT_PREEMPTIBLE
    return None


_SHAPE_MESSAGES = {
    RejectReason.WRONG_ACCELERATOR: "pool has {off.accelerator}",
    RejectReason.TOO_FEW_GPUS: "pool has {off.accelerator_count} GPUs, job needs {job.gpu_count}",
    RejectReason.GPU_MEMORY: "pool GPUs have {off.gpu_memory_gib} GiB, job needs {job.min_gpu_memory_gib}",
    RejectReason.TOO_FEW_CPUS: "pool has {off.vcpus} vCPUs, job needs {job.cpus}",
    RejectReason.TOO_LITTLE_MEMORY: "pool has {off.memory_gib} GiB, job needs {job.memory_gib}",
    RejectReason.PROVIDER_NOT_ALLOWED: "provider {off.provider} not allowed",
    RejectReason.REGION_NOT_ALLOWED: "region {off.region} not allowed",
    RejectReason.NOT_PREEMPTIBLE: "spot pool, job is not preemptible",
}


def _run_hours(off: Offering, ctx: PlacementContext) -> float:
    p = ctx.params
    overhead = 1.0 + off.interruption_rate_per_hour * (p.checkpoint_interval_hours / 2 + p.restart_hours)
    startup = 0.0 if off.capacity_type is CapacityType.ON_PREM else p.cloud_startup_hours
    return float(ctx.remaining_work_hours) * overhead + startup


def _transfer(job: JobSpec, off: Offering, ctx: PlacementContext) -> Decimal:
    if ctx.checkpoint_at is None or (off.provider, off.region) == ctx.checkpoint_at:
        return Decimal("0")
    if off.provider == ctx.checkpoint_at[0]:
        return ctx.checkpoint_interregion_usd_per_gb * job.checkpoint_size_gb
    return ctx.checkpoint_egress_usd_per_gb * job.checkpoint_size_gb


def hourly_usd(off: Offering, ctx: PlacementContext) -> Decimal:
    """What running on the pool costs an hour: its price plus what its instance bills beside compute."""
    extra = ctx.extra_hourly_usd.get(f"{off.provider}/{off.capacity_type.value}") if ctx.extra_hourly_usd else None
    return off.price.hourly_usd + extra if extra else off.price.hourly_usd


def _cost(hourly: Decimal, run_hours: float, transfer: Decimal) -> Decimal:
    return (hourly * Decimal(repr(run_hours)) + transfer).quantize(CENT, rounding=ROUND_HALF_EVEN)


def blocked(off: Offering, blocklist: frozenset[str]) -> bool:
    """Whether a blocklist entry covers the pool: its provider, `provider/region`, `provider/region/zone`, or the
    pool's own key (a pool that refused one job's launch is avoided for that job only)."""
    return bool(blocklist) and (
        off.provider in blocklist
        or f"{off.provider}/{off.region}" in blocklist
        or f"{off.provider}/{off.region}/{off.zone}" in blocklist
        or off.key in blocklist
    )


def judge(job: JobSpec, off: Offering, ctx: PlacementContext) -> Candidate | RejectReason:
    """The verdict on one pool without building an explanation (the per-decision hot path)."""
    reason = _shape_reason(job, off)
    if reason is not None:
        return reason
    if ctx.launchable is not None and off.provider not in ctx.launchable:
        return RejectReason.NO_LAUNCH_ADAPTER
    if ctx.no_checkpoint_store and off.provider in ctx.no_checkpoint_store:
        return RejectReason.NO_CHECKPOINT_STORE
    if not off.available:
        return RejectReason.UNAVAILABLE
    if ctx.blocklist and blocked(off, ctx.blocklist):
        return RejectReason.BLOCKLISTED
    hourly = hourly_usd(off, ctx)
    if job.max_hourly_usd is not None and hourly > job.max_hourly_usd:
        return RejectReason.OVER_HOURLY_CEILING
    run_hours = _run_hours(off, ctx)
    transfer = _transfer(job, off, ctx)
    cost = _cost(hourly, run_hours, transfer)
    if ctx.spent_usd + cost > job.max_total_usd:
        return RejectReason.OVER_TOTAL_CEILING
    wait = off.expected_wait_hours
    finish = ctx.now + timedelta(hours=wait + run_hours)
    if job.deadline_at is not None and finish > job.deadline_at:
        return RejectReason.MISSES_DEADLINE
    # ranked on the unrounded cost: two pools whose expected costs round to the same cent still differ (a risk
    # that adds a fraction of a cent must not lose to the key's alphabetical order)
    exact = float(hourly) * run_hours + float(transfer)
    score = exact + wait * job.gpu_count * ctx.params.wait_value_usd_per_gpu_hour
    return Candidate(off, cost, run_hours, wait, finish, transfer, score)


def explain(reason: RejectReason, job: JobSpec, off: Offering, ctx: PlacementContext) -> str:
    """The human explanation of a rejection (recomputes what the message quotes)."""
    if reason in _SHAPE_MESSAGES:
        return _SHAPE_MESSAGES[reason].format(job=job, off=off)
    if reason is RejectReason.NO_LAUNCH_ADAPTER:
        return f"the broker has prices for {off.provider} but no configured adapter launches there"
    if reason is RejectReason.NO_CHECKPOINT_STORE:
        return (
            f"{off.provider} instances run the agent, which needs a checkpoint store of {off.provider} for its spec, "
            f"checkpoints, logs and reports, and none is configured (OVERSPILL_CHECKPOINT_STORES)"
        )
    if reason is RejectReason.UNAVAILABLE:
        return "provider reports no capacity"
    if reason is RejectReason.BLOCKLISTED:
        return "a recent launch failure or reclaim here, or this pool refused this job's launch request"
    hourly = hourly_usd(off, ctx)
    if reason is RejectReason.OVER_HOURLY_CEILING:
        if hourly != off.price.hourly_usd:
            return (
                f"${hourly}/h (${off.price.hourly_usd} compute + ${hourly - off.price.hourly_usd} disk and address) "
                f"is over max_hourly_usd ${job.max_hourly_usd}/h"
            )
        return f"${off.price.hourly_usd}/h is over max_hourly_usd ${job.max_hourly_usd}/h"
    run_hours = _run_hours(off, ctx)
    if reason is RejectReason.OVER_TOTAL_CEILING:
        cost = _cost(hourly, run_hours, _transfer(job, off, ctx))
        left = job.max_total_usd - ctx.spent_usd
        return f"expected ${cost} exceeds the ${left} left of max_total_usd ${job.max_total_usd}"
    finish = ctx.now + timedelta(hours=off.expected_wait_hours + run_hours)
    return f"expected finish {finish.isoformat(timespec='minutes')} is after the deadline"


def evaluate(job: JobSpec, off: Offering, ctx: PlacementContext) -> Candidate | Rejection:
    """Judge one pool for one job: a Candidate with its expected cost, or a Rejection with its reason."""
    verdict = judge(job, off, ctx)
    if isinstance(verdict, Candidate):
        return verdict
    return Rejection(off, verdict, job, ctx)


def _rank_key(c: Candidate) -> tuple[float, datetime, str]:
    return (c.score, c.expected_finish_at, c.offering.key)


def quote(job: JobSpec, book: PriceBook, ctx: PlacementContext) -> Quote:
    """Every pool of the job's accelerators judged, candidates ranked best first.

    Pools of other accelerators are rejected for one obvious reason; they are counted, not listed.
    """
    candidates: list[Candidate] = []
    rejections: list[Rejection] = []
    relevant = 0
    for group in book.for_accelerators(job.accelerators):
        relevant += len(group)
        for item in group:
            verdict = evaluate(job, item.offering, ctx)
            if isinstance(verdict, Candidate):
                candidates.append(verdict)
            else:
                rejections.append(verdict)
    candidates.sort(key=_rank_key)
    rejections.sort(key=lambda r: (r.offering.price.hourly_usd, r.offering.key))
    return Quote(tuple(candidates), tuple(rejections), other_accelerator_pools=len(book) - relevant)


def place(job: JobSpec, book: PriceBook, ctx: PlacementContext) -> Candidate | None:
    """The best pool for the job now, or None (then `quote` explains why). Same ranking as `quote`."""
    best: Candidate | None = None
    work = float(ctx.remaining_work_hours)
    max_hourly = float(job.max_hourly_usd) if job.max_hourly_usd is not None else float("inf")
    budget_bound = float(job.max_total_usd - ctx.spent_usd) + 0.005  # + rounding slack of the cost's cents
    if job.deadline_at is not None and ctx.now + timedelta(hours=work) > job.deadline_at:
        return None  # not even the bare work fits before the deadline, on any pool
    for group in book.for_shape(job.accelerators, job.gpu_count):
        if not _group_may_fit(job, group.summary):
            continue
        for items, extra, run_floor, transfer_floor in _parts(job, ctx, group, work):
            for item in items:
                hourly = item.hourly + extra
                if hourly > max_hourly:
                    break  # sorted by price: every later pool is over the hourly ceiling too
                floor = hourly * run_floor + transfer_floor  # no pool of this part costs less
                if floor > budget_bound:
                    break  # this and every later pool would break max_total_usd
                if best is not None and floor - 0.005 > best.score:
                    break  # even with no wait this pool costs more than the best
                verdict = judge(job, item.offering, ctx)
                if isinstance(verdict, Candidate) and (best is None or _rank_key(verdict) < _rank_key(best)):
                    best = verdict
    return best


_Part = tuple[tuple[IndexedOffering, ...], float, float, float]


def _parts(job: JobSpec, ctx: PlacementContext, group: PoolGroup, work: float) -> list[_Part]:
    """The price-ordered parts of a group that may hold a pool for the job, each with lower bounds shared by its
    pools (extra hourly cost, run hours, checkpoint transfer) for the price-ordered early stop: the allowed
    regions' pools, else the lanes the job's filters do not rule out, else (no filter bites in this group and no
    checkpoint transfer to price) the whole group. Every pool left out would be rejected by `judge` for a
    permanent or launch reason, so the best pool is the same."""
    p = ctx.params
    overhead = p.checkpoint_interval_hours / 2 + p.restart_hours
    s = group.summary
    group_run = work * (1.0 + s.min_interruption_rate * overhead) + (0.0 if s.has_on_prem else p.cloud_startup_hours)
    if job.allowed_regions:
        return [
            (group.by_region[r], 0.0, group_run, 0.0)
            for r in dict.fromkeys(job.allowed_regions)
            if r in group.by_region
        ]
    transfer = ctx.checkpoint_at is not None and job.checkpoint_size_gb > 0
    if not (
        transfer
        or ctx.extra_hourly_usd
        or job.allowed_providers
        or not job.preemptible
        or job.min_gpu_memory_gib > s.min_gpu_memory_gib
        or job.cpus > s.min_vcpus
        or float(job.memory_gib) > s.min_memory_gib
        or (ctx.launchable is not None and not s.providers <= ctx.launchable)
        or (ctx.no_checkpoint_store and not s.providers.isdisjoint(ctx.no_checkpoint_store))
        or (ctx.blocklist and not s.providers.isdisjoint(ctx.blocklist))
    ):
        return [(group.items, 0.0, group_run, 0.0)]
    egress = float(ctx.checkpoint_egress_usd_per_gb * job.checkpoint_size_gb) if transfer else 0.0
    parts: list[_Part] = []
    for lane in group.lanes:
        if not _lane_may_fit(job, ctx, lane):
            continue
        extra = ctx.extra_hourly_usd.get(f"{lane.provider}/{lane.capacity_type}") if ctx.extra_hourly_usd else None
        run = work * (1.0 + lane.min_interruption_rate * overhead)
        if lane.capacity_type != CapacityType.ON_PREM.value:
            run += p.cloud_startup_hours
        # the checkpoint's own provider may hold it in the same region (no transfer); any other pays egress
        moved = egress if ctx.checkpoint_at is not None and lane.provider != ctx.checkpoint_at[0] else 0.0
        parts.append((lane.items, float(extra) if extra else 0.0, run, moved))
    return parts


def _lane_may_fit(job: JobSpec, ctx: PlacementContext, lane: Lane) -> bool:
    return (
        (not job.allowed_providers or lane.provider in job.allowed_providers)
        and (job.preemptible or lane.capacity_type != CapacityType.SPOT.value)
        and lane.gpu_memory_gib >= job.min_gpu_memory_gib
        and lane.vcpus >= job.cpus
        and lane.memory_gib >= float(job.memory_gib)
        and (ctx.launchable is None or lane.provider in ctx.launchable)
        and lane.provider not in ctx.no_checkpoint_store
        and lane.provider not in ctx.blocklist
    )


def _group_may_fit(job: JobSpec, g: GroupSummary) -> bool:
    return (
        g.max_gpu_memory_gib >= job.min_gpu_memory_gib
        and g.max_vcpus >= job.cpus
        and g.max_memory_gib >= float(job.memory_gib)
        and (not job.allowed_providers or not g.providers.isdisjoint(job.allowed_providers))
        and (not job.allowed_regions or not g.regions.isdisjoint(job.allowed_regions))
        and (job.preemptible or g.has_non_spot)
    )


def ever_feasible(job: JobSpec, offerings: Iterable[Offering]) -> bool:
    """True when at least one pool fits the job's shape and constraints (prices and capacity aside)."""
    return any(_shape_reason(job, off) is None for off in offerings)
