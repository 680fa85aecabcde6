"""Placement decisions (federation/placement.py): filters with reasons, expected total cost, ceilings, ties."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from federation.placement import (
    Candidate,
    PlacementContext,
    PlacementParams,
    RejectReason,
    evaluate,
    place,
    quote,
)
from pricing.book import PriceBook
from tests.builders import offering, spec

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def ctx(**kw: object) -> PlacementContext:
    base: dict[str, object] = {"now": NOW, "remaining_work_hours": Decimal("10")}
    base.update(kw)
    return PlacementContext(**base)  # type: ignore[arg-type]


def test_expected_cost_includes_preemption_overhead_and_transfer() -> None:
    off = offering(price="10", rate=0.2, region="us-west-2", zone="us-west-2a")
    params = PlacementParams(checkpoint_interval_hours=0.5, restart_hours=0.1, cloud_startup_hours=0.0)
    c = evaluate(
        spec(checkpoint_size_gb=Decimal("100")),
        off,
        ctx(
            params=params,
            checkpoint_at=("aws", "us-east-1"),
            checkpoint_egress_usd_per_gb=Decimal("0.09"),
            checkpoint_interregion_usd_per_gb=Decimal("0.02"),
        ),
    )
    assert isinstance(c, Candidate)
    # 10 h x (1 + 0.2 x (0.25 + 0.1)) = 10.7 h at $10 = $107, plus 100 GB x $0.02 (AWS inter-region) = $2
    assert abs(c.expected_run_hours - 10.7) < 1e-9
    assert c.transfer_usd == Decimal("2.00")
    assert c.expected_cost_usd == Decimal("109.00")


def test_transfer_to_another_provider_is_priced_at_internet_egress() -> None:
    c = evaluate(
        spec(checkpoint_size_gb=Decimal("100")),
        offering(provider="gcp", region="us-central1", zone="us-central1-a"),
        ctx(
            checkpoint_at=("aws", "us-east-1"),
            checkpoint_egress_usd_per_gb=Decimal("0.09"),
            checkpoint_interregion_usd_per_gb=Decimal("0.02"),
        ),
    )
    assert isinstance(c, Candidate) and c.transfer_usd == Decimal("9.00")


def test_no_transfer_when_checkpoint_is_local() -> None:
    c = evaluate(
        spec(checkpoint_size_gb=Decimal("100")),
        offering(),
        ctx(checkpoint_at=("aws", "us-east-1"), checkpoint_egress_usd_per_gb=Decimal("0.09")),
    )
    assert isinstance(c, Candidate) and c.transfer_usd == 0


def test_rejections_carry_reasons() -> None:
    cases = [
        (offering(accelerator="V100"), spec(), RejectReason.WRONG_ACCELERATOR),
        (offering(count=4), spec(), RejectReason.TOO_FEW_GPUS),
        (offering(gpu_memory=40), spec(min_gpu_memory_gib=80), RejectReason.GPU_MEMORY),
        (offering(vcpus=8), spec(cpus=16), RejectReason.TOO_FEW_CPUS),
        (offering(memory="64"), spec(memory_gib=Decimal("128")), RejectReason.TOO_LITTLE_MEMORY),
        (offering(provider="gcp"), spec(allowed_providers=("aws",)), RejectReason.PROVIDER_NOT_ALLOWED),
        (offering(), spec(allowed_regions=("eu-west-1",)), RejectReason.REGION_NOT_ALLOWED),
        (offering(), spec(preemptible=False), RejectReason.NOT_PREEMPTIBLE),
        (offering(available=False), spec(), RejectReason.UNAVAILABLE),
        (offering(price="50"), spec(max_hourly_usd=Decimal("40")), RejectReason.OVER_HOURLY_CEILING),
        (offering(price="50"), spec(max_total_usd=Decimal("400")), RejectReason.OVER_TOTAL_CEILING),
        (offering(wait=20), spec(deadline_at=NOW + timedelta(hours=12)), RejectReason.MISSES_DEADLINE),
    ]
    for off, job, reason in cases:
        verdict = evaluate(job, off, ctx())
        assert not isinstance(verdict, Candidate), reason
        assert verdict.reason is reason
        assert verdict.message


def test_blocklist_scopes() -> None:
    off = offering()
    for key in ("aws", "aws/us-east-1", "aws/us-east-1/us-east-1a"):
        verdict = evaluate(spec(), off, ctx(blocklist=frozenset({key})))
        assert not isinstance(verdict, Candidate) and verdict.reason is RejectReason.BLOCKLISTED
    assert isinstance(evaluate(spec(), off, ctx(blocklist=frozenset({"aws/us-east-1/us-east-1b"}))), Candidate)


def test_total_ceiling_counts_what_was_already_spent() -> None:
    job = spec(max_total_usd=Decimal("120"))
    off = offering(price="10")
    assert isinstance(evaluate(job, off, ctx(spent_usd=Decimal("0"))), Candidate)
    verdict = evaluate(job, off, ctx(spent_usd=Decimal("30")))
    assert not isinstance(verdict, Candidate) and verdict.reason is RejectReason.OVER_TOTAL_CEILING


def test_cheapest_total_cost_wins_not_cheapest_hourly() -> None:
    risky = offering(zone="us-east-1a", price="9", rate=2.0)  # cheap per hour, reclaimed twice an hour
    steady = offering(zone="us-east-1b", price="10", rate=0.0)
    book = PriceBook.build([risky, steady], NOW)
    best = place(spec(), book, ctx())
    assert best is not None and best.offering.zone == "us-east-1b"
    q = quote(spec(), book, ctx())
    assert [c.offering.zone for c in q.candidates] == ["us-east-1b", "us-east-1a"]


def test_place_matches_quote_and_ties_are_deterministic() -> None:
    offs = [offering(zone=f"us-east-1{z}", price="10") for z in "dcba"]
    offs += [offering(zone=f"us-east-2{z}", region="us-east-2", price=str(9 + i)) for i, z in enumerate("ab")]
    book = PriceBook.build(offs, NOW)
    q = quote(spec(), book, ctx())
    best = place(spec(), book, ctx())
    assert best is not None and q.best is not None
    assert best.offering.key == q.best.offering.key == "aws/us-east-2/us-east-2a/p4d.24xlarge/spot"
    ties = [c.offering.zone for c in q.candidates if c.offering.price.hourly_usd == 10]
    assert ties == sorted(ties)


def test_wait_value_trades_queue_time_against_price() -> None:
    onprem = offering(provider="onprem", capacity="on_prem", price="8", wait=30)
    cloud = offering(price="10")
    book = PriceBook.build([onprem, cloud], NOW)
    cheap_only = place(spec(), book, ctx())
    assert cheap_only is not None and cheap_only.offering.provider == "onprem"
    valued = place(spec(), book, ctx(params=PlacementParams(wait_value_usd_per_gpu_hour=1.0)))
    assert valued is not None and valued.offering.provider == "aws"


def test_wait_reason_and_feasibility() -> None:
    book = PriceBook.build([offering(price="50"), offering(accelerator="V100", instance_type="p3.16xlarge")], NOW)
    q = quote(spec(max_hourly_usd=Decimal("40")), book, ctx())
    assert q.best is None and q.ever_feasible
    assert q.wait_reason().startswith("over_hourly_ceiling")
    q2 = quote(spec(accelerators=("H100",)), book, ctx())
    assert not q2.ever_feasible and q2.other_accelerator_pools == 2


def test_fast_path_agrees_with_full_quote_on_random_catalogs() -> None:
    import random

    rng = random.Random(11)
    accs = ["A100", "V100", "H100", "L4"]
    for round_ in range(30):
        offs = [
            offering(
                provider=rng.choice(["aws", "gcp", "azure"]),
                zone=f"z{i}",
                instance_type=f"t{i}",
                accelerator=rng.choice(accs),
                count=rng.choice([1, 2, 4, 8]),
                capacity=rng.choice(["spot", "on_demand"]),
                price=str(round(rng.uniform(0.5, 40), 4)),
                rate=rng.choice([0.0, 0.05, 0.5, 2.0]),
                wait=rng.choice([0.0, 0.0, 3.0]),
                available=rng.random() > 0.1,
            )
            for i in range(60)
        ]
        book = PriceBook.build(offs, NOW)
        for _ in range(10):
            job = spec(
                accelerators=tuple(rng.sample(accs, rng.randint(1, 3))),
                gpu_count=rng.choice([1, 2, 4, 8]),
                max_total_usd=Decimal(rng.choice([20, 100, 1000])),
                max_hourly_usd=rng.choice([None, Decimal("10")]),
                work_gpu_hours=Decimal(rng.randint(1, 40)),
            )
            c = ctx(remaining_work_hours=job.work_hours, spent_usd=Decimal(rng.choice([0, 10])))
            fast = place(job, book, c)
            full = quote(job, book, c).best
            assert (fast.offering.key if fast else None) == (full.offering.key if full else None), round_


def test_a_pool_no_adapter_can_launch_is_rejected_and_never_placed() -> None:
    cheap_gcp = offering(provider="gcp", region="us-central1", zone="us-central1-a", price="1")
    aws = offering(price="10")
    book = PriceBook.build([cheap_gcp, aws], NOW)
    launchable = ctx(launchable=frozenset({"aws"}))
    best = place(spec(), book, launchable)
    assert best is not None and best.offering.provider == "aws"
    q = quote(spec(), book, launchable)
    [rejected] = q.rejections
    assert rejected.reason is RejectReason.NO_LAUNCH_ADAPTER and not rejected.reason.permanent
    assert "no configured adapter launches there" in rejected.message
    only_gcp = quote(spec(), PriceBook.build([cheap_gcp], NOW), launchable)
    assert only_gcp.best is None and only_gcp.wait_reason().startswith("no_launch_adapter")
    assert place(spec(), book, ctx()).offering.provider == "gcp", "without the set (federation alone): every pool"  # type: ignore[union-attr]


def test_what_an_instance_bills_beside_compute_counts_in_the_cost_and_the_hourly_cap() -> None:
    off = offering(price="10")
    extra = {"aws/spot": Decimal("0.5")}
    plain = evaluate(spec(), off, ctx(params=PlacementParams(cloud_startup_hours=0.0)))
    with_extras = evaluate(spec(), off, ctx(params=PlacementParams(cloud_startup_hours=0.0), extra_hourly_usd=extra))
    assert isinstance(plain, Candidate) and isinstance(with_extras, Candidate)
    assert with_extras.expected_cost_usd - plain.expected_cost_usd == Decimal("5.00")  # 10 h x $0.50
    capped = evaluate(spec(max_hourly_usd=Decimal("10.25")), off, ctx(extra_hourly_usd=extra))
    assert not isinstance(capped, Candidate) and capped.reason is RejectReason.OVER_HOURLY_CEILING
    assert "$10.5/h ($10 compute + $0.5 disk and address)" in capped.message
    on_demand = offering(price="10", capacity="on_demand")
    assert isinstance(
        evaluate(spec(max_hourly_usd=Decimal("10.25")), on_demand, ctx(extra_hourly_usd=extra)), Candidate
    )


def test_indexed_fast_path_agrees_with_full_quote_under_every_filter() -> None:
    """Region and provider allow-lists, non-preemptible jobs, CPU / memory / GPU-memory minimums, launchable and
    checkpoint-store sets, blocklists, checkpoint transfer and extra hourly costs all go through the book's lanes
    and region index; the pool chosen must stay the one the full, unpruned ranking puts first."""
    import random

    rng = random.Random(23)
    accs = ["A100", "V100", "H100"]
    providers = ["aws", "gcp", "azure", "lambda"]
    regions = ["r1", "r2", "r3", "r4", "r5"]
    for round_ in range(25):
        offs = []
        for i in range(150):
            provider = rng.choice(providers)
            capacity = rng.choice(["spot", "spot", "on_demand", "on_prem"])
            vcpus = rng.choice([8, 16, 32, 64])
            offs.append(
                offering(
                    provider=provider,
                    region=rng.choice(regions),
                    zone=f"z{i}",
                    instance_type=rng.choice(["a", "b"]),  # one name, several shapes: lanes must not trust it
                    accelerator=rng.choice(accs),
                    count=rng.choice([1, 2, 4, 8]),
                    gpu_memory=rng.choice([16, 40, 80]),
                    vcpus=vcpus,
                    memory=str(vcpus * rng.choice([2, 4, 8])),
                    capacity=capacity,
                    price=str(round(rng.uniform(0.5, 40), 4)),
                    rate=0.0 if capacity != "spot" else rng.choice([0.0, 0.05, 0.5, 2.0]),
                    egress=rng.choice(["0", "0.09"]),
                    wait=rng.choice([0.0, 0.0, 3.0]) if capacity == "on_prem" else 0.0,
                    available=rng.random() > 0.1,
                )
            )
        book = PriceBook.build(offs, NOW)
        for _ in range(40):
            job = spec(
                accelerators=tuple(rng.sample(accs, rng.randint(1, 3))),
                gpu_count=rng.choice([1, 2, 4, 8]),
                max_total_usd=Decimal(rng.choice([20, 100, 1000, 5000])),
                max_hourly_usd=rng.choice([None, None, Decimal("10")]),
                work_gpu_hours=Decimal(rng.randint(1, 40)),
                allowed_regions=tuple(rng.sample(regions, rng.randint(1, 2))) if rng.random() < 0.3 else (),
                allowed_providers=tuple(rng.sample(providers, rng.randint(1, 2))) if rng.random() < 0.3 else (),
                preemptible=rng.random() < 0.7,
                cpus=rng.choice([0, 0, 16, 64]),
                memory_gib=Decimal(rng.choice([0, 0, 64, 256])),
                min_gpu_memory_gib=rng.choice([0, 0, 40, 80]),
                checkpoint_size_gb=Decimal(rng.choice([0, 50, 500])),
            )
            blocklist = set()
            if rng.random() < 0.3:
                blocklist.add(rng.choice(providers))
            if rng.random() < 0.3:
                blocklist.add(f"{rng.choice(providers)}/{rng.choice(regions)}")
            c = ctx(
                remaining_work_hours=job.work_hours,
                spent_usd=Decimal(rng.choice([0, 10])),
                blocklist=frozenset(blocklist),
                checkpoint_at=(rng.choice(providers), rng.choice(regions)) if rng.random() < 0.5 else None,
                checkpoint_egress_usd_per_gb=Decimal("0.09"),
                checkpoint_interregion_usd_per_gb=Decimal("0.02"),
                launchable=frozenset(rng.sample(providers, 3)) if rng.random() < 0.3 else None,
                no_checkpoint_store=frozenset({rng.choice(providers)}) if rng.random() < 0.2 else frozenset(),
                extra_hourly_usd={"aws/spot": Decimal("0.03"), "gcp/on_demand": Decimal("1.5")}
                if rng.random() < 0.4
                else {},
                params=PlacementParams(wait_value_usd_per_gpu_hour=rng.choice([0.0, 2.0])),
            )
            fast = place(job, book, c)
            full = quote(job, book, c).best
            assert (fast.offering.key if fast else None) == (full.offering.key if full else None), round_


def test_filters_that_defeat_price_order_do_not_make_place_walk_the_catalog(monkeypatch: object) -> None:
    """2,000 cheap pools a job may not use ahead of the few it may: place() judges only the latter."""
    import federation.placement as placement

    cheap = [
        offering(provider="gcp", region=f"g{i % 50}", zone=f"g{i}", price=str(1 + i / 1000), vcpus=8)
        for i in range(2000)
    ]
    usable = [
        offering(provider="aws", region="us-east-1", zone=f"a{i}", price=str(50 + i), capacity="on_demand")
        for i in range(5)
    ]
    book = PriceBook.build(cheap + usable, NOW)
    judged: list[str] = []
    real_judge = placement.judge

    def counting(job: object, off: object, c: object) -> object:
        judged.append(off.key)  # type: ignore[attr-defined]
        return real_judge(job, off, c)  # type: ignore[arg-type]

    monkeypatch.setattr(placement, "judge", counting)  # type: ignore[attr-defined]
    cases = {
        "provider allow-list": (spec(allowed_providers=("aws",)), ctx()),
        "region allow-list": (spec(allowed_regions=("us-east-1",)), ctx()),
        "not preemptible": (spec(preemptible=False), ctx()),
        "CPU minimum": (spec(cpus=64), ctx()),
        "launchable": (spec(), ctx(launchable=frozenset({"aws"}))),
        "blocklisted provider": (spec(), ctx(blocklist=frozenset({"gcp"}))),
    }
    for name, (job, c) in cases.items():
        judged.clear()
        best = place(job, book, c)
        assert best is not None and best.offering.zone == "a0", name
        assert len(judged) <= 5, (name, len(judged))


def test_pools_are_ranked_on_the_unrounded_cost() -> None:
    """1 h of work (+ 3 min start-up): us-east-1a at $10.004/h and us-east-1b at $10.001/h both quote $10.50 to the
    cent, with the same finish time; 1b is cheaper and wins (ranked on rounded cents, the tie went to 1a by name)."""
    a = offering(zone="us-east-1a", price="10.004")
    b = offering(zone="us-east-1b", price="10.001")
    c = ctx(remaining_work_hours=Decimal("1"))
    best = place(spec(), PriceBook.build([a, b], NOW), c)
    assert best is not None and best.offering.zone == "us-east-1b"
    other = evaluate(spec(), a, c)
    assert isinstance(other, Candidate) and other.expected_cost_usd == best.expected_cost_usd == Decimal("10.50")
