"""A simulated cloud GPU market: one `SimulatedCloud` per simulated provider of `providers.simulated.catalog`.

Contract: implements `ComputeProvider` and `OfferingSource` (see `providers.base`). Every market quantity is a
pure function of `(seed, pool, hour bucket)` computed with blake2b, never the `random` module, so any number of
processes sharing a seed agree on prices, capacity and preemptions without talking to each other:

- `offerings(now)`: for every zone and instance type an on-demand pool (fixed price) and a spot pool whose price
  is `base_spot x factor`, factor in [0.8, 1.3] and smooth over hours (value noise at 24 h and 6 h periods plus
  a little hourly noise; constant within an hour), available about 90% of hours, with a reclaim rate that moves
  +-15% around the catalog's zone rate. Prices are Decimal quantized to 0.0001 and observed at the hour's start.
- `launch` is idempotent on the launch token (the instance id is derived from it and the record is written with
  `SimStore.insert_if_absent`); a spot launch in an hour without capacity raises `InsufficientCapacity`.
- An instance is PENDING for `startup_minutes`, then RUNNING until its work is done (SUCCEEDED). A spot instance
  is PREEMPTED at `started + Exp(rate)` (drawn from the seed and instance id) if that comes first, and
  `terminate` makes it TERMINATED at the time it was called. State is a function of the record and the clock
  alone, so it survives restarts. Checkpointed work is whole checkpoint intervals of run time.

Cost: an instance's view only changes at a few instants (its start, its end, each checkpoint) or when its record
does (a termination), so each cloud keeps the last view it computed per instance with the interval of clock
times it holds for (`_view`); `get_many` (a tick reads every live instance) recomputes only the instances whose
record changed or that crossed one of those instants, and otherwise costs a dict lookup per instance.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from providers.base import (
    Instance,
    InstanceState,
    InsufficientCapacity,
    InvalidRequest,
    LaunchRequest,
    NotFound,
)
from providers.model import CapacityType, Offering, Price, hours_between, offering_key
from providers.simulated.catalog import CATALOG, SimInstanceType, SimProvider, SimRegion, SimZone
from providers.simulated.store import SimRecord, SimStore

Clock = Callable[[], datetime]

PRICE_QUANTUM = Decimal("0.0001")
SPOT_FACTOR_MIN = 0.8
SPOT_FACTOR_MAX = 1.3
BUCKET_SECONDS = 3600
PRICE_SOURCE = "simulated"
UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FOREVER = datetime.max.replace(tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def stable_unit(seed: int, *parts: object) -> float:
    """A uniform draw in [0, 1), a pure function of the seed and the parts (stable across processes)."""
    text = "\x1f".join(str(p) for p in (seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / 2.0**53  # 53 bits: exact in a float, never 1.0


def stable_hex(*parts: object, length: int = 17) -> str:
    """A stable hex name derived from the parts (for instance ids)."""
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()[:length]


def utc(at: datetime) -> datetime:
    """`at` as tz-aware UTC (a naive time is taken to be UTC already)."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def hour_bucket(at: datetime) -> int:
    """Index of the hour that contains `at` (hours since the Unix epoch)."""
    return int((utc(at) - UNIX_EPOCH).total_seconds() // BUCKET_SECONDS)


def bucket_start(bucket: int) -> datetime:
    return UNIX_EPOCH + timedelta(seconds=bucket * BUCKET_SECONDS)


def hours_delta(hours: Decimal | float) -> timedelta:
    """A timedelta of `hours`, truncated to whole microseconds (deterministic for Decimal input)."""
    return timedelta(microseconds=int(Decimal(hours) * 3_600_000_000))


def _smooth(seed: int, key: str, bucket: int, period: int) -> float:
    """Value noise in [-1, 1]: random knots every `period` hours, cosine-interpolated between them."""
    knot, offset = divmod(bucket, period)
    a = 2.0 * stable_unit(seed, "spot", key, period, knot) - 1.0
    b = 2.0 * stable_unit(seed, "spot", key, period, knot + 1) - 1.0
    w = (1.0 - math.cos(math.pi * offset / period)) / 2.0
    return a + (b - a) * w


def spot_factor(seed: int, key: str, bucket: int) -> float:
    """The spot price multiplier of a pool for an hour, in [0.8, 1.3], drifting slowly."""
    noise = 0.55 * _smooth(seed, key, bucket, 24) + 0.3 * _smooth(seed, key, bucket, 6)
    noise += 0.15 * (2.0 * stable_unit(seed, "spot", key, 1, bucket) - 1.0)
    mid = (SPOT_FACTOR_MIN + SPOT_FACTOR_MAX) / 2.0
    half = (SPOT_FACTOR_MAX - SPOT_FACTOR_MIN) / 2.0
    return min(SPOT_FACTOR_MAX, max(SPOT_FACTOR_MIN, mid + half * noise))


class SimulatedCloud:
    """One simulated cloud provider (see the module docstring for the contract)."""

    def __init__(
        self,
        name: str,
        *,
        seed: int,
        clock: Clock,
        store: SimStore,
        broker_id: str,
        startup_minutes: float = 3.0,
    ) -> None:
        if name not in CATALOG:
            raise ValueError(f"unknown simulated provider {name!r}; known: {sorted(CATALOG)}")
        self.name = name
        self.catalog: SimProvider = CATALOG[name]
        self.seed = seed
        self.clock = clock
        self.store = store
        self.broker_id = broker_id
        self.startup = timedelta(minutes=startup_minutes)
        self._zones: dict[str, tuple[SimRegion, SimZone]] = {
            z.name: (r, z) for r in self.catalog.regions for z in r.zones
        }
        # instance id -> (the record it was computed from, valid from, valid until (exclusive), the view)
        self._views: dict[str, tuple[SimRecord, datetime, datetime, Instance]] = {}

    # ---- market -------------------------------------------------------------------------------------------

    def _pool(self, zone: str, instance_type: str) -> tuple[SimRegion, SimZone, SimInstanceType]:
        located = self._zones.get(zone)
        itype = self.catalog.instance_type(instance_type)
        if located is None or itype is None:
            raise KeyError(f"{self.name} has no pool {zone}/{instance_type}")
        return located[0], located[1], itype

    def _key(self, zone: str, instance_type: str) -> str:
        return f"{self.name}/{zone}/{instance_type}"

    def on_demand_price(self, zone: str, instance_type: str) -> Decimal:
        region, _, itype = self._pool(zone, instance_type)
        return (itype.on_demand_usd * region.price_multiplier).quantize(PRICE_QUANTUM)

    def spot_price(self, zone: str, instance_type: str, now: datetime) -> Decimal:
        region, _, itype = self._pool(zone, instance_type)
        base = itype.on_demand_usd * region.price_multiplier * (Decimal(1) - itype.spot_discount)
        factor = Decimal(repr(spot_factor(self.seed, self._key(zone, instance_type), hour_bucket(now))))
        return (base * factor).quantize(PRICE_QUANTUM)

    def spot_available(self, zone: str, instance_type: str, now: datetime) -> bool:
        """Whether the spot pool has capacity during the hour that contains `now`."""
        _, _, itype = self._pool(zone, instance_type)
        draw = stable_unit(self.seed, "avail", self._key(zone, instance_type), hour_bucket(now))
        return draw < itype.spot_availability

    def spot_interruption_rate(self, zone: str, instance_type: str, now: datetime) -> float:
        """Expected spot reclaims per running hour during the hour that contains `now`."""
        _, sim_zone, itype = self._pool(zone, instance_type)
        base = self.catalog.spot_interruption_base(sim_zone, itype)
        draw = stable_unit(self.seed, "irate", self._key(zone, instance_type), hour_bucket(now))
        return round(base * (0.85 + 0.3 * draw), 4)

    def offerings(self, now: datetime) -> list[Offering]:
        observed = bucket_start(hour_bucket(now))
        out: list[Offering] = []
        for region in self.catalog.regions:
            for zone in region.zones:
                for itype in self.catalog.instance_types:
                    common: dict[str, Any] = {
                        "provider": self.name,
                        "region": region.name,
                        "zone": zone.name,
                        "instance_type": itype.name,
                        "accelerator": itype.accelerator,
                        "accelerator_count": itype.accelerator_count,
                        "gpu_memory_gib": itype.gpu_memory_gib,
                        "vcpus": itype.vcpus,
                        "memory_gib": itype.memory_gib,
                        "egress_usd_per_gb": self.catalog.egress_usd_per_gb,
                        "simulated": True,
                    }
                    od = Price(self.on_demand_price(zone.name, itype.name), PRICE_SOURCE, observed, False)
                    out.append(Offering(capacity_type=CapacityType.ON_DEMAND, price=od, **common))
                    spot = Price(self.spot_price(zone.name, itype.name, now), PRICE_SOURCE, observed, False)
                    out.append(
                        Offering(
                            capacity_type=CapacityType.SPOT,
                            price=spot,
                            interruption_rate_per_hour=self.spot_interruption_rate(zone.name, itype.name, now),
                            available=self.spot_available(zone.name, itype.name, now),
                            **common,
                        )
                    )
        return out

    # ---- instances ----------------------------------------------------------------------------------------

    def instance_id(self, launch_token: str) -> str:
        return "i-" + stable_hex(self.name, launch_token)

    def launch(self, request: LaunchRequest) -> Instance:
        now = utc(self.clock())
        iid = self.instance_id(request.launch_token)
        existing = self.store.get(self.name, iid)
        if existing is not None and existing.launch_token == request.launch_token:
            return self._instance(existing, now)
        off = request.offering
        if off.provider != self.name:
            raise InvalidRequest(f"offering {off.key} is not on {self.name}", provider=self.name)
        try:
            region, zone, itype = self._pool(off.zone, off.instance_type)
        except KeyError as exc:
            raise InvalidRequest(str(exc), provider=self.name) from exc
        if region.name != off.region or off.capacity_type not in (CapacityType.SPOT, CapacityType.ON_DEMAND):
            raise InvalidRequest(f"{self.name} does not offer {off.key}", provider=self.name)
        if request.remaining_work_hours < 0:
            raise InvalidRequest("remaining_work_hours must not be negative", provider=self.name)
        spot = off.capacity_type is CapacityType.SPOT
        if spot and not self.spot_available(zone.name, itype.name, now):
            raise InsufficientCapacity(
                f"no spot capacity for {itype.name} in {zone.name}", provider=self.name, detail=off.key
            )
        key = offering_key(self.name, region.name, zone.name, itype.name, off.capacity_type)
        price = self.spot_price(zone.name, itype.name, now) if spot else self.on_demand_price(zone.name, itype.name)
        data: dict[str, Any] = {
            "offering_key": key,
            "region": region.name,
            "zone": zone.name,
            "instance_type": itype.name,
            "capacity_type": off.capacity_type.value,
            "hourly_usd": str(price),
            "remaining_work_hours": str(request.remaining_work_hours),
            "checkpoint_interval_hours": str(request.checkpoint_interval_hours),
            "interruption_rate_per_hour": self.spot_interruption_rate(zone.name, itype.name, now) if spot else 0.0,
            "resume_from": request.resume_from,
            "tags": request.tags.as_dict(),
            "started_at": (now + self.startup).isoformat(),
        }
        record = SimRecord(self.name, request.launch_token, iid, key, now, data)
        return self._instance(self.store.insert_if_absent(record), now)

    def get(self, instance_id: str) -> Instance:
        rec = self.store.get(self.name, instance_id)
        if rec is None:
            raise NotFound(f"no instance {instance_id} on {self.name}", provider=self.name)
        return self._view(rec, utc(self.clock()))

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, Instance]:
        now = utc(self.clock())
        if len(self._views) > 2 * len(instance_ids) + 100_000:  # bounded: mostly instances long gone
            self._views.clear()
        return {rec.instance_id: self._view(rec, now) for rec in self.store.get_many(self.name, instance_ids)}

    def terminate(self, instance_id: str) -> None:
        rec = self.store.get(self.name, instance_id)
        if rec is None:
            return
        now = utc(self.clock())
        if not self._instance(rec, now).state.terminal:
            self.store.mark_terminated(self.name, instance_id, now)

    def list_instances(self) -> list[Instance]:
        now = utc(self.clock())
        return [
            self._instance(rec, now)
            for rec in self.store.list(self.name)
            if rec.data.get("tags", {}).get("overspill:broker") == self.broker_id
        ]

    def preemption_at(self, rec: SimRecord) -> datetime | None:
        """When a spot instance is reclaimed if it is still running then (None when it never is)."""
        rate = float(rec.data.get("interruption_rate_per_hour", 0.0))
        if rec.data.get("capacity_type") != CapacityType.SPOT.value or rate <= 0:
            return None
        # Keyed by pool and start time, not by the (random) instance id: the same seed replays the same
        # reclaims, and instances started together in one pool are reclaimed together, as in a capacity wave.
        draw = 1.0 - stable_unit(self.seed, "preempt", rec.offering_key, rec.data["started_at"])  # in (0, 1]
        started = utc(datetime.fromisoformat(rec.data["started_at"]))
        return started + hours_delta(-math.log(draw) / rate)

    def _view(self, rec: SimRecord, now: datetime) -> Instance:
        """`_instance(rec, now)`, reused while `rec` is the record it was computed from (the same object: the
        stores hand back the record they hold until it changes) and `now` lies in the interval it holds for."""
        kept = self._views.get(rec.instance_id)
        if kept is not None and kept[0] is rec and kept[1] <= now < kept[2]:
            return kept[3]
        view, until = self._instance_until(rec, now)
        self._views[rec.instance_id] = (rec, now, until, view)
        return view

    def _instance(self, rec: SimRecord, now: datetime) -> Instance:
        return self._instance_until(rec, now)[0]

    def _instance_until(self, rec: SimRecord, now: datetime) -> tuple[Instance, datetime]:
        """The instance as of `now`, and the first instant after `now` at which it may look different (the
        record unchanged): its start, its end, or its next checkpoint; `datetime.max` once it ended."""
        data = rec.data
        started = utc(datetime.fromisoformat(data["started_at"]))
        work = Decimal(data["remaining_work_hours"])
        end, end_state, detail = started + hours_delta(work), InstanceState.SUCCEEDED, "work finished"
        preempt = self.preemption_at(rec)
        if preempt is not None and preempt < end:
            end, end_state, detail = preempt, InstanceState.PREEMPTED, f"spot capacity reclaimed by {self.name}"
        if rec.terminated_at is not None and utc(rec.terminated_at) < end:
            end, end_state, detail = utc(rec.terminated_at), InstanceState.TERMINATED, "terminated on request"
        if end <= now:
            state, ended_at = end_state, end
        else:
            state, ended_at, detail = (InstanceState.PENDING if now < started else InstanceState.RUNNING), None, ""
        run_until = min(now, end)
        started_at = started if run_until >= started else None
        interval = Decimal(data["checkpoint_interval_hours"])
        saved = checkpointed(work, interval, started, run_until, state)
        until = _FOREVER
        if state is InstanceState.PENDING:
            until = min(started, end)
        elif state is InstanceState.RUNNING:
            until = end
            if interval > 0 and saved < work:
                # the next whole interval of run time, less a microsecond (hours_delta truncates): before it the
                # saved work, monotone in run time, cannot have grown
                boundary = started + hours_delta((saved // interval + 1) * interval) - _MICROSECOND
                until = min(until, boundary) if boundary > now else now
        view = Instance(
            id=rec.instance_id,
            provider=self.name,
            offering_key=rec.offering_key,
            launch_token=rec.launch_token,
            state=state,
            tags=dict(data.get("tags", {})),
            launched_at=utc(rec.launched_at),
            started_at=started_at,
            ended_at=ended_at,
            checkpointed_work_hours=saved,
            detail=detail,
        )
        return view, until


def checkpointed(
    work: Decimal, interval: Decimal, started: datetime, run_until: datetime, state: InstanceState
) -> Decimal:
    """Work saved by whole checkpoint intervals of run time (all of it once succeeded; none without interval)."""
    if state is InstanceState.SUCCEEDED:
        return work
    if run_until <= started or interval <= 0:
        return Decimal(0)
    run = hours_between(started, run_until)
    return min(work, (run // interval) * interval)


def default_clouds(
    seed: int, clock: Clock, store: SimStore, broker_id: str, *, startup_minutes: float = 3.0
) -> list[SimulatedCloud]:
    """The three built-in simulated clouds (sim-aws, sim-gcp, sim-azure) sharing one seed, clock and store."""
    return [
        SimulatedCloud(name, seed=seed, clock=clock, store=store, broker_id=broker_id, startup_minutes=startup_minutes)
        for name in CATALOG
    ]
