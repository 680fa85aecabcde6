"""The built-in simulated cloud catalog, as plain data: providers, regions, zones and GPU instance types.

Contract: `CATALOG` maps a simulated provider name ("sim-aws", "sim-gcp", "sim-azure") to a frozen
`SimProvider`. Shapes and on-demand list prices are close to the real clouds' (USD per hour, in the provider's
cheapest region); a region's `price_multiplier` (1.00-1.15) scales them. Spot pools start from
`on_demand x (1 - spot_discount)` (discounts 60-75%) and are reclaimed about `spot_interruption_rate` times per
running hour (0.02-0.15), scaled per zone by `interruption_factor` and clamped to that range by
`SimProvider.spot_interruption_base`. `spot_availability` is the share of hours a spot pool has capacity.
Accelerator names are canonical (`providers.accelerators`); `gpu_memory_gib` is per GPU. Nothing here moves
with time: the market dynamics live in `providers.simulated.market`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from providers.accelerators import memory_gib

MIN_SPOT_INTERRUPTION_RATE = 0.02
MAX_SPOT_INTERRUPTION_RATE = 0.15


@dataclass(frozen=True, slots=True)
class SimInstanceType:
    name: str
    accelerator: str
    accelerator_count: int
    vcpus: int
    memory_gib: Decimal
    on_demand_usd: Decimal
    spot_discount: Decimal
    spot_interruption_rate: float
    spot_availability: float = 0.9

    @property
    def gpu_memory_gib(self) -> int:
        """Memory of one GPU of this type."""
        return memory_gib(self.accelerator)


@dataclass(frozen=True, slots=True)
class SimZone:
    name: str
    interruption_factor: float = 1.0


@dataclass(frozen=True, slots=True)
class SimRegion:
    name: str
    price_multiplier: Decimal
    zones: tuple[SimZone, ...]


@dataclass(frozen=True, slots=True)
class SimProvider:
    name: str
    egress_usd_per_gb: Decimal
    regions: tuple[SimRegion, ...]
    instance_types: tuple[SimInstanceType, ...]

    def region(self, name: str) -> SimRegion | None:
        return next((r for r in self.regions if r.name == name), None)

    def zone(self, region: str, zone: str) -> SimZone | None:
        reg = self.region(region)
        return next((z for z in reg.zones if z.name == zone), None) if reg else None

    def instance_type(self, name: str) -> SimInstanceType | None:
        return next((t for t in self.instance_types if t.name == name), None)

    def spot_interruption_base(self, zone: SimZone, itype: SimInstanceType) -> float:
        """The zone's base spot reclaim rate for a type, within [0.02, 0.15] per hour."""
        rate = itype.spot_interruption_rate * zone.interruption_factor
        return min(MAX_SPOT_INTERRUPTION_RATE, max(MIN_SPOT_INTERRUPTION_RATE, rate))


def _t(
    name: str,
    acc: str,
    count: int,
    vcpus: int,
    mem: str,
    usd: str,
    discount: str,
    rate: float,
    availability: float = 0.9,
) -> SimInstanceType:
    return SimInstanceType(name, acc, count, vcpus, Decimal(mem), Decimal(usd), Decimal(discount), rate, availability)


def _r(name: str, multiplier: str, zones: tuple[tuple[str, float], ...]) -> SimRegion:
    return SimRegion(name, Decimal(multiplier), tuple(SimZone(z, f) for z, f in zones))


SIM_AWS = SimProvider(
    name="sim-aws",
    egress_usd_per_gb=Decimal("0.09"),
    regions=(
        _r("us-east-1", "1.00", (("us-east-1a", 1.0), ("us-east-1b", 1.2), ("us-east-1c", 0.85))),
        _r("us-west-2", "1.00", (("us-west-2a", 0.9), ("us-west-2b", 1.1), ("us-west-2c", 1.0))),
        _r("eu-west-1", "1.10", (("eu-west-1a", 0.95), ("eu-west-1b", 1.15))),
    ),
    instance_types=(
        _t("g4dn.xlarge", "T4", 1, 4, "16", "0.526", "0.70", 0.03, 0.95),
        _t("g5.xlarge", "A10G", 1, 4, "16", "1.006", "0.68", 0.04, 0.93),
        _t("g5.12xlarge", "A10G", 4, 48, "192", "5.672", "0.66", 0.06),
        _t("p3.2xlarge", "V100", 1, 8, "61", "3.06", "0.70", 0.05, 0.92),
        _t("p3.8xlarge", "V100", 4, 32, "244", "12.24", "0.70", 0.07),
        _t("p4d.24xlarge", "A100", 8, 96, "1152", "32.7726", "0.62", 0.11, 0.86),
        _t("p5.48xlarge", "H100", 8, 192, "2048", "98.32", "0.60", 0.14, 0.82),
    ),
)

SIM_GCP = SimProvider(
    name="sim-gcp",
    egress_usd_per_gb=Decimal("0.12"),
    regions=(
        _r("us-central1", "1.00", (("us-central1-a", 1.0), ("us-central1-b", 0.9), ("us-central1-c", 1.2))),
        _r("us-east4", "1.05", (("us-east4-a", 1.1), ("us-east4-b", 0.95), ("us-east4-c", 1.0))),
        _r("europe-west4", "1.12", (("europe-west4-a", 0.9), ("europe-west4-b", 1.15))),
    ),
    instance_types=(
        _t("g2-standard-4", "L4", 1, 4, "16", "0.7069", "0.67", 0.04, 0.94),
        _t("g2-standard-48", "L4", 4, 48, "192", "4.0014", "0.67", 0.05),
        _t("a2-highgpu-1g", "A100", 1, 12, "85", "3.6733", "0.65", 0.07, 0.9),
        _t("a2-highgpu-4g", "A100", 4, 48, "340", "14.6932", "0.65", 0.08),
        _t("a2-highgpu-8g", "A100", 8, 96, "680", "29.3864", "0.65", 0.09, 0.87),
        _t("a2-ultragpu-1g", "A100-80GB", 1, 12, "170", "5.0688", "0.65", 0.08),
        _t("a3-highgpu-8g", "H100", 8, 208, "1872", "88.2522", "0.62", 0.13, 0.82),
    ),
)

SIM_AZURE = SimProvider(
    name="sim-azure",
    egress_usd_per_gb=Decimal("0.087"),
    regions=(
        _r("eastus", "1.00", (("eastus-1", 1.0), ("eastus-2", 1.15), ("eastus-3", 0.9))),
        _r("westus2", "1.03", (("westus2-1", 0.95), ("westus2-2", 1.05), ("westus2-3", 1.0))),
        _r("westeurope", "1.15", (("westeurope-1", 1.1), ("westeurope-2", 0.85))),
    ),
    instance_types=(
        _t("Standard_NC4as_T4_v3", "T4", 1, 4, "28", "0.526", "0.72", 0.03, 0.95),
        _t("Standard_NC6s_v3", "V100", 1, 6, "112", "3.06", "0.72", 0.05, 0.92),
        _t("Standard_NC24s_v3", "V100", 4, 24, "448", "12.24", "0.72", 0.07),
        _t("Standard_NC24ads_A100_v4", "A100-80GB", 1, 24, "220", "3.673", "0.66", 0.07, 0.9),
        _t("Standard_ND96asr_v4", "A100", 8, 96, "900", "27.197", "0.63", 0.11, 0.86),
        _t("Standard_ND96isr_H100_v5", "H100", 8, 96, "1900", "98.32", "0.60", 0.15, 0.8),
    ),
)

CATALOG: dict[str, SimProvider] = {p.name: p for p in (SIM_AWS, SIM_GCP, SIM_AZURE)}
