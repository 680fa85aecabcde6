"""Burst policy: send a job waiting on-prem to the cloud only when it pays, and bring work back when pressure drops.

Role: for each job waiting in the on-prem queue, weigh the expected on-prem wait (from queue pressure: the
scheduler's estimated start, or `PressureSample.expected_wait_hours` for the job's size) against the cloud
premium and the job's deadline. Decisions are values with reasons; an executor launches, cancels and migrates.

Contract (pure: no SDK, database, HTTP or clock; `now` is passed in):
- `quote_cloud(spec, book, now, params, context=None)`: the best cloud pool for the job by the placement cost
  model (never an on-prem pool), as one or several identical nodes when the job needs more GPUs than any
  instance has (a gang); None when no cloud pool fits the job's shape, hourly ceiling or `max_total_usd`.
- `decide_burst(job, cloud, now, budget_left, params)`: BURST when the cloud fits the job's ceilings and its
  team's budget (`budget_left`, a number; None = no team budget) AND either the deadline is at risk on-prem
  (on-prem finish later than `deadline - deadline_margin_hours`, the cloud finish not) or the wait costs more
  than the premium: `wait_hours x gpus x value_usd_per_gpu_hour > cloud cost - on-prem cost` of the same work.
  Otherwise STAY, saying which test failed and by how much.
- `decide_return(job, now, onprem_wait_hours, params)`: RETURN a cloud job on-prem when on-prem would start it
  at once (pressure dropped) and moving saves at least `return_min_saving_usd` after the restart: a job not
  started yet moves now, a running one at its next checkpoint (`at_next_checkpoint`). Otherwise KEEP_CLOUD.
- `plan_bursts(jobs, quote, now, budgets, params, onprem_gpus)`: decides a whole queue in order, charging each
  burst against its team's budget, and (given `onprem_gpus`) shortening the expected wait of the jobs behind a
  burst job by the GPU-hours it no longer takes from the cluster. This is the one burst decision: `overspill
  simulate` scores it (`federation.simulate.cluster`) and the live loop runs it
  (`broker.loop.onprem_burst`), each feeding it its own wait estimates.

Example: 4 GPUs x 2 h waiting behind 6 h of queue, cloud $3.06/GPU-h, on-prem free (rate 0), value $2/GPU-h:
premium = 4 x 2.05 h x 3.06 = $25.09 (with 3 minutes of startup), wait cost = 6 x 4 x 2 = $48 -> BURST. The same
job behind 2 h of queue: wait cost $16 < $25.09 -> STAY, unless its deadline falls before now + 2 h + 2 h.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum

from federation.placement import Candidate, PlacementContext, PlacementParams, judge
from pricing.book import PriceBook
from providers.model import CENT, ZERO_USD, CapacityType, JobSpec, Offering


class Verdict(StrEnum):
    BURST = "burst"
    STAY = "stay"
    RETURN = "return"
    KEEP_CLOUD = "keep_cloud"


@dataclass(frozen=True, slots=True)
class BurstParams:
    """The tenant's settings. `value_usd_per_gpu_hour` is what one GPU-hour of waiting costs the tenant;
    `onprem_usd_per_gpu_hour` the internal rate of on-prem time (the premium is measured against it)."""

    value_usd_per_gpu_hour: float = 2.0
    onprem_usd_per_gpu_hour: float = 0.0
    deadline_margin_hours: float = 0.5
    min_wait_hours: float = 0.05
    return_min_saving_usd: float = 5.0
    return_max_wait_hours: float = 0.05
    restart_hours: float = 0.1
    placement: PlacementParams = field(default_factory=PlacementParams)


@dataclass(frozen=True, slots=True)
class CloudOption:
    """Where a job would run in the cloud: `nodes` identical pools of `offering`."""

    offering: Offering
    nodes: int
    params: PlacementParams

    @property
    def hourly_usd(self) -> Decimal:
        return self.offering.price.hourly_usd * self.nodes

    def run_hours(self, work_hours: float) -> float:
        p = self.params
        overhead = 1 + self.offering.interruption_rate_per_hour * (p.checkpoint_interval_hours / 2 + p.restart_hours)
        return work_hours * overhead + p.cloud_startup_hours

    def cost_usd(self, work_hours: float) -> Decimal:
        hours = Decimal(repr(self.run_hours(work_hours)))
        return (self.hourly_usd * hours).quantize(CENT, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """A job in the on-prem queue and what queue pressure says about it."""

    job_id: str
    spec: JobSpec
    remaining_work_hours: Decimal
    expected_wait_hours: float
    spent_usd: Decimal = ZERO_USD


@dataclass(frozen=True, slots=True)
class CloudJob:
    """A job bursted to the cloud: `started` is False while it is still launching."""

    job_id: str
    spec: JobSpec
    cloud: CloudOption
    remaining_work_hours: Decimal
    started: bool


@dataclass(frozen=True, slots=True)
class BurstDecision:
    job_id: str
    verdict: Verdict
    reason: str
    cloud: CloudOption | None = None
    cloud_cost_usd: Decimal | None = None
    premium_usd: Decimal | None = None
    wait_cost_usd: Decimal | None = None
    at_next_checkpoint: bool = False


def quote_cloud(
    spec: JobSpec, book: PriceBook, now: datetime, params: BurstParams, context: PlacementContext | None = None
) -> CloudOption | None:
    """The cheapest-expected cloud pool (or gang of pools) for the job's whole work; see the module docstring.

    `context` carries what the live broker knows beyond prices (pools nothing launches on, per-pool extras, pools
    without a checkpoint store); its time, work and params are replaced by this call's."""
    sizes = sorted(
        {
            item.offering.accelerator_count
            for group in book.for_shape(spec.accelerators, 1)
            for item in group.items
            if item.offering.capacity_type is not CapacityType.ON_PREM
        }
    )
    if not sizes:
        return None
    per_node = spec.gpu_count if spec.gpu_count <= sizes[-1] else sizes[-1]
    nodes = math.ceil(spec.gpu_count / per_node)
    node_spec = replace(
        spec,
        gpu_count=per_node,
        max_total_usd=(spec.max_total_usd / nodes).quantize(CENT),
        deadline_at=None,  # the deadline is weighed by decide_burst
    )
    ctx = PlacementContext(now=now, remaining_work_hours=spec.work_hours, params=params.placement)
    if context is not None:
        ctx = replace(context, now=now, remaining_work_hours=spec.work_hours, params=params.placement)
    best: Candidate | None = None
    for group in book.for_shape(spec.accelerators, per_node):
        for item in group.items:
            if item.offering.capacity_type is CapacityType.ON_PREM:
                continue
            c = judge(node_spec, item.offering, ctx)
            if isinstance(c, Candidate) and (
                best is None or (c.score, c.offering.key) < (best.score, best.offering.key)
            ):
                best = c
    return None if best is None else CloudOption(best.offering, nodes, params.placement)


def _onprem_usd(job: WaitingJob | CloudJob, work: float, params: BurstParams) -> Decimal:
    return Decimal(repr(params.onprem_usd_per_gpu_hour * job.spec.gpu_count * work)).quantize(CENT)


def decide_burst(
    job: WaitingJob,
    cloud: CloudOption | None,
    now: datetime,
    budget_left_usd: Decimal | None,
    params: BurstParams,
) -> BurstDecision:
    """BURST or STAY for one waiting job (module docstring)."""
    wait = max(0.0, job.expected_wait_hours)
    if wait < params.min_wait_hours:
        return BurstDecision(job.job_id, Verdict.STAY, f"on-prem starts it within {wait:.2f} h")
    if cloud is None:
        return BurstDecision(
            job.job_id, Verdict.STAY, "no cloud pool fits the job's shape, max_hourly_usd and max_total_usd"
        )
    work = float(job.remaining_work_hours)
    cost = cloud.cost_usd(work)
    premium = cost - _onprem_usd(job, work, params)
    wait_cost = Decimal(repr(wait * job.spec.gpu_count * params.value_usd_per_gpu_hour)).quantize(CENT)
    facts = {"cloud": cloud, "cloud_cost_usd": cost, "premium_usd": premium, "wait_cost_usd": wait_cost}
    if job.spent_usd + cost > job.spec.max_total_usd:
        why = f"cloud ${cost} would break max_total_usd ${job.spec.max_total_usd} (spent ${job.spent_usd})"
        return BurstDecision(job.job_id, Verdict.STAY, why, **facts)  # type: ignore[arg-type]
    if budget_left_usd is not None and cost > budget_left_usd:
        why = f"team budget: ${budget_left_usd} left, cloud costs ${cost}"
        return BurstDecision(job.job_id, Verdict.STAY, why, **facts)  # type: ignore[arg-type]
    deadline = job.spec.deadline_at
    if deadline is not None:
        onprem_finish = now + timedelta(hours=wait + work)
        cloud_finish = now + timedelta(hours=cloud.run_hours(work))
        if onprem_finish > deadline - timedelta(hours=params.deadline_margin_hours) and cloud_finish <= deadline:
            why = f"deadline at risk: on-prem finish {onprem_finish:%Y-%m-%d %H:%M}, cloud ${cost} makes it"
            return BurstDecision(job.job_id, Verdict.BURST, why, **facts)  # type: ignore[arg-type]
    if wait_cost > premium:
        why = f"{wait:.2f} h wait x {job.spec.gpu_count} GPUs costs ${wait_cost} > cloud premium ${premium}"
        return BurstDecision(job.job_id, Verdict.BURST, why, **facts)  # type: ignore[arg-type]
    why = f"wait cost ${wait_cost} ({wait:.2f} h) <= cloud premium ${premium}: stay on-prem"
    return BurstDecision(job.job_id, Verdict.STAY, why, **facts)  # type: ignore[arg-type]


def decide_return(job: CloudJob, now: datetime, onprem_wait_hours: float, params: BurstParams) -> BurstDecision:
    """RETURN a cloud job on-prem when pressure dropped and the move pays (module docstring)."""
    if onprem_wait_hours > params.return_max_wait_hours:
        return BurstDecision(job.job_id, Verdict.KEEP_CLOUD, f"on-prem wait still {onprem_wait_hours:.2f} h")
    work = float(job.remaining_work_hours)
    restart = params.restart_hours if job.started else 0.0
    deadline = job.spec.deadline_at
    if deadline is not None and now + timedelta(hours=onprem_wait_hours + restart + work) > deadline:
        return BurstDecision(job.job_id, Verdict.KEEP_CLOUD, "returning would miss the deadline")
    stay = job.cloud.cost_usd(work)
    move = _onprem_usd(job, work + restart, params)
    saving = stay - move
    if saving < Decimal(repr(params.return_min_saving_usd)):
        return BurstDecision(job.job_id, Verdict.KEEP_CLOUD, f"returning saves only ${saving}", job.cloud, stay)
    when = "at its next checkpoint" if job.started else "now (not started yet)"
    why = f"on-prem free again: return {when}, saves ${saving} of ${stay} cloud cost"
    return BurstDecision(job.job_id, Verdict.RETURN, why, job.cloud, stay, at_next_checkpoint=job.started)


def plan_bursts(
    jobs: Sequence[WaitingJob],
    quote: Callable[[WaitingJob], CloudOption | None],
    now: datetime,
    budgets: Mapping[str, Decimal] | None,
    params: BurstParams,
    onprem_gpus: int | None = None,
) -> list[BurstDecision]:
    """Decide a queue in order (module docstring). `budgets` maps team -> budget left (absent team: no limit)."""
    left = dict(budgets or {})
    freed = 0.0  # GPU-hours the bursts decided so far take off the cluster
    out: list[BurstDecision] = []
    for job in jobs:
        if freed and onprem_gpus:
            job = replace(job, expected_wait_hours=max(0.0, job.expected_wait_hours - freed / onprem_gpus))
        team = job.spec.team
        d = decide_burst(job, quote(job), now, left.get(team), params)
        if d.verdict is Verdict.BURST and d.cloud_cost_usd is not None:
            if team in left:
                left[team] -= d.cloud_cost_usd
            freed += job.spec.gpu_count * float(job.remaining_work_hours)
        out.append(d)
    return out
