"""The market a policy sees at one tick of a spot trace: a `PriceBook` of spot and on-demand pools.

Contract: `TraceMarket(trace).book(tick)` holds, for every zone of the trace, a spot pool (available and priced
as the trace says at that tick) and an on-demand pool (always available, the region's catalog price). A spot
pool's interruption rate is what a broker could have known at that tick: reclaims per hour up over the
`rate_window_hours` before it, blended with a prior (`pricing.risk.blend`), refreshed hourly - never the future.
Books are immutable and memoized per tick, so every policy replaying the same trace shares them.
`TraceMarket(trace).outlook(tick)` is each spot pool's availability history at that tick (`PoolOutlook`: up or
down, for how long, the lengths of the up and down runs that ended before it, and its timeline of changes up to
it) - again never the future, as a broker's availability feed would give it.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from federation.simulate.traces import SpotTrace, ZoneSeries
from federation.strategies import PoolOutlook, RunLengths, Timeline
from pricing.book import PriceBook
from pricing.risk import PoolExperience, blend
from providers.accelerators import memory_gib
from providers.model import CapacityType, Offering, Price, offering_key

_FOUR = Decimal("0.0001")


def usd(value: float) -> Decimal:
    """A trace price as the Decimal the pools carry (4 decimals, as the catalogs and probes give them)."""
    return Decimal(repr(value)).quantize(_FOUR)


@dataclass
class TraceMarket:
    trace: SpotTrace
    rate_window_hours: float = 48.0
    prior_rate_per_hour: float = 0.2
    prior_hours: float = 12.0
    _books: dict[int, PriceBook] = field(default_factory=dict, repr=False)
    _rates: dict[tuple[str, int], tuple[float, str]] = field(default_factory=dict, repr=False)
    _runs: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict, repr=False)
    _lengths: dict[tuple[str, int], tuple[RunLengths, RunLengths]] = field(default_factory=dict, repr=False)
    _outlooks: dict[int, dict[str, PoolOutlook]] = field(default_factory=dict, repr=False)
    _timelines: dict[tuple[str, int], Timeline] = field(default_factory=dict, repr=False)

    def outlook(self, tick: int) -> dict[str, PoolOutlook]:
        """Per spot pool key: up or down at `tick`, for how long, and the up/down runs that ended before it."""
        found = self._outlooks.get(tick)
        if found is None:
            t = self.trace
            found = {}
            for z in t.zones:
                runs = self._zone_runs(z)
                i = bisect_right(runs, (tick, len(t) + 1, True)) - 1
                start, _, up = runs[i]
                lengths = self._lengths.get((z.zone, i))
                if lengths is None:
                    ups = [(b - a) * t.gap_hours for a, b, u in runs[:i] if u]
                    downs = [(b - a) * t.gap_hours for a, b, u in runs[:i] if not u]
                    lengths = (RunLengths.of(ups), RunLengths.of(downs))
                    self._lengths[(z.zone, i)] = lengths
                key = offering_key(t.provider, z.region, z.zone, t.instance_type, CapacityType.SPOT)
                found[key] = PoolOutlook(up, (tick - start) * t.gap_hours, lengths[0], lengths[1], self._timeline(z, i))
            self._outlooks[tick] = found
        return found

    def _timeline(self, zone: ZoneSeries, run: int) -> Timeline:
        """The zone's timeline up to its run number `run` (the flips that started runs 1 .. `run`), memoized per
        run so that the ticks of one run share it."""
        found = self._timelines.get((zone.zone, run))
        if found is None:
            runs = self._zone_runs(zone)
            every = self._timelines.get((zone.zone, -1))
            if every is None:  # all the zone's flips once; each run's timeline is a slice sharing its floats
                every = Timeline(
                    self.trace.start_at, runs[0][2], tuple(a * self.trace.gap_seconds for a, _, _ in runs[1:])
                )
                self._timelines[(zone.zone, -1)] = every
            found = Timeline(every.origin, every.first_up, every.flips[:run])
            self._timelines[(zone.zone, run)] = found
        return found

    def _zone_runs(self, zone: ZoneSeries) -> list[tuple[int, int, bool]]:
        runs = self._runs.get(zone.zone)
        if runs is None:
            runs = []
            start = 0
            bits = zone.available
            for i in range(1, len(bits) + 1):
                if i == len(bits) or bits[i] != bits[start]:
                    runs.append((start, i, bits[start]))
                    start = i
            self._runs[zone.zone] = runs
        return runs

    def book(self, tick: int) -> PriceBook:
        found = self._books.get(tick)
        if found is None:
            at = self.trace.at(tick)
            offs = [o for z in self.trace.zones for o in self._pools(z, tick, at)]
            found = PriceBook.build(offs, at)
            self._books[tick] = found
        return found

    def _rate(self, zone: ZoneSeries, tick: int) -> tuple[float, str]:
        per_hour = max(1, round(3600 / self.trace.gap_seconds))
        bucket = tick // per_hour * per_hour
        key = (zone.zone, bucket)
        cached = self._rates.get(key)
        if cached is None:
            window = round(self.rate_window_hours * 3600 / self.trace.gap_seconds)
            drops, hours = self.trace.observed_rate(zone, bucket, window)
            est = blend(self.prior_rate_per_hour, "prior", PoolExperience(hours, drops), self.prior_hours)
            cached = (est.rate_per_hour, est.basis)
            self._rates[key] = cached
        return cached

    def _pools(self, zone: ZoneSeries, tick: int, at: datetime) -> tuple[Offering, Offering]:
        t = self.trace
        rate, basis = self._rate(zone, tick)
        common = {
            "provider": t.provider,
            "region": zone.region,
            "zone": zone.zone,
            "instance_type": t.instance_type,
            "accelerator": t.accelerator,
            "accelerator_count": t.gpus,
            "gpu_memory_gib": memory_gib(t.accelerator),
            "vcpus": 8 * t.gpus,
            "memory_gib": Decimal(61 * t.gpus),
            "simulated": True,
        }
        spot = Offering(
            capacity_type=CapacityType.SPOT,
            price=Price(usd(zone.spot_usd[tick]), t.source, at),
            interruption_rate_per_hour=rate,
            interruption_basis=basis,
            available=zone.available[tick],
            **common,  # type: ignore[arg-type]
        )
        od = Offering(
            capacity_type=CapacityType.ON_DEMAND,
            price=Price(usd(t.on_demand_usd[zone.region]), "catalog", at),
            **common,  # type: ignore[arg-type]
        )
        return spot, od
