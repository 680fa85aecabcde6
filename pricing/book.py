"""The PriceBook: an immutable snapshot of every offering with its current price, indexed for placement.

A snapshot is built once per refresh and then only read, so placement never sees a half-updated catalog.
Offerings are grouped by canonical accelerator name (and within it by GPU count) and sorted by hourly price,
which lets placement skip pools too small for a job and stop scanning a group as soon as price alone rules out
beating the best candidate found so far or fitting the job's remaining budget.

Filters that price order cannot stop on (a provider or region allow-list, a job that must not be preempted, a
CPU, memory or GPU-memory minimum) would otherwise make a decision walk thousands of cheap pools it must reject.
So each group is also split two ways, each part still cheapest first: into lanes of one provider, capacity type
and instance type (one shape: a lane is kept or skipped whole against those filters) and into its pools per
region (a job with a region allow-list walks only those regions' pools).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from providers.model import Offering


@dataclass(frozen=True, slots=True)
class IndexedOffering:
    """An offering with its price as a float for scoring (money stays Decimal in the Offering)."""

    hourly: float
    offering: Offering


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """What every pool of a group offers at best, so a decision can skip a whole group that cannot fit."""

    max_gpu_memory_gib: int
    max_vcpus: int
    max_memory_gib: float
    providers: frozenset[str]
    regions: frozenset[str]
    has_non_spot: bool
    min_gpu_memory_gib: int = 0
    min_vcpus: int = 0
    min_memory_gib: float = 0.0
    min_interruption_rate: float = 0.0
    has_on_prem: bool = True

    @classmethod
    def of(cls, items: tuple[IndexedOffering, ...]) -> GroupSummary:
        offs = [i.offering for i in items]
        return cls(
            max_gpu_memory_gib=max(o.gpu_memory_gib for o in offs),
            max_vcpus=max(o.vcpus for o in offs),
            max_memory_gib=max(float(o.memory_gib) for o in offs),
            providers=frozenset(o.provider for o in offs),
            regions=frozenset(o.region for o in offs),
            has_non_spot=any(o.capacity_type.value != "spot" for o in offs),
            min_gpu_memory_gib=min(o.gpu_memory_gib for o in offs),
            min_vcpus=min(o.vcpus for o in offs),
            min_memory_gib=min(float(o.memory_gib) for o in offs),
            min_interruption_rate=min(o.interruption_rate_per_hour for o in offs),
            has_on_prem=any(o.capacity_type.value == "on_prem" for o in offs),
        )


@dataclass(frozen=True, slots=True)
class Lane:
    """The pools of one group with one provider, capacity type and instance type, cheapest first. The shape
    fields are the largest in the lane (one instance type has one shape), so a lane whose maximum is too small
    for a job holds no pool that fits it; `min_interruption_rate` is the lowest, a floor on the lane's overhead."""

    provider: str
    capacity_type: str
    gpu_memory_gib: int
    vcpus: int
    memory_gib: float
    min_interruption_rate: float
    items: tuple[IndexedOffering, ...]

    @classmethod
    def of(cls, items: tuple[IndexedOffering, ...]) -> Lane:
        first = items[0].offering
        return cls(
            provider=first.provider,
            capacity_type=first.capacity_type.value,
            gpu_memory_gib=max(i.offering.gpu_memory_gib for i in items),
            vcpus=max(i.offering.vcpus for i in items),
            memory_gib=max(float(i.offering.memory_gib) for i in items),
            min_interruption_rate=min(i.offering.interruption_rate_per_hour for i in items),
            items=items,
        )


@dataclass(frozen=True, slots=True)
class PoolGroup:
    """Pools of one accelerator and GPU count, cheapest first, with their summary; the same pools split into
    lanes (ordered by their cheapest pool) and by region, each part cheapest first."""

    accelerator_count: int
    items: tuple[IndexedOffering, ...]
    summary: GroupSummary
    lanes: tuple[Lane, ...] = ()
    by_region: Mapping[str, tuple[IndexedOffering, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, accelerator_count: int, items: tuple[IndexedOffering, ...]) -> PoolGroup:
        """`items` must be cheapest first; every part keeps that order."""
        lanes: dict[tuple[str, str, str], list[IndexedOffering]] = {}
        regions: dict[str, list[IndexedOffering]] = {}
        for item in items:
            off = item.offering
            lanes.setdefault((off.provider, off.capacity_type.value, off.instance_type), []).append(item)
            regions.setdefault(off.region, []).append(item)
        return cls(
            accelerator_count,
            items,
            GroupSummary.of(items),
            tuple(Lane.of(tuple(lane)) for lane in lanes.values()),  # dicts keep insertion: cheapest head first
            {region: tuple(part) for region, part in regions.items()},
        )


@dataclass(frozen=True)
class PriceBook:
    """Current offerings, by key and by accelerator. Build with `PriceBook.build`."""

    built_at: datetime
    by_key: dict[str, Offering]
    by_accelerator: dict[str, tuple[IndexedOffering, ...]]
    feed_observed_at: dict[str, datetime] = field(default_factory=dict)
    by_shape: dict[str, tuple[PoolGroup, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        offerings: Iterable[Offering],
        built_at: datetime,
        feed_observed_at: dict[str, datetime] | None = None,
    ) -> PriceBook:
        by_key: dict[str, Offering] = {}
        for off in offerings:
            by_key[off.key] = off
        groups: dict[str, list[IndexedOffering]] = {}
        for off in by_key.values():
            groups.setdefault(off.accelerator, []).append(IndexedOffering(float(off.price.hourly_usd), off))
        by_acc = {acc: tuple(sorted(items, key=lambda i: (i.hourly, i.offering.key))) for acc, items in groups.items()}
        by_shape: dict[str, tuple[PoolGroup, ...]] = {}
        for acc, items in by_acc.items():
            counts: dict[int, list[IndexedOffering]] = {}
            for item in items:  # already in price order, so each count's list is too
                counts.setdefault(item.offering.accelerator_count, []).append(item)
            by_shape[acc] = tuple(PoolGroup.of(n, tuple(counts[n])) for n in sorted(counts))
        return cls(built_at, by_key, by_acc, dict(feed_observed_at or {}), by_shape)

    def __len__(self) -> int:
        return len(self.by_key)

    def __iter__(self) -> Iterator[Offering]:
        return iter(self.by_key.values())

    def get(self, key: str) -> Offering | None:
        return self.by_key.get(key)

    def for_accelerators(self, names: Iterable[str]) -> list[tuple[IndexedOffering, ...]]:
        return [self.by_accelerator[n] for n in names if n in self.by_accelerator]

    def with_provider(self, provider: str, offerings: Iterable[Offering], built_at: datetime) -> PriceBook:
        """A new snapshot with one provider's offerings replaced (the others shared, unchanged)."""
        kept = (o for o in self.by_key.values() if o.provider != provider)
        return PriceBook.build([*kept, *offerings], built_at, self.feed_observed_at)

    def for_shape(self, names: Iterable[str], min_gpus: int) -> list[PoolGroup]:
        """Price-ordered groups of pools with one of `names` and at least `min_gpus` GPUs (one group per
        accelerator and GPU count), so placement never walks pools too small for the job."""
        return [g for n in names for g in self.by_shape.get(n, ()) if g.accelerator_count >= min_gpus]

    def on_demand_price(self, offering: Offering) -> Offering | None:
        """The on-demand twin of a pool (same provider, zone and type), for counterfactual costs."""
        if offering.capacity_type.value in ("on_demand", "on_prem"):
            return offering
        twin = f"{offering.provider}/{offering.region}/{offering.zone}/{offering.instance_type}/on_demand"
        return self.by_key.get(twin)
