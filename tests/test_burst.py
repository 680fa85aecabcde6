"""Burst policy (federation/burst.py): burst yes/no, deadlines, ceilings, team budgets, gangs and returns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from federation.burst import (
    BurstParams,
    CloudJob,
    Verdict,
    WaitingJob,
    decide_burst,
    decide_return,
    plan_bursts,
    quote_cloud,
)
from pricing.book import PriceBook
from tests.builders import offering, spec

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def book() -> PriceBook:
    v100: dict[str, Any] = {"accelerator": "V100", "gpu_memory": 16, "capacity": "on_demand"}
    return PriceBook.build(
        [
            offering(instance_type="p3.2xlarge", count=1, price="3.06", vcpus=8, memory="61", **v100),
            offering(instance_type="p3.8xlarge", count=4, price="12.24", vcpus=32, memory="244", **v100),
            offering(instance_type="p3.16xlarge", count=8, price="24.48", vcpus=64, memory="488", **v100),
            offering(
                provider="onprem",
                region="onprem",
                zone="onprem",
                instance_type="v100x8",
                count=8,
                price="0.10",
                capacity="on_prem",
                accelerator="V100",
                gpu_memory=16,
                wait=6.0,
            ),
        ],
        NOW,
    )


def waiting(gpus: int = 4, work: str = "2", wait: float = 6.0, **kw: object) -> WaitingJob:
    fields: dict[str, object] = {"accelerators": ("V100",), "gpu_count": gpus, "work_gpu_hours": None}
    fields.update({"runtime_hours": Decimal(work), "preemptible": False})
    fields.update(kw)
    return WaitingJob("j1", spec(**fields), Decimal(work), wait)


PARAMS = BurstParams(value_usd_per_gpu_hour=2.0)


def test_burst_when_the_wait_costs_more_than_the_premium() -> None:
    job = waiting(wait=6.0)
    cloud = quote_cloud(job.spec, book(), NOW, PARAMS)
    assert cloud is not None and cloud.offering.instance_type == "p3.8xlarge" and cloud.nodes == 1
    d = decide_burst(job, cloud, NOW, None, PARAMS)
    # premium: $12.24/h x (2 h + 0.05 h startup) = $25.09; wait cost: 6 h x 4 GPUs x $2 = $48.
    assert d.verdict is Verdict.BURST
    assert (d.premium_usd, d.wait_cost_usd) == (Decimal("25.09"), Decimal("48.00"))
    assert "costs $48.00 > cloud premium $25.09" in d.reason


def test_stay_when_the_premium_is_higher() -> None:
    job = waiting(wait=2.0)  # wait cost $16 < $25.09
    d = decide_burst(job, quote_cloud(job.spec, book(), NOW, PARAMS), NOW, None, PARAMS)
    assert d.verdict is Verdict.STAY and "stay on-prem" in d.reason


def test_on_prem_rate_lowers_the_premium() -> None:
    params = BurstParams(value_usd_per_gpu_hour=2.0, onprem_usd_per_gpu_hour=1.5)
    job = waiting(wait=2.0)  # premium $25.09 - 4 x 2 h x $1.5 = $13.09 < $16
    d = decide_burst(job, quote_cloud(job.spec, book(), NOW, params), NOW, None, params)
    assert d.verdict is Verdict.BURST and d.premium_usd == Decimal("13.09")


def test_deadline_at_risk_bursts_even_when_waiting_is_cheap() -> None:
    job = waiting(wait=2.0, deadline_at=NOW + timedelta(hours=3))  # on-prem finish now + 4 h > 3 h
    d = decide_burst(job, quote_cloud(job.spec, book(), NOW, PARAMS), NOW, None, PARAMS)
    assert d.verdict is Verdict.BURST and d.reason.startswith("deadline at risk")


def test_deadline_the_cloud_cannot_make_either_does_not_burst_for_it() -> None:
    job = waiting(wait=2.0, deadline_at=NOW + timedelta(hours=2))  # cloud needs 2.05 h
    d = decide_burst(job, quote_cloud(job.spec, book(), NOW, PARAMS), NOW, None, PARAMS)
    assert d.verdict is Verdict.STAY


def test_team_budget_and_job_ceiling_block_a_burst() -> None:
    job = waiting(wait=6.0)
    cloud = quote_cloud(job.spec, book(), NOW, PARAMS)
    d = decide_burst(job, cloud, NOW, Decimal("20"), PARAMS)
    assert d.verdict is Verdict.STAY and "team budget: $20 left, cloud costs $25.09" in d.reason
    capped = waiting(wait=6.0, max_total_usd=Decimal("25"))
    assert quote_cloud(capped.spec, book(), NOW, PARAMS) is None  # the $25.09 pool breaks the ceiling
    spent = WaitingJob("j1", waiting(max_total_usd=Decimal("30")).spec, Decimal("2"), 6.0, Decimal("10"))
    d = decide_burst(spent, cloud, NOW, None, PARAMS)  # $10 already spent + $25.09 > $30
    assert d.verdict is Verdict.STAY and "would break max_total_usd $30 (spent $10)" in d.reason


def test_hourly_ceiling_leaves_no_cloud_option() -> None:
    job = waiting(wait=6.0, max_hourly_usd=Decimal("10"))
    assert quote_cloud(job.spec, book(), NOW, PARAMS) is None
    d = decide_burst(job, None, NOW, None, PARAMS)
    assert d.verdict is Verdict.STAY and "no cloud pool" in d.reason


def test_no_burst_when_on_prem_starts_it_now() -> None:
    d = decide_burst(waiting(wait=0.0), None, NOW, None, PARAMS)
    assert d.verdict is Verdict.STAY and "on-prem starts it" in d.reason


def test_a_16_gpu_job_bursts_as_a_gang_of_two_8_gpu_nodes() -> None:
    job = waiting(gpus=16, work="1", wait=10.0)
    cloud = quote_cloud(job.spec, book(), NOW, PARAMS)
    assert cloud is not None and cloud.nodes == 2 and cloud.offering.instance_type == "p3.16xlarge"
    assert cloud.cost_usd(1.0) == Decimal("51.41")  # 2 x $24.48 x 1.05 h


def test_return_on_prem_when_pressure_drops() -> None:
    job = waiting(wait=6.0)
    cloud = quote_cloud(job.spec, book(), NOW, PARAMS)
    assert cloud is not None
    launching = CloudJob("j1", job.spec, cloud, Decimal("2"), started=False)
    d = decide_return(launching, NOW, onprem_wait_hours=0.0, params=PARAMS)
    assert d.verdict is Verdict.RETURN and not d.at_next_checkpoint and "now (not started yet)" in d.reason
    running = CloudJob("j1", job.spec, cloud, Decimal("1.5"), started=True)
    d = decide_return(running, NOW, onprem_wait_hours=0.0, params=PARAMS)
    assert d.verdict is Verdict.RETURN and d.at_next_checkpoint
    busy = decide_return(running, NOW, onprem_wait_hours=3.0, params=PARAMS)
    assert busy.verdict is Verdict.KEEP_CLOUD and "still 3.00 h" in busy.reason
    nearly_done = CloudJob("j1", job.spec, cloud, Decimal("0.05"), started=True)
    assert decide_return(nearly_done, NOW, 0.0, PARAMS).verdict is Verdict.KEEP_CLOUD  # saves < $5


def test_plan_bursts_charges_the_team_budget_in_queue_order() -> None:
    b = book()
    jobs = [
        WaitingJob("a", waiting().spec, Decimal("2"), 6.0),
        WaitingJob("b", waiting().spec, Decimal("2"), 6.0),
    ]
    plans = plan_bursts(jobs, lambda j: quote_cloud(j.spec, b, NOW, PARAMS), NOW, {"vision": Decimal("40")}, PARAMS)
    assert [p.verdict for p in plans] == [Verdict.BURST, Verdict.STAY]  # $25.09 then only $14.91 left
    assert "team budget: $14.91 left" in plans[1].reason


def test_plan_bursts_shortens_the_waits_behind_a_burst() -> None:
    b = book()
    big = WaitingJob("big", waiting(gpus=8, work="1").spec, Decimal("1"), 10.0)  # $26.11 vs 10 x 8 x 2 = $160
    small = WaitingJob("small", waiting().spec, Decimal("2"), 6.5)  # alone: $52 > $25.09 -> burst
    plans = plan_bursts([big, small], lambda j: quote_cloud(j.spec, b, NOW, PARAMS), NOW, None, PARAMS, 16)
    # big frees 8 GPU-hours on a 16-GPU cluster: small's wait drops by 0.5 h to 6 h, still worth bursting.
    assert [p.verdict for p in plans] == [Verdict.BURST, Verdict.BURST]
    assert plans[1].wait_cost_usd == Decimal("48.00")
