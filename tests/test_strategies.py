"""Preemption strategies (federation/strategies.py) on small hand-made markets whose right answer is worked out here."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest

from federation.simulate.deadline import DeadlineJob, job_spec, run_deadline
from federation.simulate.market import TraceMarket
from federation.simulate.traces import SpotTrace
from federation.strategies import (
    STRATEGIES,
    EagerNextRegion,
    Move,
    NextCheapest,
    Overspill,
    Preemption,
    RunLengths,
    RunState,
    UniformProgress,
    decide,
    make_strategy,
)

H = 3600


def market(zones: dict[str, str], prices: dict[str, float], od: float = 3.0, gap: int = H) -> TraceMarket:
    return TraceMarket(SpotTrace.from_bits(zones, prices, on_demand_usd=od, gap_seconds=gap))


def state_at(m: TraceMarket, job: DeadlineJob, tick: int, **kw: object) -> RunState:
    t = m.trace
    base: dict[str, object] = {
        "job": job_spec(m, job),
        "now": t.at(tick),
        "started_at": t.at(job.start_tick),
        "remaining_work_hours": Decimal(job.work_ticks) * Decimal(t.gap_seconds) / 3600,
        "tick_hours": t.gap_hours,
    }
    base.update(kw)
    return RunState(**base)  # type: ignore[arg-type]


def moves(m: TraceMarket, job: DeadlineJob, strategy: object) -> list[str]:
    run = run_deadline(m, job, strategy, record=True)  # type: ignore[arg-type]
    out = []
    for mv in run.moves:
        tick, move, key = mv.split(":")
        out.append(f"{tick}:{move}:{key.rsplit('/', 1)[-1] if key else ''}")
    return out


def test_uniform_progress_switches_to_on_demand_when_behind_the_line() -> None:
    # C0 = 4 h due in R0 = 12 h, d = 1 h, spot up t=0..2 and t=9..11 (the module docstring's example).
    m = market({"us-east-1a": "111000000111"}, {"us-east-1a": 1.0}, od=3.0)
    job = DeadlineJob("up", 0, work_ticks=4, deadline_ticks=12, restart_ticks=1)
    seq = moves(m, job, UniformProgress(restart_hours=1.0))
    assert seq == [
        "0:launch:spot",  # changeover
        "1:keep:spot",
        "2:keep:spot",  # 2 h done
        "3:wait:",  # reclaimed; cp 2 >= ep(3) = 1
        "4:wait:",
        "5:wait:",
        "6:wait:",  # cp 2 = ep(6) = 2: not behind yet
        "7:launch:on_demand",  # cp 2 < ep(7) = 2.33: behind the line
        "8:keep:on_demand",
        "9:keep:on_demand",  # spot is back but cp 3 < ep(9 + 2d) = 3.67: hysteresis
    ]
    run = run_deadline(m, job, UniformProgress(restart_hours=1.0))
    assert run.met_deadline and run.finish_hours == 10
    assert run.cost_usd == pytest.approx(3 * 1.0 + 3 * 3.0)
    assert run.preemptions == 1


def test_uniform_progress_returns_to_spot_once_ahead_of_the_hysteresis_line() -> None:
    # 4 h due in 24 h: ep(t) = t / 6. Spot up t=0..2 (cp = 2), down t=3..14, up again from t=15.
    m = market({"us-east-1a": "1" * 3 + "0" * 12 + "1" * 9}, {"us-east-1a": 1.0}, od=3.0)
    job = DeadlineJob("up", 0, work_ticks=4, deadline_ticks=24, restart_ticks=1)
    seq = moves(m, job, UniformProgress(restart_hours=1.0))
    # cp = 2 from t=3; behind once ep(t) = t/6 > 2, i.e. at t=13 -> on-demand (t=13 changeover, t=14 progress);
    # spot back at t=15 with cp = 3 >= ep(15 + 2) = 2.83: back to spot.
    assert "13:launch:on_demand" in seq
    assert "15:launch:spot" in seq
    assert all(not s.startswith(f"{t}:launch") for t in range(3, 13) for s in seq)


def test_safety_net_forces_on_demand_when_no_slack_is_left() -> None:
    m = market({"us-east-1a": "0000"}, {"us-east-1a": 1.0})
    job = DeadlineJob("tight", 0, work_ticks=2, deadline_ticks=4, restart_ticks=1)
    # C + 2d = 4 >= 4 h left: straight to on-demand although it is ahead of the line at t=0.
    plan = decide(UniformProgress(restart_hours=1.0), state_at(m, job, 0), m.book(0))
    assert plan.move is Move.LAUNCH and plan.offering is not None and plan.offering.capacity_type.value == "on_demand"
    assert "safety net" in plan.reason


def test_eager_next_region_leaves_the_preempted_region_even_for_a_pricier_zone() -> None:
    m = market(
        {"us-east-1a": "10", "us-east-1b": "11", "us-west-2a": "11"},
        {"us-east-1a": 1.0, "us-east-1b": 1.1, "us-west-2a": 1.5},
    )
    job = DeadlineJob("j", 0, work_ticks=2, deadline_ticks=2, restart_ticks=0)
    first = decide(EagerNextRegion(), state_at(m, job, 0), m.book(0))
    assert first.offering is not None and first.offering.zone == "us-east-1a"  # cheapest
    pre = (Preemption.of(first.offering, m.trace.at(1)),)
    after = decide(EagerNextRegion(), state_at(m, job, 1, preemptions=pre), m.book(1))
    assert after.offering is not None and after.offering.zone == "us-west-2a"  # R1 blocked, R2 next
    assert after.blocklist == frozenset({"aws/us-east-1"})
    # A tick later the region block is gone (step 3: anywhere), so it would go back to the cheapest.
    later = decide(EagerNextRegion(), state_at(m, job, 1, preemptions=pre, now=m.trace.at(2)), m.book(1))
    assert later.offering is not None and later.offering.zone == "us-east-1b"


def test_next_cheapest_blocklists_the_zone_and_prefers_the_checkpoint_region() -> None:
    m = market(
        {"us-east-1a": "11", "us-east-1b": "11", "us-west-2a": "11"},
        {"us-east-1a": 1.0, "us-east-1b": 1.02, "us-west-2a": 1.0},
    )
    job = DeadlineJob("j", 0, work_ticks=2, deadline_ticks=4, restart_ticks=0)
    pre = (Preemption(m.trace.at(1), "aws", "us-east-1", "us-east-1a"),)
    plan = decide(NextCheapest(), state_at(m, job, 1, preemptions=pre, checkpoint_at=("aws", "us-east-1")), m.book(1))
    # us-east-1a is blocklisted; us-west-2a is 2% cheaper, within the 5% same-region slack: us-east-1b wins.
    assert plan.offering is not None and plan.offering.zone == "us-east-1b"
    assert "aws/us-east-1/us-east-1a" in plan.blocklist
    strict = NextCheapest(same_region_slack=0.0)
    plan = decide(strict, state_at(m, job, 1, preemptions=pre, checkpoint_at=("aws", "us-east-1")), m.book(1))
    assert plan.offering is not None and plan.offering.zone == "us-west-2a"


def test_budget_that_cannot_finish_the_job_pauses_with_the_numbers() -> None:
    m = market({"us-east-1a": "11"}, {"us-east-1a": 1.0}, od=3.0)
    # 10 h of work: the cheapest pool (spot $1/h) needs $10; $55 of $60 already spent leaves $5.
    job = DeadlineJob("b", 0, work_ticks=10, deadline_ticks=20, restart_ticks=0, max_total_usd=Decimal("60"))
    for name in sorted(STRATEGIES):
        plan = decide(make_strategy(name), state_at(m, job, 0, spent_usd=Decimal("55")), m.book(0))
        assert plan.move is Move.PAUSE, name
        assert "$5.00 left" in plan.reason and "$10.00" in plan.reason


def test_budget_that_cannot_pay_the_next_tick_pauses() -> None:
    m = market({"us-east-1a": "00"}, {"us-east-1a": 1.0}, od=3.0)
    job = DeadlineJob("b", 0, work_ticks=2, deadline_ticks=2, restart_ticks=0, max_total_usd=Decimal("4"))
    # On-demand only: the floor ($1/h spot x 2 h = $2) fits $2.50, but an on-demand hour costs $3.
    plan = decide(make_strategy("on_demand"), state_at(m, job, 0, spent_usd=Decimal("1.5")), m.book(0))
    assert plan.move is Move.PAUSE and "costs $3.00" in plan.reason


def test_spend_never_exceeds_max_total_in_a_replay() -> None:
    m = market({"us-east-1a": "1010101010" * 3}, {"us-east-1a": 1.0}, od=3.0)
    job = DeadlineJob("b", 0, work_ticks=12, deadline_ticks=14, restart_ticks=1, max_total_usd=Decimal("20"))
    for name in ("on_demand", "uniform_progress", "overspill", "eager_next_region"):
        kw = {"restart_hours": 1.0} if name in ("uniform_progress", "overspill") else {}
        run = run_deadline(m, job, make_strategy(name, **kw))
        assert run.cost_usd <= 20 and not run.over_budget, name
    assert run_deadline(m, job, make_strategy("on_demand")).paused


def test_overspill_waits_with_slack_and_takes_on_demand_without() -> None:
    m = market({"us-east-1a": "0" * 30}, {"us-east-1a": 1.0}, od=3.0, gap=H // 4)
    roomy = DeadlineJob("roomy", 0, work_ticks=8, deadline_ticks=40, restart_ticks=1)  # 2 h due in 10 h
    plan = decide(Overspill(restart_hours=0.25), state_at(m, roomy, 0), m.book(0))
    assert plan.move is Move.WAIT and "wait" in plan.reason
    tight = DeadlineJob("tight", 0, work_ticks=8, deadline_ticks=12, restart_ticks=1)  # 2 h due in 3 h
    plan = decide(Overspill(restart_hours=0.25), state_at(m, tight, 0), m.book(0))
    assert plan.move is Move.LAUNCH and plan.offering is not None
    assert plan.offering.capacity_type.value == "on_demand"


def test_the_spot_margin_counts_the_time_until_a_reclaim_is_seen() -> None:
    """4 h of work due in 4.75 h (slack 0.75 h), 0.25 h changeover, 15-minute ticks, spot up. The live loop sees a
    reclaim up to a tick after it happens: margin 0.5 + 0.25 = 0.75 h, spot just fits. Due in 4.5 h (slack 0.5 h)
    the live loop takes on-demand, while an executor that reclaims only at its decision points (the simulator)
    sees it at once: margin 0.5 h, spot. With a 30-minute checkpoint interval and no notice such an executor loses
    at most 15 minutes of work (0.75 h); live all 30 minutes and the tick (1.25 h)."""
    m = market({"us-east-1a": "1" * 30}, {"us-east-1a": 1.0}, od=3.0, gap=H // 4)
    ours = Overspill(restart_hours=0.25)
    fits = DeadlineJob("fits", 0, work_ticks=16, deadline_ticks=19, restart_ticks=1)
    assert state_at(m, fits, 0).spot_margin_hours(0.25, 0.0) == 0.75
    assert decide(ours, state_at(m, fits, 0), m.book(0)).offering.capacity_type.value == "spot"  # type: ignore[union-attr]
    thin = DeadlineJob("thin", 0, work_ticks=16, deadline_ticks=18, restart_ticks=1)
    live = decide(ours, state_at(m, thin, 0), m.book(0))
    assert live.offering is not None and live.offering.capacity_type.value == "on_demand"
    seen_at_once = decide(ours, state_at(m, thin, 0, reclaims_at_decisions=True), m.book(0))
    assert seen_at_once.offering is not None and seen_at_once.offering.capacity_type.value == "spot"
    assert state_at(m, thin, 0, reclaims_at_decisions=True).spot_margin_hours(0.25, 0.5) == 0.75
    assert state_at(m, thin, 0).spot_margin_hours(0.25, 0.5) == 1.25


def test_overspill_returns_to_spot_when_it_is_back() -> None:
    m = market({"us-east-1a": "0" * 4 + "1" * 40}, {"us-east-1a": 1.0}, od=3.0, gap=H // 4)
    job = DeadlineJob("j", 0, work_ticks=16, deadline_ticks=40, restart_ticks=1)  # 4 h due in 10 h
    od = m.book(4).get("aws/us-east-1/us-east-1a/p3.2xlarge/on_demand")
    s = state_at(m, job, 4, current=od, remaining_work_hours=Decimal("3.5"))
    plan = decide(Overspill(restart_hours=0.25), s, m.book(4))
    assert plan.move is Move.LAUNCH and plan.migrates
    assert plan.offering is not None and plan.offering.capacity_type.value == "spot"


def test_run_lengths_mean_residual_by_hand() -> None:
    runs = RunLengths.of([6.0, 1.0, 2.0])
    assert runs.hours == (1.0, 2.0, 6.0)
    assert runs.mean_residual(0.0) == pytest.approx(3.0)  # (1 + 2 + 6) / 3
    assert runs.mean_residual(1.5) == pytest.approx(2.5)  # runs past 1.5 h: 2 and 6 -> mean 4, minus 1.5
    assert runs.mean_residual(3.0) == pytest.approx(3.0)  # only the 6 h run
    assert runs.mean_residual(3.0, min_samples=2) is None  # too few runs that long
    assert runs.mean_residual(6.0) is None and RunLengths().mean_residual(0.0) is None


SPOT_A = "aws/us-east-1/us-east-1a/p3.2xlarge/spot"
SPOT_B = "aws/us-east-1/us-east-1b/p3.2xlarge/spot"


def test_overspill_picks_the_spot_pool_whose_up_runs_last_over_a_cheaper_flaky_one() -> None:
    # 15-minute ticks, d = 0.25 h. Zone a ($1.0) has come up for one tick at a time (five past up runs of
    # 0.25 h): expected to stay up 0.25 h more when fresh, not more than its own changeover -> skipped. Zone b
    # ($1.2) has been up throughout: no past runs, so E = 1 / its rate -> ranked by 1.2 x E / (E - 0.25).
    m = market({"us-east-1a": "10" * 6, "us-east-1b": "1" * 12}, {"us-east-1a": 1.0, "us-east-1b": 1.2}, gap=H // 4)
    job = DeadlineJob("j", 10, work_ticks=8, deadline_ticks=40, restart_ticks=1)
    look = m.outlook(10)
    assert look[SPOT_A].up and look[SPOT_A].age_hours == 0 and look[SPOT_A].up_runs.hours == (0.25,) * 5
    assert look[SPOT_B].up and look[SPOT_B].age_hours == 2.5 and look[SPOT_B].up_runs.hours == ()
    ours = Overspill(restart_hours=0.25)
    assert ours.expected_up_hours(state_at(m, job, 10, outlook=look), m.book(10).get(SPOT_A)) == 0.25  # type: ignore[arg-type]
    plan = decide(ours, state_at(m, job, 10, outlook=look), m.book(10))
    assert plan.move is Move.LAUNCH and plan.offering is not None and plan.offering.key == SPOT_B
    # Without the availability history it goes by price and interruption rate alone: the cheaper zone a.
    plan = decide(ours, state_at(m, job, 10), m.book(10))
    assert plan.offering is not None and plan.offering.key == SPOT_A


def test_overspill_expected_up_time_grows_with_age_unless_told_to_ignore_it() -> None:
    # 1-hour ticks; zone a's past up runs lasted 1, 1, 1, 1 and 8 h (each followed by a 1 h outage), and its
    # current run has lasted 2 h: the only past run that long went on 6 h more. Ignoring age: the mean, 2.4 h.
    m = market({"us-east-1a": "10101010111111110111"}, {"us-east-1a": 1.0}, gap=H)
    job = DeadlineJob("j", 19, work_ticks=1, deadline_ticks=1, restart_ticks=0)
    look = m.outlook(19)
    assert look[SPOT_A].up_runs.hours == (1.0, 1.0, 1.0, 1.0, 8.0) and look[SPOT_A].age_hours == 2.0
    state, off = state_at(m, job, 19, outlook=look), m.book(19).get(SPOT_A)
    assert Overspill(min_samples=1).expected_up_hours(state, off) == pytest.approx(6.0)  # type: ignore[arg-type]
    flat = Overspill(min_samples=1, age_dependent=False)
    assert flat.expected_up_hours(state, off) == pytest.approx(2.4)  # type: ignore[arg-type]


@pytest.mark.parametrize(("up_ticks", "returns"), [(16, True), (4, False)])
def test_overspill_leaves_on_demand_only_for_a_spot_pool_expected_to_last(up_ticks: int, returns: bool) -> None:
    # On on-demand at $3/h, a $1/h spot pool comes up fresh. Returning needs E x (3 - 1) >= 2.5 x 2 x 0.25 x 3,
    # i.e. E >= 1.875 h. Past up runs of 4 h (16 ticks) -> E = 4 h: return; of 1 h (4 ticks) -> E = 1 h: stay.
    cycle = "1" * up_ticks + "0" * 4
    bits = cycle * 5 + "1" * 8
    m = market({"us-east-1a": bits}, {"us-east-1a": 1.0}, od=3.0, gap=H // 4)
    now = len(cycle) * 5
    job = DeadlineJob("j", now - 4, work_ticks=8, deadline_ticks=200, restart_ticks=1)  # 2 h due in 50 h
    od = m.book(now).get("aws/us-east-1/us-east-1a/p3.2xlarge/on_demand")
    look = m.outlook(now)
    assert look[SPOT_A].age_hours == 0 and look[SPOT_A].up_runs.hours == (up_ticks / 4,) * 5
    s = state_at(m, job, now, current=od, outlook=look, remaining_work_hours=Decimal("1.75"))
    plan = decide(Overspill(restart_hours=0.25), s, m.book(now))
    if returns:
        assert plan.move is Move.LAUNCH and plan.migrates and plan.offering is not None
        assert plan.offering.key == SPOT_A
    else:
        assert plan.move is Move.KEEP and plan.offering is od


def test_overspill_meets_every_deadline_on_a_flaky_trace() -> None:
    bits = "1101100111000011110000000111101111000011100001111111"
    m = market({"us-east-1a": bits, "us-west-2a": bits[5:] + bits[:5]}, {"us-east-1a": 1.0, "us-west-2a": 0.9}, 3.0)
    for deadline in (9, 14, 24):
        job = DeadlineJob(f"d{deadline}", 0, work_ticks=8, deadline_ticks=deadline, restart_ticks=1)
        run = run_deadline(m, job, Overspill(restart_hours=1.0))
        assert run.met_deadline, deadline


def test_registry_names_and_errors() -> None:
    assert set(STRATEGIES) >= {"on_demand", "eager_next_region", "next_cheapest", "uniform_progress", "overspill"}
    assert make_strategy("uniform_progress", restart_hours=0.5).restart_hours == 0.5  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("nope")


def test_a_preemption_records_zone_and_region_keys() -> None:
    m = market({"us-east-1a": "1"}, {"us-east-1a": 1.0})
    off = m.book(0).get("aws/us-east-1/us-east-1a/p3.2xlarge/spot")
    assert off is not None
    p = Preemption.of(off, m.trace.at(0) + timedelta(minutes=5))
    assert (p.zone_key, p.region_key) == ("aws/us-east-1/us-east-1a", "aws/us-east-1")


@pytest.mark.parametrize("seed", range(6))
def test_first_pool_is_the_head_of_pools_on_random_books(seed: int) -> None:
    """`first_pool` answers what `pools(...)[0]` does (the cheapest fitting pool, ties by key) on books with equal
    prices, zones down, a blocklist and an hourly cap, for every kind of pool."""
    import random

    from federation.strategies import NON_SPOT, first_pool, pools
    from providers.model import CapacityType

    rng = random.Random(seed)
    zones = [f"us-east-1{c}" for c in "abcdef"]
    bits = {z: "".join(rng.choice("10") for _ in range(6)) for z in zones}
    prices = {z: rng.choice([0.9, 1.0, 1.0, 1.3]) for z in zones}
    m = market(bits, prices)
    job = DeadlineJob("j", 0, 3, 6, 0)
    for tick in range(6):
        book = m.book(tick)
        for cap in (None, Decimal("1.0")):
            state = replace(state_at(m, job, tick), job=replace(job_spec(m, job), max_hourly_usd=cap))
            for kinds in (frozenset({CapacityType.SPOT}), NON_SPOT, frozenset(CapacityType)):
                for block in (frozenset(), frozenset({f"aws/us-east-1/{rng.choice(zones)}"})):
                    found = pools(state, book, kinds, block)
                    assert first_pool(state, book, kinds, block) == (found[0] if found else None)
