"""Trace values the simulator replays: spot availability and price on a uniform tick grid, and cluster jobs.

Contract: a `SpotTrace` holds, for each zone of one instance type, one availability bit and one spot price per
tick of `gap_seconds`, from `start_at`, plus the on-demand price per region. Real traces come in as segments of
irregular probes (`resample`); tests build small ones by hand with `SpotTrace.from_bits`. A `TraceJob` is one job
of a cluster trace (arrival, GPUs, duration). Nothing here reads files (see `federation.simulate.loaders`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

EPOCH = datetime(2023, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of one zone's probes with constant availability and price (times in epoch seconds)."""

    start: float
    end: float
    available: bool
    spot_usd: float


@dataclass(frozen=True, slots=True)
class ZoneSeries:
    """One zone on the grid: `available[i]` and `spot_usd[i]` hold during tick i."""

    zone: str
    region: str
    available: tuple[bool, ...]
    spot_usd: tuple[float, ...]


@dataclass(frozen=True)
class SpotTrace:
    """Spot availability and prices of one instance type in several zones, on a uniform grid."""

    start_at: datetime
    gap_seconds: int
    zones: tuple[ZoneSeries, ...]
    on_demand_usd: Mapping[str, float]
    provider: str = "aws"
    instance_type: str = "p3.2xlarge"
    accelerator: str = "V100"
    gpus: int = 1
    source: str = "synthetic"
    _up_prefix: dict[str, list[int]] = field(default_factory=dict, repr=False, compare=False)
    _drop_prefix: dict[str, list[int]] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.zones[0].available) if self.zones else 0

    @property
    def gap_hours(self) -> float:
        return self.gap_seconds / 3600

    def at(self, tick: int) -> datetime:
        return self.start_at + timedelta(seconds=tick * self.gap_seconds)

    def only(self, zones: Sequence[str]) -> SpotTrace:
        """The same trace restricted to `zones` (kept in the given order)."""
        by = {z.zone: z for z in self.zones}
        missing = [z for z in zones if z not in by]
        if missing:
            raise ValueError(f"zones not in the trace: {', '.join(missing)}")
        return SpotTrace(
            self.start_at,
            self.gap_seconds,
            tuple(by[z] for z in zones),
            self.on_demand_usd,
            self.provider,
            self.instance_type,
            self.accelerator,
            self.gpus,
            self.source,
        )

    def observed_rate(self, zone: ZoneSeries, tick: int, window_ticks: int) -> tuple[float, float]:
        """Reclaims and hours up in `zone` over the `window_ticks` before `tick` (what a broker could have seen)."""
        up = self._up_prefix.get(zone.zone)
        if up is None:
            up, drops = [0], [0]
            prev = False
            for bit in zone.available:
                up.append(up[-1] + bit)
                drops.append(drops[-1] + (prev and not bit))
                prev = bit
            self._up_prefix[zone.zone] = up
            self._drop_prefix[zone.zone] = drops
        drops = self._drop_prefix[zone.zone]
        lo = max(0, tick - window_ticks)
        return float(drops[tick] - drops[lo]), (up[tick] - up[lo]) * self.gap_hours

    @classmethod
    def from_bits(
        cls,
        zones: Mapping[str, str],
        prices: Mapping[str, float | Sequence[float]],
        on_demand_usd: float,
        gap_seconds: int = 3600,
        start_at: datetime = EPOCH,
    ) -> SpotTrace:
        """A hand-made trace: `zones` maps `region-zone` names to strings of 0/1 (one per tick)."""
        series = []
        for name, bits in zones.items():
            p = prices[name]
            spot = tuple(float(p) for _ in bits) if isinstance(p, int | float) else tuple(float(x) for x in p)
            if len(spot) != len(bits):
                raise ValueError(f"{name}: {len(bits)} availability bits but {len(spot)} prices")
            series.append(ZoneSeries(name, region_of(name), tuple(b == "1" for b in bits), spot))
        regions = {s.region for s in series}
        return cls(start_at, gap_seconds, tuple(series), {r: on_demand_usd for r in regions})


def region_of(zone: str) -> str:
    """`us-east-1a` -> `us-east-1` (AWS zone names end in one letter)."""
    return zone[:-1] if zone and zone[-1].isalpha() and zone[-2:-1].isdigit() else zone


def resample(
    segments: Mapping[str, Sequence[Segment]],
    gap_seconds: int,
    on_demand_usd: Mapping[str, float],
    source: str,
    **kind: str | int,
) -> SpotTrace:
    """Put each zone's segments on one grid over the window every zone covers. A tick takes the state of the
    segment holding its start instant (a probe gap counts as unavailable)."""
    if not segments:
        raise ValueError("no zones")
    t0 = max(s[0].start for s in segments.values())
    t1 = min(s[-1].end for s in segments.values())
    n = int((t1 - t0) // gap_seconds)
    if n <= 0:
        raise ValueError("the zones share no common time window")
    series = []
    for zone in sorted(segments):
        segs = segments[zone]
        starts = [s.start for s in segs]
        avail: list[bool] = []
        price: list[float] = []
        last_price = segs[0].spot_usd
        for i in range(n):
            t = t0 + i * gap_seconds
            j = bisect.bisect_right(starts, t) - 1
            seg = segs[j] if j >= 0 else None
            inside = seg is not None and seg.start <= t < seg.end
            avail.append(bool(inside and seg is not None and seg.available))
            if inside and seg is not None:
                last_price = seg.spot_usd
            price.append(last_price)
        series.append(ZoneSeries(zone, region_of(zone), tuple(avail), tuple(price)))
    start = datetime.fromtimestamp(t0, tz=UTC)
    return SpotTrace(start, gap_seconds, tuple(series), dict(on_demand_usd), source=source, **kind)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a cluster trace: arrival (seconds from the trace start), GPUs, actual duration (seconds)."""

    id: str
    arrival_s: float
    gpus: int
    duration_s: float
