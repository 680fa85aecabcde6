"""Tests for the simulated cloud market: deterministic prices, idempotent launches, state from the clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import pytest

from broker.runtime import Runtime
from broker.store.simstore import DbSimStore
from providers.accelerators import ACCELERATORS
from providers.base import (
    ComputeProvider,
    InstanceState,
    InsufficientCapacity,
    InvalidRequest,
    LaunchRequest,
    NotFound,
    OfferingSource,
)
from providers.model import CapacityType, JobSpec, Offering, Tags
from providers.simulated.catalog import CATALOG
from providers.simulated.market import SimulatedCloud, default_clouds, hours_delta
from providers.simulated.store import InMemorySimStore, SimStore

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def cloud(
    name: str = "sim-aws",
    *,
    seed: int = 7,
    clock: Clock | None = None,
    store: InMemorySimStore | None = None,
    broker_id: str = "b1",
) -> SimulatedCloud:
    return SimulatedCloud(
        name, seed=seed, clock=clock or Clock(), store=store or InMemorySimStore(), broker_id=broker_id
    )


def request(
    off: Offering, token: str, work: str = "2", *, broker_id: str = "b1", interval: str = "0.5"
) -> LaunchRequest:
    spec = JobSpec(
        "acme", "vision", "atlas", "train", "img:1", ("python", "train.py"), (off.accelerator,), 1, Decimal(500)
    )
    return LaunchRequest(
        offering=off,
        launch_token=token,
        tags=Tags(broker_id, "job-1", "plc-1"),
        spec=spec,
        remaining_work_hours=Decimal(work),
        checkpoint_interval_hours=Decimal(interval),
    )


def pick(c: SimulatedCloud, now: datetime, *, capacity: CapacityType, available: bool = True) -> Offering:
    return next(o for o in c.offerings(now) if o.capacity_type is capacity and o.available is available)


def test_implements_the_provider_contracts() -> None:
    c = cloud()
    assert isinstance(c, ComputeProvider)
    assert isinstance(c, OfferingSource)
    assert [x.name for x in default_clouds(1, Clock(), InMemorySimStore(), "b")] == ["sim-aws", "sim-gcp", "sim-azure"]


def test_catalog_uses_canonical_accelerators_and_realistic_shapes() -> None:
    for provider in CATALOG.values():
        assert 2 <= len(provider.regions) <= 3
        for region in provider.regions:
            assert 2 <= len(region.zones) <= 3
            assert Decimal("1.00") <= region.price_multiplier <= Decimal("1.15")
        for itype in provider.instance_types:
            assert itype.accelerator in ACCELERATORS
            assert itype.gpu_memory_gib == ACCELERATORS[itype.accelerator].memory_gib
            assert Decimal("0.60") <= itype.spot_discount <= Decimal("0.75")
    assert CATALOG["sim-aws"].instance_type("p3.2xlarge") is not None
    c = cloud()
    assert c.on_demand_price("us-east-1a", "p3.2xlarge") == Decimal("3.0600")
    assert c.on_demand_price("eu-west-1a", "p3.2xlarge") == Decimal("3.3660")  # 1.10 region multiplier


def test_offerings_cover_every_pool_once() -> None:
    c = cloud("sim-gcp")
    offs = c.offerings(T0 + timedelta(minutes=42))
    provider = CATALOG["sim-gcp"]
    zones = sum(len(r.zones) for r in provider.regions)
    assert len(offs) == zones * len(provider.instance_types) * 2
    assert len({o.key for o in offs}) == len(offs)
    assert Counter(o.capacity_type for o in offs) == {
        CapacityType.ON_DEMAND: len(offs) // 2,
        CapacityType.SPOT: len(offs) // 2,
    }
    for o in offs:
        assert o.simulated and o.provider == "sim-gcp"
        assert o.price.observed_at == T0  # start of the hour bucket, tz-aware
        assert o.price.observed_at.tzinfo is not None
        assert o.price.source == "simulated" and not o.price.estimated
        assert o.egress_usd_per_gb == Decimal("0.12")
        assert o.expected_wait_hours == 0.0


def test_same_seed_same_market_other_seed_differs() -> None:
    now = T0 + timedelta(hours=5, minutes=3)
    assert cloud(seed=11).offerings(now) == cloud(seed=11).offerings(now)
    a = {o.key: o for o in cloud(seed=11).offerings(now)}
    b = {o.key: o for o in cloud(seed=12).offerings(now)}
    assert a.keys() == b.keys()
    assert any(a[k].hourly_usd != b[k].hourly_usd for k in a if a[k].capacity_type is CapacityType.SPOT)
    assert all(a[k].hourly_usd == b[k].hourly_usd for k in a if a[k].capacity_type is CapacityType.ON_DEMAND)


def test_prices_are_bounded_decimals_and_spot_is_cheaper() -> None:
    c = cloud("sim-azure")
    od0 = {o.key: o.hourly_usd for o in c.offerings(T0) if o.capacity_type is CapacityType.ON_DEMAND}
    for hour in range(0, 96, 7):
        offs = {o.key: o for o in c.offerings(T0 + timedelta(hours=hour))}
        for o in offs.values():
            assert isinstance(o.hourly_usd, Decimal)
            assert o.hourly_usd.as_tuple().exponent == -4
            if o.capacity_type is CapacityType.ON_DEMAND:
                assert o.hourly_usd == od0[o.key]
                assert o.interruption_rate_per_hour == 0.0
                continue
            od = offs[o.key.removesuffix("/spot") + "/on_demand"]
            itype = CATALOG["sim-azure"].instance_type(o.instance_type)
            assert itype is not None
            base = od.hourly_usd * (1 - itype.spot_discount)
            assert base * Decimal("0.799") <= o.hourly_usd <= base * Decimal("1.301")
            assert o.hourly_usd < od.hourly_usd
            assert 0.017 <= o.interruption_rate_per_hour <= 0.1725


def test_spot_price_constant_within_an_hour_and_drifts_across_hours() -> None:
    c = cloud()
    zone, itype = "us-west-2b", "p4d.24xlarge"
    assert c.spot_price(zone, itype, T0) == c.spot_price(zone, itype, T0 + timedelta(minutes=59, seconds=59))
    prices = [c.spot_price(zone, itype, T0 + timedelta(hours=h)) for h in range(48)]
    assert len(set(prices)) > 10
    steps = [abs(b - a) / a for a, b in pairwise(prices)]
    assert max(steps) < Decimal("0.25")  # a drift, not white noise over the whole band


def test_spot_is_available_about_nine_hours_in_ten() -> None:
    c = cloud()
    draws = [
        c.spot_available(zone, itype, T0 + timedelta(hours=h))
        for zone in ("us-east-1a", "us-west-2c")
        for itype in ("g5.xlarge", "p3.8xlarge", "p5.48xlarge")
        for h in range(200)
    ]
    assert 0.8 <= sum(draws) / len(draws) <= 0.97


def test_launch_is_idempotent_on_the_token() -> None:
    store = InMemorySimStore()
    c = cloud(store=store)
    off = pick(c, T0, capacity=CapacityType.ON_DEMAND)
    first = c.launch(request(off, "tok-1"))
    second = c.launch(request(off, "tok-1"))
    assert first.id == second.id and first.id.startswith("i-") and len(first.id) == 19
    assert len(store.list("sim-aws")) == 1
    assert c.launch(request(off, "tok-2")).id != first.id
    assert len(store.list("sim-aws")) == 2
    # a second process with the same store returns the same instance, even once spot would be unavailable
    assert cloud(store=store).launch(request(off, "tok-1")) == first


def test_spot_launch_without_capacity_raises_and_records_nothing() -> None:
    clock = Clock()
    store = InMemorySimStore()
    c = cloud(clock=clock, store=store)
    hour = next(h for h in range(500) if any(not o.available for o in c.offerings(T0 + timedelta(hours=h))))
    clock.now = T0 + timedelta(hours=hour, minutes=30)
    off = pick(c, clock.now, capacity=CapacityType.SPOT, available=False)
    with pytest.raises(InsufficientCapacity) as exc:
        c.launch(request(off, "tok-spot"))
    assert exc.value.provider == "sim-aws"
    assert store.list("sim-aws") == []
    twin = next(o for o in c.offerings(clock.now) if o.key == off.key.removesuffix("/spot") + "/on_demand")
    assert c.launch(request(twin, "tok-od")).state is InstanceState.PENDING


def test_launch_rejects_pools_it_does_not_have() -> None:
    aws, gcp = cloud("sim-aws"), cloud("sim-gcp")
    with pytest.raises(InvalidRequest):
        aws.launch(request(pick(gcp, T0, capacity=CapacityType.ON_DEMAND), "tok"))


def test_state_progresses_pending_running_succeeded() -> None:
    clock = Clock()
    c = cloud(clock=clock)
    off = pick(c, T0, capacity=CapacityType.ON_DEMAND)
    inst = c.launch(request(off, "tok", work="2"))
    started = T0 + timedelta(minutes=3)
    assert inst.state is InstanceState.PENDING and inst.started_at is None and inst.launched_at == T0
    assert inst.offering_key == off.key and inst.tags["overspill:broker"] == "b1"
    clock.now = started + timedelta(hours=1, minutes=10)
    running = c.get(inst.id)
    assert running.state is InstanceState.RUNNING and running.started_at == started and running.ended_at is None
    assert running.checkpointed_work_hours == Decimal("1.0")
    clock.now = started + timedelta(hours=2) - timedelta(microseconds=1)
    assert c.get(inst.id).state is InstanceState.RUNNING
    clock.now = started + timedelta(hours=2)
    done = c.get(inst.id)
    assert done.state is InstanceState.SUCCEEDED and done.ended_at == started + timedelta(hours=2)
    assert done.checkpointed_work_hours == Decimal("2")


def test_spot_instance_is_preempted_with_checkpointed_work() -> None:
    clock = Clock()
    store = InMemorySimStore()
    c = cloud("sim-azure", clock=clock, store=store)
    spots = [o for o in c.offerings(T0) if o.capacity_type is CapacityType.SPOT and o.available]
    off = max(spots, key=lambda o: o.interruption_rate_per_hour)
    assert off.interruption_rate_per_hour > 0.1
    inst = c.launch(request(off, "tok-preempt", work="300", interval="0.25"))
    clock.now = T0 + timedelta(hours=2000)
    gone = c.get(inst.id)
    assert gone.state is InstanceState.PREEMPTED
    assert gone.started_at is not None and gone.ended_at is not None
    assert gone.started_at < gone.ended_at < gone.started_at + timedelta(hours=300)
    saved = gone.checkpointed_work_hours
    assert saved is not None and saved < Decimal(300)
    assert saved % Decimal("0.25") == 0
    run = (gone.ended_at - gone.started_at).total_seconds() / 3600
    assert float(saved) <= run < float(saved) + 0.25
    # just before the reclaim it was running; another process computes the same reclaim time
    clock.now = gone.ended_at - timedelta(seconds=1)
    assert c.get(inst.id).state is InstanceState.RUNNING
    clock.now = T0 + timedelta(hours=2000)
    assert cloud("sim-azure", clock=clock, store=store).get(inst.id) == gone


def test_on_demand_is_never_preempted() -> None:
    clock = Clock()
    c = cloud(clock=clock)
    inst = c.launch(request(pick(c, T0, capacity=CapacityType.ON_DEMAND), "tok", work="1000"))
    clock.now = T0 + timedelta(hours=999)
    assert c.get(inst.id).state is InstanceState.RUNNING


def test_terminate_converges() -> None:
    clock = Clock()
    c = cloud(clock=clock)
    c.terminate("i-does-not-exist")  # unknown is success
    off = pick(c, T0, capacity=CapacityType.ON_DEMAND)
    inst = c.launch(request(off, "tok-a", work="5"))
    clock.now = T0 + timedelta(hours=1, minutes=33)
    c.terminate(inst.id)
    stopped = c.get(inst.id)
    assert stopped.state is InstanceState.TERMINATED and stopped.ended_at == clock.now
    assert stopped.checkpointed_work_hours == Decimal("1.5")
    clock.now += timedelta(hours=1)
    c.terminate(inst.id)  # twice is fine and changes nothing
    assert c.get(inst.id) == stopped
    # terminating a finished instance leaves it finished; terminating before start means it never started
    done = c.launch(request(off, "tok-b", work="0.5"))
    clock.now += timedelta(hours=1)
    c.terminate(done.id)
    assert c.get(done.id).state is InstanceState.SUCCEEDED
    early = c.launch(request(off, "tok-c"))
    c.terminate(early.id)
    early_view = c.get(early.id)
    assert early_view.state is InstanceState.TERMINATED and early_view.started_at is None
    assert early_view.checkpointed_work_hours == 0


def test_get_unknown_raises_not_found() -> None:
    with pytest.raises(NotFound):
        cloud().get("i-0123456789abcdef0")


def test_list_returns_only_this_brokers_instances_on_this_provider() -> None:
    store = InMemorySimStore()
    ours, theirs = cloud(store=store, broker_id="b1"), cloud(store=store, broker_id="b2")
    gcp = cloud("sim-gcp", store=store, broker_id="b1")
    off = pick(ours, T0, capacity=CapacityType.ON_DEMAND)
    a = ours.launch(request(off, "tok-1", broker_id="b1"))
    b = theirs.launch(request(off, "tok-2", broker_id="b2"))
    g = gcp.launch(request(pick(gcp, T0, capacity=CapacityType.ON_DEMAND), "tok-3", broker_id="b1"))
    assert [i.id for i in ours.list_instances()] == [a.id]
    assert [i.id for i in theirs.list_instances()] == [b.id]
    assert [i.id for i in gcp.list_instances()] == [g.id]


def _walk(store: SimStore, fresh_store: Callable[[], SimStore]) -> None:
    """A cloud that reuses its views answers `get_many` and `get` exactly as a fresh one (no views kept, on
    `fresh_store()`) at every instant: each side of every start, checkpoint and end, after a termination, and with
    the clock moved back."""
    clock = Clock()
    kept = cloud("sim-azure", clock=clock, store=store)  # type: ignore[arg-type]
    spot = max(
        (o for o in kept.offerings(T0) if o.capacity_type is CapacityType.SPOT and o.available),
        key=lambda o: o.interruption_rate_per_hour,
    )
    on_demand = pick(kept, T0, capacity=CapacityType.ON_DEMAND)
    shapes = [(on_demand, "3", "0.25"), (on_demand, "2", "0"), (on_demand, "1.5", "0.3333"), (spot, "200", "0.1")]
    launched = [kept.launch(request(o, f"walk-{n}", work, interval=every)) for n, (o, work, every) in enumerate(shapes)]
    ids = [i.id for i in launched]
    started = T0 + timedelta(minutes=3)
    instants = {T0, started, started + timedelta(hours=1, minutes=30)}
    for (_, work, every), inst in zip(shapes, launched, strict=True):
        step, k = Decimal(every) or Decimal(work), Decimal(0)
        while k <= min(Decimal(work), Decimal(4)):
            instants.add(started + hours_delta(k))
            k += step
        clock.now = T0 + timedelta(hours=2000)
        ended = kept.get(inst.id).ended_at
        if ended is not None and ended < T0 + timedelta(hours=6):
            instants.add(ended)
    instants |= {t + d for t in list(instants) for d in (timedelta(microseconds=-1), timedelta(microseconds=1))}
    times = sorted(instants) + sorted(instants, reverse=True)[::3]
    for n, at in enumerate(times):
        clock.now = at
        if n == len(times) // 2:
            kept.terminate(ids[0])  # the record changes: its view is recomputed
        fresh = cloud("sim-azure", clock=clock, store=fresh_store())  # type: ignore[arg-type]
        assert kept.get_many(ids) == fresh.get_many(ids), at
        assert kept.get(ids[2]) == fresh.get(ids[2]), at
    clock.now = T0 + timedelta(hours=2000)
    assert kept.get_many(ids) == cloud("sim-azure", clock=clock, store=fresh_store()).get_many(ids)  # type: ignore[arg-type]
    assert kept.get(ids[0]).state is InstanceState.TERMINATED


def test_views_are_reused_only_while_nothing_changed() -> None:
    store = InMemorySimStore()
    _walk(store, lambda: store)


def test_views_are_reused_only_while_nothing_changed_on_the_database_store(rt: Runtime) -> None:
    _walk(DbSimStore(rt.engine), lambda: DbSimStore(rt.engine))
