"""What a cloud instance bills beside its compute, at list price: its boot disk and its public IPv4 address.

Role: the broker accrues these in the ledger next to each placement's compute (ledger kinds `disk` and
`public_ip`, `broker.loop.accrue`), adds them to the hourly rate its ceiling guard projects (`broker.loop.sync`),
and adds them to a pool's hourly price when placement ranks pools (`PlacementContext.extra_hourly_usd`). Nothing
here calls a cloud: the list prices are a table (USD, us-east-1 / us-central1 / eastus), each overridable.

- Disks: `$/GB-month` by `provider/type`, over 730 hours a month. Azure bills a managed disk by its size tier (the
  smallest power of two from 4 GiB that holds it: a 200 GB disk is billed as 256 GiB), so that is its billed size.
- Public IPv4: `$/hour` by `provider/capacity_type` or `provider` (Google charges Spot VMs half).

Contract: `InstanceExtras.charges(capacity)` is what one running instance of that provider bills per hour beside
compute; `hourly_usd(capacity)` their sum. `disk_usd_per_gb_month` raises `KeyError` for a disk type without a
price (the settings check names the variable to set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from providers.model import CostKind

HOURS_PER_MONTH = Decimal(730)

DISK_USD_PER_GB_MONTH: dict[str, Decimal] = {
    # EBS (us-east-1): gp3 without extra IOPS/throughput, gp2, io1/io2 without provisioned IOPS
    "aws/gp3": Decimal("0.08"),
    "aws/gp2": Decimal("0.10"),
    "aws/io1": Decimal("0.125"),
    "aws/io2": Decimal("0.125"),
    "aws/standard": Decimal("0.05"),
    # Persistent Disk / Hyperdisk (us-central1), capacity only
    "gcp/pd-balanced": Decimal("0.10"),
    "gcp/pd-ssd": Decimal("0.17"),
    "gcp/pd-standard": Decimal("0.04"),
    "gcp/pd-extreme": Decimal("0.125"),
    "gcp/hyperdisk-balanced": Decimal("0.08"),
    # Managed disks (eastus), per GiB of the size tier (P15 256 GiB $38.01, E15 $19.20, S15 $11.33 a month)
    "azure/Premium_LRS": Decimal("0.1485"),
    "azure/PremiumV2_LRS": Decimal("0.0812"),
    "azure/StandardSSD_LRS": Decimal("0.075"),
    "azure/Standard_LRS": Decimal("0.0443"),
    "azure/Premium_ZRS": Decimal("0.2228"),
    "azure/StandardSSD_ZRS": Decimal("0.1125"),
}

PUBLIC_IPV4_USD_PER_HOUR: dict[str, Decimal] = {
    "aws": Decimal("0.005"),  # every public IPv4, in use or idle, since February 2024
    "gcp": Decimal("0.005"),  # an external IPv4 in use by a standard VM
    "gcp/spot": Decimal("0.0025"),  # ... by a Spot or preemptible VM
    "azure": Decimal("0.005"),  # a Standard public IP (the adapter attaches none by default)
}


@dataclass(frozen=True, slots=True)
class ExtraCharge:
    """One thing an instance bills per hour beside compute. `quantity_per_hour` is what the ledger records per hour
    of run in `unit`: GB for a disk ("GB-Hours", the billed size), 1 for an address ("Hours")."""

    kind: CostKind
    hourly_usd: Decimal
    quantity_per_hour: Decimal
    unit: str
    description: str


def billed_disk_gb(provider: str, size_gb: int) -> int:
    """The size a disk of `size_gb` is billed at: its own, or for Azure its size tier."""
    if provider != "azure":
        return size_gb
    tier = 4
    while tier < size_gb:
        tier *= 2
    return tier


def disk_usd_per_gb_month(provider: str, disk_type: str, prices: Mapping[str, Decimal]) -> Decimal:
    """The list price of one GB-month of `disk_type` on `provider` (`KeyError` when there is none)."""
    return prices[f"{provider}/{disk_type}"]


@dataclass(frozen=True, slots=True)
class InstanceExtras:
    """What every instance one provider launches bills beside compute: its boot disk (`disk_gb` of `disk_type`;
    0 for none) and, when `public_ipv4`, one public IPv4 address. Prices default to the list-price tables above."""

    provider: str
    disk_gb: int
    disk_type: str
    public_ipv4: bool
    disk_prices: Mapping[str, Decimal] = field(default_factory=lambda: dict(DISK_USD_PER_GB_MONTH))
    ipv4_prices: Mapping[str, Decimal] = field(default_factory=lambda: dict(PUBLIC_IPV4_USD_PER_HOUR))

    def charges(self, capacity_type: str) -> tuple[ExtraCharge, ...]:
        out: list[ExtraCharge] = []
        if self.disk_gb > 0:
            billed = billed_disk_gb(self.provider, self.disk_gb)
            per_gb_month = disk_usd_per_gb_month(self.provider, self.disk_type, self.disk_prices)
            out.append(
                ExtraCharge(
                    CostKind.DISK,
                    per_gb_month * billed / HOURS_PER_MONTH,
                    Decimal(billed),
                    "GB-Hours",
                    f"boot disk {self.disk_gb} GB {self.disk_type}",
                )
            )
        if self.public_ipv4:
            price = self.ipv4_prices.get(f"{self.provider}/{capacity_type}", self.ipv4_prices.get(self.provider))
            if price:
                out.append(ExtraCharge(CostKind.PUBLIC_IP, price, Decimal(1), "Hours", "public IPv4 address"))
        return tuple(out)

    def hourly_usd(self, capacity_type: str) -> Decimal:
        return sum((c.hourly_usd for c in self.charges(capacity_type)), Decimal(0))


def extra_hourly_table(extras: Mapping[str, InstanceExtras], capacity_types: tuple[str, ...]) -> dict[str, Decimal]:
    """`{"provider/capacity_type": USD per hour}` of every provider's extras, the shape placement reads."""
    return {
        f"{provider}/{capacity}": hourly
        for provider, ex in extras.items()
        for capacity in capacity_types
        if (hourly := ex.hourly_usd(capacity)) > 0
    }
