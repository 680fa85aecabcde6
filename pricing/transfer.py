"""What moving a checkpoint between two places costs per GiB: the source side's data-transfer-out price.

Clouds bill the sender. Leaving a provider for the internet (another cloud, an on-prem site) is billed at its
internet egress rate; moving between two regions of the same provider at its (lower) inter-region rate; within
one region it is free. Rates are list prices of the first pricing tier (USD per GiB, which is what AWS and GCP
call "GB"): AWS $0.09 out / $0.02 inter-region (EC2 data transfer pricing), GCP $0.12 premium-tier out / $0.02
inter-region within a continent, Azure $0.087 out / $0.02 inter-region within a continent. A price feed's own
`Offering.egress_usd_per_gb` overrides the internet rate when the broker has one; unknown providers get the AWS
figures, a deliberate over-estimate rather than a free lunch. On-prem sites send at the rate the operator sets.
"""

from __future__ import annotations

from decimal import Decimal

DEFAULT_EGRESS_USD_PER_GB = Decimal("0.09")
EGRESS_USD_PER_GB: dict[str, Decimal] = {
    "aws": Decimal("0.09"),
    "gcp": Decimal("0.12"),
    "azure": Decimal("0.087"),
    "lambda": Decimal("0"),
}
DEFAULT_INTERREGION_USD_PER_GB = Decimal("0.02")
INTERREGION_USD_PER_GB: dict[str, Decimal] = {
    "aws": Decimal("0.02"),
    "gcp": Decimal("0.02"),
    "azure": Decimal("0.02"),
}


def internet_egress_usd_per_gb(provider: str) -> Decimal:
    """List price of sending one GiB from `provider` to the internet."""
    return EGRESS_USD_PER_GB.get(provider, DEFAULT_EGRESS_USD_PER_GB)


def interregion_usd_per_gb(provider: str) -> Decimal:
    """List price of sending one GiB between two regions of `provider`."""
    return INTERREGION_USD_PER_GB.get(provider, DEFAULT_INTERREGION_USD_PER_GB)


def transfer_usd_per_gb(
    source: tuple[str, str],
    target: tuple[str, str],
    *,
    internet_usd_per_gb: Decimal | None = None,
    onprem_usd_per_gb: Decimal = Decimal("0"),
    onprem_providers: frozenset[str] = frozenset(),
) -> Decimal:
    """USD per GiB to move data from `source` to `target`, each `(provider, region)`.

    `internet_usd_per_gb` overrides the source provider's listed internet rate (a live feed's figure);
    `onprem_providers` names the sources that are on-prem sites, which send at `onprem_usd_per_gb`."""
    if source == target:
        return Decimal("0")
    provider = source[0]
    if provider in onprem_providers:
        return onprem_usd_per_gb
    if provider == target[0]:
        return interregion_usd_per_gb(provider)
    return internet_usd_per_gb if internet_usd_per_gb is not None else internet_egress_usd_per_gb(provider)
