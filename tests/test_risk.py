"""Interruption risk: traces, decayed experience and the prior/experience blend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pricing.risk import PoolExperience, apply_experience, blend, experience_from_runs, load_trace, rate_from_trace
from tests.builders import offering
from tests.data import shared_file

NOW = datetime(2026, 11, 2, tzinfo=UTC)


def test_rate_from_trace_counts_drops_per_hour_up() -> None:
    # 6 ticks of 10 minutes up, reclaimed, back up for 6 more, reclaimed: 2 reclaims in 2 h up
    trace = [1] * 6 + [0] * 3 + [1] * 6 + [0]
    est = rate_from_trace(trace, 600)
    assert est.rate_per_hour == pytest.approx(1.0)
    assert "2 reclaims" in est.basis


def test_rate_from_trace_without_reclaims_is_not_zero() -> None:
    est = rate_from_trace([1] * 60, 60)  # one hour up, never reclaimed
    assert est.rate_per_hour == pytest.approx(3.0)
    assert "rule of three" in est.basis


def test_experience_decays_with_age() -> None:
    recent = experience_from_runs([(NOW - timedelta(hours=10), NOW, True)], NOW, half_life_hours=72)
    old = experience_from_runs(
        [(NOW - timedelta(hours=154), NOW - timedelta(hours=144), True)], NOW, half_life_hours=72
    )
    assert recent.run_hours == pytest.approx(10) and recent.preemptions == pytest.approx(1)
    assert old.run_hours == pytest.approx(2.5) and old.preemptions == pytest.approx(0.25)


def test_blend_moves_from_prior_towards_experience() -> None:
    prior = blend(0.01, "advisor", None)
    assert prior.rate_per_hour == 0.01
    light = blend(0.01, "advisor", PoolExperience(run_hours=5, preemptions=1))
    heavy = blend(0.01, "advisor", PoolExperience(run_hours=5000, preemptions=1000))
    assert 0.01 < light.rate_per_hour < heavy.rate_per_hour
    assert heavy.rate_per_hour == pytest.approx(0.2, rel=0.02)
    assert "observed 1000.0 reclaims" in heavy.basis


def test_apply_experience_touches_only_spot_pools_seen() -> None:
    spot = offering(rate=0.01)
    od = offering(capacity="on_demand", rate=0.0)
    out = apply_experience([spot, od], {spot.key: PoolExperience(100, 10), od.key: PoolExperience(100, 10)})
    assert out[0].interruption_rate_per_hour > 0.01 and "observed" in out[0].interruption_basis
    assert out[1] == od


@pytest.mark.integration
def test_real_cant_be_late_traces_give_plausible_rates() -> None:
    path = shared_file("spot-traces/availability/1-node/aws-02-15-2023/us-east-1a_v100_1.json")
    est = load_trace(path)
    assert 0 < est.rate_per_hour < 5
    assert est.basis.startswith("trace:")
    preemption_dir = shared_file("spot-traces/preemption/1-node")
    rates = [load_trace(p).rate_per_hour for p in sorted(preemption_dir.rglob("*.json"))]
    assert rates and all(r > 0 for r in rates)


def test_bad_trace_file_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "t.json"
    bad.write_text('{"data": [1, 0]}')
    with pytest.raises(ValueError, match="not a spot availability trace"):
        load_trace(bad)


def test_trace_priors_replace_the_feed_prior_for_matching_spot_pools() -> None:
    from pricing.risk import RiskEstimate, apply_trace_priors

    spot = offering(rate=0.01)
    other_zone = offering(zone="us-east-1b", rate=0.01)
    od = offering(capacity="on_demand")
    priors = {
        "aws/us-east-1": RiskEstimate(0.2, "trace: region"),
        "aws/us-east-1/us-east-1a": RiskEstimate(0.5, "trace: zone a"),
    }
    out = apply_trace_priors([spot, other_zone, od], priors)
    assert (out[0].interruption_rate_per_hour, out[0].interruption_basis) == (0.5, "trace: zone a")  # longest wins
    assert (out[1].interruption_rate_per_hour, out[1].interruption_basis) == (0.2, "trace: region")
    assert out[2] == od
