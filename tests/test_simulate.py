"""Trace-driven simulator (federation/simulate/): the optimum by hand and by brute force, policy replays, the
cluster simulator's baselines on hand-made queues, loaders, reports, and runs on the real shared traces."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from federation.burst import BurstParams
from federation.simulate import run_simulation
from federation.simulate.cluster import BurstPolicy, simulate_cluster
from federation.simulate.deadline import DeadlineJob, run_deadline
from federation.simulate.experiments import (
    EXTRA_MARKETS,
    GCP_MARKETS,
    BurstConfig,
    DeadlineConfig,
    PlacingOnly,
    deadline_experiment,
    deadline_jobs,
    gcp_config,
    halves,
    job_records,
    load_extra_market,
    load_gcp_market,
    matched_spend,
    percentile,
    summarize_cluster,
)
from federation.simulate.loaders import load_availability_json, load_on_demand_prices, load_philly, load_segments_csv
from federation.simulate.market import TraceMarket
from federation.simulate.optimum import optimum_cost
from federation.simulate.report import SimulationReport
from federation.simulate.traces import SpotTrace, TraceJob
from federation.strategies import make_strategy
from pricing.book import PriceBook
from tests.builders import offering
from tests.data import shared_file
from tests.trace_replay import two_zone_trace

POLICIES = ("on_demand", "eager_next_region", "greedy_safety_net", "uniform_progress", "overspill")
WITH_RESTART = ("uniform_progress", "overspill", "greedy_safety_net")


def trace(zones: dict[str, str], prices: dict[str, float], od: float = 3.0) -> SpotTrace:
    return SpotTrace.from_bits(zones, prices, on_demand_usd=od, gap_seconds=3600)


def test_optimum_of_a_three_tick_trace_by_hand() -> None:
    t = trace({"us-east-1a": "101"}, {"us-east-1a": 1.0})
    # 2 h of work in 3 h, no changeover: spot at t=0 and t=2, idle at t=1 -> $2.
    assert optimum_cost(t, DeadlineJob("a", 0, 2, 3, 0)) == pytest.approx(2.0)
    # With a 1 h changeover, 1 h of work: spot t=0 (changeover) + t=1? unavailable; t=2 alone is too short;
    # so on-demand for 2 ticks -> $6.
    assert optimum_cost(t, DeadlineJob("b", 0, 1, 3, 1)) == pytest.approx(6.0)
    t2 = trace({"us-east-1a": "1101"}, {"us-east-1a": 1.0})
    # 2 h of work in 4 h, changeover 1 h: spot t=0-1 (1 h done), reclaimed at t=2 -> on-demand t=2-3: $1+1+3+3.
    assert optimum_cost(t2, DeadlineJob("c", 0, 2, 4, 1)) == pytest.approx(8.0)
    assert optimum_cost(t2, DeadlineJob("d", 0, 4, 4, 1)) == float("inf")


def brute_force(t: SpotTrace, job: DeadlineJob) -> float:
    """Every action sequence (idle, on-demand, spot zone z) in the simulator's model."""
    best = float("inf")
    zones = t.zones
    od = min(t.on_demand_usd.values())
    actions = ["idle", "od", *range(len(zones))]
    for seq in itertools.product(actions, repeat=job.deadline_ticks):
        cost, done, cur, restart = 0.0, 0, None, 0
        for i, a in enumerate(seq):
            tick = job.start_tick + i
            if done >= job.work_ticks:
                break
            if isinstance(cur, int) and not zones[cur].available[tick]:
                cur = None
            if a == "idle":
                cur = None
                continue
            if isinstance(a, int) and not zones[a].available[tick]:
                cost = float("inf")
                break
            if a != cur:
                cur, restart = a, job.restart_ticks
            cost += od if a == "od" else zones[a].spot_usd[tick]  # type: ignore[index]
            if restart:
                restart -= 1
            else:
                done += 1
        if done >= job.work_ticks:
            best = min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_optimum_matches_brute_force_on_random_small_traces(seed: int) -> None:
    rng = random.Random(seed)
    n = 7
    zones = {z: "".join(rng.choice("110") for _ in range(n)) for z in ("us-east-1a", "us-west-2a")}
    prices = {"us-east-1a": [rng.choice([0.8, 1.0, 1.3]) for _ in range(n)], "us-west-2a": 0.9}
    t = trace(zones, prices)  # type: ignore[arg-type]
    for work, restart in ((3, 0), (3, 1), (4, 1), (2, 2)):
        job = DeadlineJob("r", 0, work, n, restart)
        assert optimum_cost(t, job) == pytest.approx(brute_force(t, job)), (seed, work, restart)


def test_every_policy_costs_at_least_the_optimum_and_on_demand_is_exact() -> None:
    rng = random.Random(7)
    bits = {z: "".join(rng.choice("1110") for _ in range(60)) for z in ("us-east-1a", "us-east-1b", "us-west-2a")}
    t = trace(bits, {"us-east-1a": 1.0, "us-east-1b": 1.1, "us-west-2a": 0.9})
    m = TraceMarket(t)
    for deadline in (12, 16, 24):
        job = DeadlineJob(f"d{deadline}", 3, 10, deadline, 1)
        opt = optimum_cost(t, job)
        for name in POLICIES:
            kw = {"restart_hours": 1.0} if name in WITH_RESTART else {}
            run = run_deadline(m, job, make_strategy(name, **kw))
            if name != "eager_next_region":  # SkyPilot's recovery ignores deadlines (and may be cheaper by missing)
                assert run.met_deadline, (name, deadline)
            if run.met_deadline:
                assert run.cost_usd >= opt - 1e-9, (name, deadline)
        od = run_deadline(m, job, make_strategy("on_demand"))
        assert od.cost_usd == pytest.approx((10 + 1) * 3.0)


@pytest.mark.parametrize("seed", range(4))
def test_no_policy_beats_the_optimum_on_random_traces_with_price_changes(seed: int) -> None:
    # The simulator's rules (tick billing, a changeover per launch, reclaims, migrations) never let a policy that
    # met its deadline pay less than the DP optimum, whatever the trace, the prices or the changeover length.
    rng = random.Random(100 + seed)
    n = 90
    bits = {z: "".join(rng.choice("1111100") for _ in range(n)) for z in ("us-east-1a", "us-east-1c", "us-west-2a")}
    prices = {z: [rng.choice([0.9, 1.0, 1.2, 1.6]) for _ in range(n)] for z in bits}
    t = SpotTrace.from_bits(bits, prices, on_demand_usd=3.06, gap_seconds=900)  # type: ignore[arg-type]
    m = TraceMarket(t)
    for restart in (1, 3):
        for deadline in (28, 40):
            job = DeadlineJob("r", 2, 24, deadline, restart)
            opt = optimum_cost(t, job)
            for name in POLICIES:
                kw = {"restart_hours": restart / 4} if name in WITH_RESTART else {}
                run = run_deadline(m, job, make_strategy(name, **kw))
                if run.met_deadline:
                    assert run.cost_usd >= opt - 1e-9, (name, restart, deadline)


def test_outlook_is_built_from_the_past_only() -> None:
    key = "aws/us-east-1/us-east-1a/p3.2xlarge/spot"
    a = TraceMarket(trace({"us-east-1a": "110011100"}, {"us-east-1a": 1.0}))
    b = TraceMarket(trace({"us-east-1a": "110011011"}, {"us-east-1a": 1.0}))  # differs only after tick 5
    look = a.outlook(5)[key]
    assert look == b.outlook(5)[key]
    assert look.up and look.age_hours == 1.0  # up since tick 4
    assert look.up_runs.hours == (2.0,) and look.down_runs.hours == (2.0,)  # ticks 0-1 up, 2-3 down
    down = a.outlook(8)[key]
    assert not down.up and down.age_hours == 1.0 and down.up_runs.hours == (2.0, 3.0)


def test_the_simulator_hands_the_outlook_to_the_policy() -> None:
    seen: list[int] = []

    class Spy:
        name = "spy"

        def decide(self, state: Any, book: PriceBook) -> Any:
            seen.append(len(state.outlook))
            return make_strategy("on_demand").decide(state, book)

    t = trace({"us-east-1a": "1010", "us-west-2a": "1111"}, {"us-east-1a": 1.0, "us-west-2a": 1.0})
    run_deadline(TraceMarket(t), DeadlineJob("j", 0, 2, 4, 0), Spy())
    assert seen == [2, 2]


def test_deadline_experiment_summaries() -> None:
    rng = random.Random(3)
    bits = {z: "".join(rng.choice("1110") for _ in range(120)) for z in ("us-east-1a", "us-west-2a")}
    t = SpotTrace.from_bits(bits, {"us-east-1a": 1.0, "us-west-2a": 0.9}, on_demand_usd=3.0, gap_seconds=1800)
    cfg = DeadlineConfig(work_hours=8, deadlines_hours=(10, 14), restart_hours=0.5, start_every_hours=10)
    rows, results = deadline_experiment(t, cfg)
    names = [r.policy for r in rows]
    assert names == [*POLICIES, "overspill_no_history", "forecast", "optimum"]
    by = {r.policy: r for r in rows}
    assert by["optimum"].cost_vs_optimum == 1.0
    assert by["on_demand"].cost_vs_on_demand == 1.0
    assert all((r.cost_vs_optimum or 0) >= 1 - 1e-9 for r in rows if r.deadline_attainment == 1.0)
    assert by["overspill"].deadline_attainment == 1.0 and by["uniform_progress"].deadline_attainment == 1.0
    assert by["on_demand"].jobs == len(results) == 2 * 4
    # halves: jobs whose window ends by tick 60 (of 120) vs jobs starting at or after it. Starts 0, 20, 40, 60;
    # 10 h = 20 ticks: windows end at 20, 40, 60 (first) and start 60 (second); 14 h = 28 ticks: the job at
    # 40 ends at 68, in neither half.
    assert halves(deadline_jobs(t, cfg), len(t)) == [
        "first",
        "first",
        "first",
        "second",
        "first",
        "first",
        "",
        "second",
    ]
    assert isinstance(by["overspill"].extra["second_half_vs_optimum"], float)
    assert by["on_demand"].extra["met_cost_usd"] == pytest.approx(by["on_demand"].cost_usd)
    # the per-job export: every job, its window and work, and per policy the cost that sums to the table's
    records = json.loads(json.dumps(job_records(t, cfg, results)))
    assert [r["job"] for r in records] == [j.name for j in deadline_jobs(t, cfg)]
    first = records[1]
    assert (first["start"], first["deadline"], first["work_hours"]) == (
        "2023-01-01T10:00:00+00:00",
        "2023-01-01T20:00:00+00:00",
        8.0,
    )
    assert first["half"] == "first" and records[6]["half"] == "neither"
    for name in names[:-1]:
        assert sum(r["policies"][name]["cost_usd"] for r in records) == pytest.approx(by[name].cost_usd)
        met = sum(r["policies"][name]["deadline_met"] for r in records) / len(records)
        assert met == by[name].deadline_attainment
    assert sum(r["optimum_usd"] for r in records) == pytest.approx(by["optimum"].cost_usd)


# --- the cluster simulator --------------------------------------------------------------------------------


def v100_book() -> PriceBook:
    v: dict[str, Any] = {"accelerator": "V100", "gpu_memory": 16, "capacity": "on_demand"}
    return PriceBook.build(
        [
            offering(instance_type="p3.2xlarge", count=1, price="3.06", vcpus=8, memory="61", **v),
            offering(instance_type="p3.8xlarge", count=4, price="12.24", vcpus=32, memory="244", **v),
        ],
        datetime(2026, 4, 2, tzinfo=UTC),
    )


TWO = [TraceJob("a", 0, 4, 2 * 3600), TraceJob("b", 0, 4, 3600)]  # both need the whole 4-GPU cluster


def test_onprem_only_waits_in_fifo_order() -> None:
    run = simulate_cluster(TWO, 4, v100_book(), BurstPolicy("onprem_only"))
    assert run.waits_hours == (0.0, 2.0) and run.cloud_spend_usd == 0


def test_fixed_timeout_bursts_after_two_minutes() -> None:
    run = simulate_cluster(TWO, 4, v100_book(), BurstPolicy("fixed_timeout", timeout_hours=2 / 60))
    assert run.bursts == 1
    assert run.waits_hours[1] == pytest.approx(2 / 60 + 0.05)  # the timeout, then 3 minutes of startup
    assert run.cloud_spend_usd == pytest.approx(12.24 * 1.05)


def test_fixed_order_spills_while_the_cloud_quota_has_room() -> None:
    run = simulate_cluster(TWO, 4, v100_book(), BurstPolicy("fixed_order", cloud_quota_gpus=4))
    assert run.bursts == 1 and run.waits_hours[1] == pytest.approx(0.05)
    full = simulate_cluster(TWO, 4, v100_book(), BurstPolicy("fixed_order", cloud_quota_gpus=2))
    assert full.bursts == 0 and full.waits_hours[1] == pytest.approx(2.0)


def test_overspill_bursts_only_when_the_wait_costs_more_than_the_premium() -> None:
    # b would wait 2 h: 2 h x 4 GPUs x $v against $12.24 x 1.05 h = $12.85.
    yes = simulate_cluster(TWO, 4, v100_book(), BurstPolicy("overspill", params=BurstParams(value_usd_per_gpu_hour=2)))
    assert yes.bursts == 1 and yes.waits_hours[1] == pytest.approx(0.05)
    no = simulate_cluster(TWO, 4, v100_book(), BurstPolicy("overspill", params=BurstParams(value_usd_per_gpu_hour=1)))
    assert no.bursts == 0 and no.waits_hours[1] == pytest.approx(2.0)
    broke = BurstPolicy("overspill", params=BurstParams(value_usd_per_gpu_hour=2), team_budget_usd=Decimal("10"))
    assert simulate_cluster(TWO, 4, v100_book(), broke).bursts == 0


def test_overspill_brings_a_long_job_back_at_its_next_checkpoint() -> None:
    jobs = [TraceJob("a", 0, 4, 3 * 3600), TraceJob("b", 0, 4, 10 * 3600)]
    policy = BurstPolicy("overspill", params=BurstParams(value_usd_per_gpu_hour=16), decide_every_hours=0.5)
    run = simulate_cluster(jobs, 4, v100_book(), policy)
    # b would wait 3 h: 3 x 4 x $16 = $192 > $12.24 x 10.05 h = $123.01, so it bursts at t=0. a ends at 3 h; at
    # the 3 h decision the queue is empty and b has run 2.95 h: it returns at its 3 h checkpoint (t = 3.05 h),
    # billed 3.05 h, then runs its last 7 h + 0.1 h of restart on-prem.
    assert run.bursts == 1 and run.returns == 1
    assert run.cloud_spend_usd == pytest.approx(12.24 * 3.05)
    assert run.makespan_hours == pytest.approx(3.05 + 7.1)


def test_jobs_deadlines_and_percentiles() -> None:
    jobs = [TraceJob(str(i), 0, 4, 3600) for i in range(3)]
    run = simulate_cluster(jobs, 4, v100_book(), BurstPolicy("onprem_only"), deadline_every=1, deadline_factor=2.0)
    # deadlines arrival + 2 h + 0.5 h: the third job ends at 3 h > 2.5 h.
    assert (run.deadline_jobs, run.deadlines_met) == (3, 2)
    assert percentile([0, 1, 2, 3], 50) == 1 and percentile([0, 1, 2, 3], 95) == 3 and percentile([], 95) == 0


def test_matched_spend_picks_ours_at_no_more_spend() -> None:
    runs = [
        simulate_cluster(TWO, 4, v100_book(), BurstPolicy("fixed_timeout", timeout_hours=1.0)),
        simulate_cluster(TWO, 4, v100_book(), BurstPolicy("overspill", params=BurstParams(value_usd_per_gpu_hour=2))),
    ]
    out = matched_spend([summarize_cluster(r) for r in runs])
    assert len(out) == 1 and out[0]["ours"] is not None and out[0]["ours_lower_p95"] is True


# --- loaders and the report -------------------------------------------------------------------------------


def test_segments_csv_resamples_onto_a_grid(tmp_path: Path) -> None:
    csv_file = tmp_path / "seg.csv"
    csv_file.write_text(
        "zone,start_utc,end_utc,ticks,available,spot_price_usd_per_hr\n"
        "us-east-1a,2023-02-15 00:00:00,2023-02-15 00:10:00,3,1,1.1\n"
        "us-east-1a,2023-02-15 00:10:00,2023-02-15 00:30:00,6,0,1.2\n"
        "us-west-2a,2023-02-15 00:00:00,2023-02-15 00:20:00,6,0,0.9\n"
        "us-west-2a,2023-02-15 00:20:00,2023-02-15 00:40:00,6,1,0.95\n"
    )
    t = load_segments_csv(csv_file, {"us-east-1": 3.06, "us-west-2": 3.06}, gap_seconds=300)
    assert len(t) == 6  # the common window is 00:00-00:30
    east, west = t.zones
    assert east.available == (True, True, False, False, False, False)
    assert east.spot_usd == (1.1, 1.1, 1.2, 1.2, 1.2, 1.2)
    assert west.available == (False, False, False, False, True, True)
    with pytest.raises(ValueError, match="on-demand price"):
        load_segments_csv(csv_file, {"us-east-1": 3.06}, gap_seconds=300)


def test_availability_json_philly_and_catalog_loaders(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0, 1, 1]}))
    t = load_availability_json({"us-west-2a": tmp_path / "a.json"}, {"us-west-2a": 0.9}, {"us-west-2": 3.06})
    assert t.gap_seconds == 600 and t.zones[0].available == (True, False, True, True)
    (tmp_path / "p.csv").write_text(
        "#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,10.0,CLOS,1,1,60\n1,70.0,CLOS,2,2,120\n"
    )
    assert load_philly(tmp_path / "p.csv", limit=1, skip=1) == [TraceJob("1", 0.0, 2, 120.0)]
    (tmp_path / "vms.csv").write_text("InstanceType,Price,Region\np3.2xlarge,3.06,us-east-1\nx,1,us-east-1\n")
    assert load_on_demand_prices(tmp_path / "vms.csv", "p3.2xlarge") == {"us-east-1": 3.06}
    with pytest.raises(ValueError, match="not a Philly"):
        load_philly(tmp_path / "a.json")


def test_report_tables_json_and_png(tmp_path: Path) -> None:
    rng = random.Random(5)
    bits = {"us-east-1a": "".join(rng.choice("110") for _ in range(60))}
    t = SpotTrace.from_bits(bits, {"us-east-1a": 1.0}, on_demand_usd=3.0, gap_seconds=3600)
    rows, _ = deadline_experiment(t, DeadlineConfig(work_hours=6, deadlines_hours=(9,), restart_hours=1))
    burst = [summarize_cluster(simulate_cluster(TWO, 4, v100_book(), BurstPolicy(k))) for k in ("onprem_only",)]
    report = SimulationReport(deadline={"synthetic": rows}, burst=burst, burst_setup={"title": "two jobs"})
    text = report.tables()
    assert "Deadline jobs - synthetic" in text and "x optimum" in text and "onprem_only" in text
    assert "Meeting every deadline: " in text
    doc = json.loads(json.dumps(report.to_json(), default=str))
    assert doc["deadline"]["scenarios"]["synthetic"][-1]["policy"] == "optimum"
    pytest.importorskip("matplotlib")
    png = report.write_png(tmp_path / "chart.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the real shared traces --------------------------------------------------------------------------------


@pytest.mark.integration
def test_real_aws_v100_trace_one_job_per_policy() -> None:
    seg = shared_file("spot-probes-skynomad/aws_v100_p3.2xlarge_avail_price_segments_2023-02-15.csv")
    cat = shared_file("catalog/skypilot_v8_aws_vms_pfamily_gpu_subset.csv")
    od = load_on_demand_prices(cat, "p3.2xlarge")
    assert od["us-east-1"] == 3.06
    t = load_segments_csv(seg, od, gap_seconds=300)
    assert len(t.zones) == 9 and len(t) > 8000
    assert all(0.9 <= p <= 1.9 for z in t.zones for p in z.spot_usd[:1000])
    m = TraceMarket(t)
    job = DeadlineJob("48h/52h", 1000, 48 * 12, 52 * 12, 3)
    opt = optimum_cost(t, job)
    runs = {
        n: run_deadline(m, job, make_strategy(n, **({"restart_hours": 0.25} if n in POLICIES[2:] else {})))
        for n in POLICIES
    }
    assert all(r.cost_usd >= opt - 1e-6 for r in runs.values())
    assert runs["overspill"].met_deadline and runs["uniform_progress"].met_deadline
    assert runs["overspill"].cost_usd < runs["on_demand"].cost_usd / 2


@pytest.mark.integration
def test_real_philly_trace_bursting_smoke() -> None:
    jobs = load_philly(shared_file("cluster-traces/philly-rfold/philly_trace_rfold.csv"), limit=800, skip=300)
    assert len(jobs) == 800 and jobs[0].arrival_s == 0 and max(j.gpus for j in jobs) <= 64
    base = simulate_cluster(jobs, 256, v100_book(), BurstPolicy("onprem_only"))
    ours = simulate_cluster(jobs, 256, v100_book(), BurstPolicy("overspill", params=BurstParams(4.0)))
    assert percentile(ours.waits_hours, 95) <= percentile(base.waits_hours, 95)


@pytest.mark.integration
def test_run_simulation_on_the_shared_data_quick() -> None:
    seg = shared_file("spot-probes-skynomad/aws_v100_p3.2xlarge_avail_price_segments_2023-02-15.csv")
    cfg = DeadlineConfig(deadlines_hours=(60.0,), start_every_hours=240.0)
    report = run_simulation(seg.parent.parent, suite="deadline", deadline=cfg)
    assert set(report.deadline_jobs) == set(report.deadline) and len(report.deadline) == 4  # 2 zone sets x notice
    for rows in report.deadline.values():
        by = {r.policy: r for r in rows}
        assert by["overspill"].deadline_attainment == 1.0
        assert (by["overspill"].cost_vs_optimum or 0) >= 1.0
    assert BurstConfig().onprem_gpus == 1024


def test_a_reclaim_loses_the_work_since_the_last_checkpoint_unless_the_notice_lets_the_job_save() -> None:
    """One spot zone ($1) up for ticks 0-5, down 6-7, up again; on-demand $3; 1-hour ticks, no changeover, a
    checkpoint every 4 ticks. 8 h of work due in 14 h. eager_next_region runs spot at t=0..5: 6 ticks of progress,
    checkpointed after 4. Without a notice the reclaim at t=6 loses the 2 unsaved ticks (4 more to do from t=8:
    done at t=12, $10); with AWS's 2-minute notice covering the 60 s save it loses none (done at t=10, $8)."""
    t = trace({"us-east-1a": "111111001111111111111"}, {"us-east-1a": 1.0})
    m = TraceMarket(t)
    greedy = make_strategy("eager_next_region")
    no_notice = run_deadline(m, DeadlineJob("j", 0, 8, 14, 0, checkpoint_ticks=4), greedy, notice_seconds={})
    assert no_notice.lost_hours == 2.0 and no_notice.preemptions == 1
    assert no_notice.finish_hours == 12.0 and no_notice.cost_usd == 10.0  # 6 ticks before, 4 after the reclaim
    saved = run_deadline(m, DeadlineJob("j", 0, 8, 14, 0, checkpoint_ticks=4), greedy)  # AWS: 120 s >= 60 s
    assert saved.lost_hours == 0.0 and saved.finish_hours == 10.0 and saved.cost_usd == 8.0
    slow = run_deadline(m, DeadlineJob("j", 0, 8, 14, 0, checkpoint_ticks=4, save_seconds=300), greedy)
    assert slow.lost_hours == 2.0  # a 5-minute save does not fit in a 2-minute notice
    free = run_deadline(m, DeadlineJob("j", 0, 8, 14, 0), greedy, notice_seconds={})
    assert free.lost_hours == 0.0 and free.cost_usd == 8.0  # no interval: progress saved as it is made


def test_the_deadline_policy_keeps_the_slack_a_reclaim_can_lose() -> None:
    """The policy knows the interval and the notice: the slack it needs before launching spot grows by the
    checkpoint interval when a reclaim can lose that much work. 4 h of work due in 4.5 h (slack 0.5 h), 0.25 h
    changeover, 15-minute ticks, a reclaim seen at the tick it happens: margin 2 x 0.25 = 0.5 h <= 0.5 h -> spot;
    a 30-min interval without notice can lose 15 minutes here (the checkpoint is at most a tick behind a reclaim at
    a tick) and needs 0.75 h -> on-demand; with AWS's notice nothing can be lost -> spot."""
    t = SpotTrace.from_bits({"us-east-1a": "1" * 40}, {"us-east-1a": 1.0}, on_demand_usd=3.0, gap_seconds=900)
    m = TraceMarket(t)
    ours = make_strategy("overspill", restart_hours=0.25)
    job = DeadlineJob("j", 0, 16, 18, 1, checkpoint_ticks=2)
    first = {
        name: run_deadline(m, job, ours, record=True, notice_seconds=notice).moves[0].split(":", 2)[2]
        for name, notice in (("no_notice", {}), ("aws", {"aws": 120.0}))
    }
    assert first["no_notice"].endswith("/on_demand") and first["aws"].endswith("/spot")
    assert (
        run_deadline(m, replace(job, checkpoint_ticks=0), ours, record=True, notice_seconds={})
        .moves[0]
        .endswith("/spot")
    )


def test_greedy_safety_net_takes_spot_while_it_can_and_commits_to_on_demand_in_time() -> None:
    """1-hour ticks, 1 h changeover, 4 h of work due in 8 h, on-demand $3. No spot until t=5: it waits while
    4 + 1 + 1 <= time left (t=0..2), commits to on-demand at t=3 and keeps it when spot comes back: 5 x $3.
    Spot ($1) up from t=0, reclaimed at t=3 with 2 h done: back at t=4 with 2 + 1 + 1 <= 4 h left it takes spot
    again, keeps it (running spot: 2 + 1 <= 3 left at t=5) and finishes at t=7 on spot. With a checkpoint every
    2 h and no notice a reclaim may lose 2 h: after the reclaim at t=3 (nothing unsaved) it waits (idle risks no
    loss), and when spot is back at t=4, 2 + 2 + 1 + 1 > 4 h left: on-demand, done at t=7."""
    greedy = make_strategy("greedy_safety_net", restart_hours=1.0)
    job = DeadlineJob("j", 0, 4, 8, 1)
    late = run_deadline(TraceMarket(trace({"us-east-1a": "00000111111111111"}, {"us-east-1a": 1.0})), job, greedy)
    assert late.met_deadline and late.cost_usd == 15.0 and late.on_demand_hours == 5.0 and late.idle_hours == 3.0
    m = TraceMarket(trace({"us-east-1a": "11101111111111111"}, {"us-east-1a": 1.0}))
    early = run_deadline(m, job, greedy, record=True)
    assert early.met_deadline and early.on_demand_hours == 0.0 and early.finish_hours == 7.0
    lossy = run_deadline(m, replace(job, checkpoint_ticks=2), greedy, record=True, notice_seconds={})
    assert lossy.met_deadline and lossy.lost_hours == 0.0 and lossy.finish_hours == 7.0
    assert lossy.moves[3] == "3:wait:" and lossy.moves[4].endswith("/on_demand")


@pytest.mark.integration
def test_every_extra_market_loads_from_the_shared_data_with_catalog_prices() -> None:
    base = shared_file("catalog/skypilot_v8_aws_vms_pfamily_gpu_subset.csv").parent.parent
    for name, (files, itype, gpus) in EXTRA_MARKETS.items():
        t = load_extra_market(str(base), name)
        assert [z.zone for z in t.zones] == list(files) and t.gap_seconds == 600 and len(t) > 27 * 24 * 5
        assert (t.instance_type, t.gpus) == (itype, gpus)
        assert t.on_demand_usd["us-west-2"] == (3.06 if gpus == 1 else 24.48)
        assert all(0 < z.spot_usd[0] < t.on_demand_usd["us-west-2"] for z in t.zones)
        assert all(any(z.available) and not all(z.available) for z in t.zones)
    report = run_simulation(
        base, suite="markets", deadline=DeadlineConfig(deadlines_hours=(60.0,), start_every_hours=300.0)
    )
    assert len(report.deadline) == 2 * len(EXTRA_MARKETS) + len(GCP_MARKETS)
    for rows in report.deadline.values():
        by = {r.policy: r for r in rows}
        assert by["overspill"].deadline_attainment == by["greedy_safety_net"].deadline_attainment == 1.0


def test_gcp_probe_loader_counts_a_zone_up_when_enough_vms_were_created(tmp_path: Path) -> None:
    from federation.simulate.loaders import load_gcp_probes, load_gcp_zone_prices

    catalog = tmp_path / "gcp.csv"
    catalog.write_text(
        "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice\n"
        "a3-highgpu-1g,26.0,234.0,,,,us-central1,us-central1-a,1.0,0.25\n"
        ",,,H100,1,{},us-central1,us-central1-a,4.0,3.0\n"
        ",,,H100,2,{},us-central1,us-central1-a,8.0,6.0\n"
        "a3-highgpu-1g,26.0,234.0,,,,us-east4,us-east4-a,1.5,0.5\n"  # no H100 row: left out
    )
    prices = load_gcp_zone_prices(catalog, "a3-highgpu-1g", "H100")
    assert prices == {"us-central1-a": ("us-central1", 5.0, 3.25)}
    probes = tmp_path / "probes.csv"
    probes.write_text(
        "scheduled_utc,zone,requested,created,capacity_exhausted\n"
        "2025-10-04T00:10:00Z,us-central1-a,16,16,0\n"
        "2025-10-04T00:20:00Z,us-central1-a,16,3,13\n"
        # 00:30 missing: the 00:20 probe holds
        "2025-10-04T00:40:00Z,us-central1-a,16,0,16\n"
    )
    one = load_gcp_probes(probes, prices)
    assert (one.provider, one.gap_seconds, len(one)) == ("gcp", 600, 4)
    assert one.zones[0].available == (True, True, True, False)
    assert one.on_demand_usd == {"us-central1": 5.0} and one.zones[0].spot_usd[0] == 3.25
    gang = load_gcp_probes(probes, prices, need=16, vms=16)
    assert gang.zones[0].available == (True, False, False, False)
    assert gang.on_demand_usd == {"us-central1": 80.0} and gang.zones[0].spot_usd[0] == 52.0
    with pytest.raises(ValueError, match="no catalog price"):
        load_gcp_probes(probes, {})


@pytest.mark.integration
def test_every_gcp_market_loads_from_the_shared_data_and_its_jobs_fit_the_week() -> None:
    base = shared_file("spot-probes-skynomad/gcp_a3-highgpu-1g_spot_probes_16x.csv").parent.parent
    cfg = gcp_config(DeadlineConfig())
    assert (cfg.work_hours, cfg.deadlines_hours, cfg.start_every_hours) == (12.0, (13.0, 15.0, 17.5), 3.0)
    up: dict[tuple[int, int], float] = {}
    for name, (need, vms, zones) in GCP_MARKETS.items():
        t = load_gcp_market(str(base), name)
        up[(need, len(t.zones))] = sum(sum(z.available) for z in t.zones) / (len(t) * len(t.zones))
        assert t.provider == "gcp" and t.accelerator == "H100" and t.gpus == vms and t.gap_seconds == 600
        assert len(t.zones) == (13 if zones is None else len(zones)) and len(t) > 7 * 24 * 6 - 10
        assert all(0 < z.spot_usd[0] < t.on_demand_usd[z.region] for z in t.zones)
        jobs = deadline_jobs(t, cfg)
        split = halves(jobs, len(t))
        assert split.count("first") > 30 and split.count("second") > 30
    assert up[(16, 13)] < up[(1, 13)] and up[(16, 3)] < up[(1, 3)]  # a 16-VM gang is up less often than one VM


class _Told:
    """A strategy that records the work since the last checkpoint it was told of, per decision."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.unsaved = inner, inner.name, []

    def decide(self, state: Any, book: PriceBook) -> Any:
        self.unsaved.append(state.unsaved_work_hours)
        return self.inner.decide(state, book)

    def prepare(self, *args: Any) -> int:
        return self.inner.prepare(*args) if hasattr(self.inner, "prepare") else 0


@pytest.mark.parametrize("seed", range(4))
def test_moves_at_checkpoints_meet_every_deadline_never_beat_the_optimum_and_wait_for_a_checkpoint(seed: int) -> None:
    """Executed as the live loop executes them (`moves_at_checkpoints`), a running job's moves happen only at a
    decision at most one tick past a checkpoint; in between the job runs on. Deadlines still hold (a deferred move
    keeps a job where the policy had put it with the margin it needed) and no run beats the optimum."""
    rng = random.Random(200 + seed)
    bits = {}
    for z in ("us-east-1a", "us-east-1c", "us-west-2a"):  # runs of 5 min to 4 h: outages the jobs wait out on OD
        out, up = "", rng.random() < 0.5
        while len(out) < 400:
            out += ("1" if up else "0") * rng.choice([1, 3, 8, 20, 48])
            up = not up
        bits[z] = out[:400]
    prices = {"us-east-1a": 1.0, "us-east-1c": 1.3, "us-west-2a": 0.8}
    t = SpotTrace.from_bits(bits, prices, on_demand_usd=3.0, gap_seconds=300)  # changeover 15 min, checkpoint 30
    m = TraceMarket(t)
    moved = 0
    for deadline in (60, 90):
        job = DeadlineJob("r", 100, 48, deadline, 3, checkpoint_ticks=6)
        opt = optimum_cost(t, job)
        for name in ("overspill", "chain_dp"):
            spy = _Told(make_strategy(name, restart_hours=0.25))
            run = run_deadline(m, job, spy, record=True, notice_seconds={}, moves_at_checkpoints=True)
            unsaved = spy.unsaved
            assert run.met_deadline and run.cost_usd >= opt - 1e-9, (name, deadline)
            on = None
            for i, move in enumerate(run.moves):
                _, what, key = move.split(":", 2)
                if what == "launch" and on is not None and key != on:
                    assert unsaved[i] <= t.gap_hours + 1e-9, (name, deadline, i, unsaved[i])
                    moved += 1
                on = key if what in ("launch", "keep") else None
    assert moved > 0  # the traces made the policies move running jobs


def test_a_place_only_policy_keeps_a_running_job_where_the_full_policy_moves_it() -> None:
    """`PlacingOnly` (the `_place_only` variant) asks its policy only about waiting jobs: on on-demand when spot
    comes back the job stays there, where `overspill` returns to spot, at once or (`moves_at_checkpoints`, the
    `_live` variant) at its next checkpoint."""
    m = TraceMarket(two_zone_trace("0" * 6 + "1" * 39, "0" * 45))
    job = DeadlineJob("j", 0, work_ticks=12, deadline_ticks=30, restart_ticks=1, checkpoint_ticks=3)
    ours = make_strategy("overspill", restart_hours=1 / 6)
    full = run_deadline(m, job, ours, notice_seconds={})
    live = run_deadline(m, job, ours, notice_seconds={}, moves_at_checkpoints=True)
    kept = run_deadline(m, job, PlacingOnly(ours), notice_seconds={})
    assert (full.migrations, live.migrations, kept.migrations) == (1, 1, 0)
    assert kept.on_demand_hours == pytest.approx(13 / 6) and kept.cost_usd > live.cost_usd >= full.cost_usd
