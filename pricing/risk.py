"""Interruption risk: the expected number of reclaims per running hour of a spot pool, and where it comes from.

Three sources, blended:
- a prior from the feed (AWS Spot Advisor bands, a documented default elsewhere), already on the Offering;
- availability traces (the "Can't Be Late" spot traces): `rate_from_trace` counts how often capacity that was up
  went away per hour it was up; configured per pool-key prefix, a trace replaces the feed's prior
  (`apply_trace_priors`);
- the broker's own experience: every spot hour it ran in a pool and every reclaim it saw there, decayed with a
  half-life so old behaviour fades.

The blend is a gamma-Poisson update: the prior acts as `prior_hours` of pseudo-observation at the prior rate,
so a pool the broker has barely used keeps its prior, and one it has used heavily converges on what it saw.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import pairwise
from pathlib import Path

from pricing.advisor import Band, SpotAdvisor
from providers.model import CapacityType, Offering

AWS_DEFAULT_BAND = 2  # the advisor band assumed for a pool the advisor does not list (as the live AWS feed does)


@dataclass(frozen=True, slots=True)
class PoolExperience:
    """What the broker saw in one pool: spot run hours and reclaims, already decayed to `now`."""

    run_hours: float
    preemptions: float


@dataclass(frozen=True, slots=True)
class RiskEstimate:
    rate_per_hour: float
    basis: str


# GCP and Azure publish no per-pool rate: the same documented defaults as their live feeds
DEFAULT_SPOT_PRIORS: dict[str, RiskEstimate] = {
    "gcp": RiskEstimate(0.05, "gcp default (no public rate)"),
    "azure": RiskEstimate(0.05, "azure default prior (no public rate)"),
}
OTHER_SPOT_PRIOR = RiskEstimate(0.05, "default spot prior (no public rate)")


def spot_prior(provider: str, region: str, instance_type: str, advisor: SpotAdvisor | None = None) -> RiskEstimate:
    """The interruption prior of a spot pool nothing has been observed in yet: for AWS its Spot Advisor band
    (`advisor`), or the assumed band `AWS_DEFAULT_BAND` when the advisor has no entry (or none is given); for GCP
    and Azure their documented defaults (`DEFAULT_SPOT_PRIORS`), for any other provider `OTHER_SPOT_PRIOR`. The
    basis says which."""
    if provider == "aws":
        band = advisor.band(region, instance_type) if advisor is not None else None
        if band is not None and advisor is not None:
            return RiskEstimate(band.rate_per_hour, band.describe(advisor.source))
        assumed = Band.of(AWS_DEFAULT_BAND)
        return RiskEstimate(
            assumed.rate_per_hour, f"no spot advisor data for {instance_type} in {region}: assumed {assumed.describe()}"
        )
    return DEFAULT_SPOT_PRIORS.get(provider, OTHER_SPOT_PRIOR)


def decay_weight(age_hours: float, half_life_hours: float) -> float:
    """Weight of an observation `age_hours` old."""
    return 0.5 ** (max(0.0, age_hours) / half_life_hours)


def experience_from_runs(
    runs: Iterable[tuple[datetime, datetime, bool]], now: datetime, half_life_hours: float = 72.0
) -> PoolExperience:
    """Decayed experience from `(started_at, ended_at, preempted)` runs in one pool."""
    hours = 0.0
    reclaims = 0.0
    for start, end, preempted in runs:
        weight = decay_weight((now - end).total_seconds() / 3600, half_life_hours)
        hours += weight * max(0.0, (end - start).total_seconds() / 3600)
        if preempted:
            reclaims += weight
    return PoolExperience(hours, reclaims)


def blend(prior_rate: float, prior_basis: str, seen: PoolExperience | None, prior_hours: float = 50.0) -> RiskEstimate:
    """Posterior mean rate of a gamma prior worth `prior_hours` updated with the pool's experience."""
    if seen is None or seen.run_hours <= 0:
        return RiskEstimate(prior_rate, prior_basis or "no data")
    rate = (prior_rate * prior_hours + seen.preemptions) / (prior_hours + seen.run_hours)
    basis = f"{prior_basis or 'prior'} + observed {seen.preemptions:.1f} reclaims in {seen.run_hours:.1f} h"
    return RiskEstimate(rate, basis)


def apply_experience(
    offerings: Sequence[Offering], experience: dict[str, PoolExperience], prior_hours: float = 50.0
) -> list[Offering]:
    """Spot offerings with their rates updated by the broker's experience (others unchanged)."""
    out = []
    for off in offerings:
        seen = experience.get(off.key)
        if off.capacity_type is not CapacityType.SPOT or seen is None:
            out.append(off)
            continue
        est = blend(off.interruption_rate_per_hour, off.interruption_basis, seen, prior_hours)
        out.append(replace(off, interruption_rate_per_hour=est.rate_per_hour, interruption_basis=est.basis))
    return out


def apply_trace_priors(offerings: Sequence[Offering], priors: dict[str, RiskEstimate]) -> list[Offering]:
    """Spot offerings whose key starts with a configured prefix (e.g. `aws/us-east-1/us-east-1a/p3.2xlarge`)
    take the trace's rate as their prior (the longest matching prefix wins); others are unchanged."""
    if not priors:
        return list(offerings)
    ordered = sorted(priors.items(), key=lambda kv: len(kv[0]), reverse=True)
    out = []
    for off in offerings:
        match = next((est for prefix, est in ordered if off.key.startswith(prefix)), None)
        if off.capacity_type is not CapacityType.SPOT or match is None or math.isinf(match.rate_per_hour):
            out.append(off)
            continue
        out.append(replace(off, interruption_rate_per_hour=match.rate_per_hour, interruption_basis=match.basis))
    return out


def rate_from_trace(values: Sequence[int], gap_seconds: float) -> RiskEstimate:
    """Reclaims per available hour from an availability trace (1 = capacity up, 0 = not, one value per tick).

    Every 1 -> 0 step is a reclaim; the rate is reclaims over hours spent up. With no reclaim at all the
    estimate is the rule-of-three upper bound (3 / hours up) rather than an overconfident zero.
    """
    up_ticks = sum(1 for v in values if v > 0)
    reclaims = sum(1 for a, b in pairwise(values) if a > 0 and b == 0)
    hours_up = up_ticks * gap_seconds / 3600
    if hours_up <= 0:
        return RiskEstimate(math.inf, "trace: never available")
    if reclaims == 0:
        return RiskEstimate(3 / hours_up, f"trace: no reclaim in {hours_up:.0f} h up (rule of three)")
    return RiskEstimate(reclaims / hours_up, f"trace: {reclaims} reclaims in {hours_up:.0f} h up")


def load_trace(path: Path) -> RiskEstimate:
    """Read a spot-traces JSON file (`{"metadata": {"gap_seconds": N}, "data": [...]}`) and estimate its rate."""
    try:
        doc = json.loads(path.read_text())
        gap = float(doc["metadata"]["gap_seconds"])
        values = [int(v) for v in doc["data"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a spot availability trace ({exc})") from exc
    return rate_from_trace(values, gap)
