"""Google Cloud price feed: GPU VM pools priced from the Cloud Billing Catalog, shaped by the Compute API.

Role: an `OfferingSource` (name "gcp") that turns three real Google APIs into `Offering`s, on-demand and spot, one
per (zone, GPU machine shape):
1. `AcceleratorTypesClient.aggregated_list` (`GET /compute/v1/projects/{p}/aggregated/acceleratorTypes`): which GPU
   models each zone has and how many cards one VM can take (`maximumCardsPerInstance`);
2. `MachineTypesClient.aggregated_list` (`.../aggregated/machineTypes`): `guestCpus`, `memoryMb` (MiB) and, for the
   accelerator-optimized families (a2, a3, g2, ...), the bundled `accelerators[{guestAcceleratorType,
   guestAcceleratorCount}]`;
3. `CloudCatalogClient.list_skus` (`GET /v1/services/{service_id}/skus`, every page): the unit prices.

Contract:
- A VM's hourly price is `vCPUs x core SKU + memory GiB x RAM SKU + GPUs x GPU SKU` (GCP bills them separately;
  boot disk, local SSD and licences are not included), computed exactly in `Decimal` from the SKUs' `units +
  nanos / 1e9`, once from the "OnDemand" SKUs and once from the "Preemptible" (= Spot VM) SKUs of the pool's region.
- Bundled-GPU machine types (any machine type listing `accelerators`) give one pool per zone each. N1 machines take
  attachable GPUs: for each N1 GPU the zone offers (T4, V100, P100, P4, K80) the feed emits `n1-standard-{4,8,16}`
  x {1, 2, 4} GPUs, skipping combinations beyond the card's `maximumCardsPerInstance` or GCP's vCPU limit per GPU
  count (`N1_MAX_VCPUS`). Those pools are named `n1-standard-8+2xnvidia-tesla-t4` (`split_instance_type` reverses it).
- A pool whose core, RAM or GPU SKU is missing for its region and capacity type is skipped, never guessed; every
  skip is counted in `last_skipped_pools` and described (deduplicated per region and shape) in `last_warnings`.
- Spot pools carry `DEFAULT_SPOT_INTERRUPTION_RATE` (GCP publishes no per-pool reclaim rate) with basis
  `INTERRUPTION_BASIS`; on-demand pools carry 0. Egress is a flat `EGRESS_USD_PER_GB`.
- Google API failures (permission, quota or rate limit, unavailability, transport errors, unusable answers) raise
  `FeedError` naming the call; the broker then keeps this feed's last good prices.

SKU matching (descriptions are the only place Google names the machine family; see `parse_sku`):
- only `category.resourceFamily == "Compute"`, `usageType` "OnDemand" or "Preemptible", priced in USD, and none of
  the look-alikes in `_EXCLUDED_WORDS` (commitments, custom/sole-tenant cores, virtual-workstation GPUs, DWS...);
- cores and RAM: `[Spot Preemptible |Preemptible ]<FAMILY> [Predefined ]Instance Core|Ram running in <place>`, e.g.
  "A2 Instance Core running in Americas", "N1 Predefined Instance Ram running in ...", matched to the machine
  type's family prefix (`a3-highgpu-8g` -> "A3"); unit "h" for cores, "GiBy.h" for RAM;
- GPUs: `[Spot Preemptible |Preemptible ]Nvidia <MODEL> GPU [attached to Spot Preemptible VMs ]running in <place>`,
  e.g. "Nvidia H100 80GB GPU attached to Spot Preemptible VMs running in Americas"; `<MODEL>` goes through
  `providers.accelerators.canonical` ("Tesla A100" -> A100, "H100 80GB" -> H100, "L4" -> L4) like the Compute API's
  accelerator type names do, so a machine's GPUs meet their SKU on the canonical name; unit "h";
- regions come from `serviceRegions`; the price is the latest `pricingInfo`'s tier starting at 0 (else its last).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TypeVar

import requests
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.cloud import billing_v1, compute_v1
from google.protobuf.json_format import ParseError

from pricing.feeds import FeedError
from pricing.transfer import internet_egress_usd_per_gb
from providers.accelerators import canonical, memory_gib
from providers.model import CapacityType, Offering, Price

log = logging.getLogger(__name__)

FEED_NAME = "gcp"
COMPUTE_ENGINE_SERVICE_ID = "6F81-5844-456A"
PRICE_SOURCE = "gcp:cloud-billing-catalog"
# GCP has no API for spot reclaim rates (AWS has Spot Advisor bands, Azure an eviction-rate table): a documented
# prior of one reclaim per 20 running hours, which pricing.risk then blends with the broker's own experience.
DEFAULT_SPOT_INTERRUPTION_RATE = 0.05
INTERRUPTION_BASIS = "gcp default (no public rate)"
# Internet egress, first tier, flat for every region (e.g. SKU 02EE-77CE-ACCD "Network Vpn Internet Egress from
# Americas to Africa" starts at 0.12/GiB); the catalogue's per-destination egress SKUs are not read.
EGRESS_USD_PER_GB = internet_egress_usd_per_gb("gcp")
# Transient errors worth a short retry inside one refresh; anything longer waits for the next refresh.
DEFAULT_RETRY = Retry(
    initial=0.5,
    maximum=4.0,
    multiplier=2.0,
    timeout=20.0,
    predicate=if_exception_type(gexc.ServiceUnavailable, gexc.TooManyRequests, gexc.DeadlineExceeded),
)
DEFAULT_TIMEOUT_S = 60.0
SKU_PAGE_SIZE = 5000  # the Catalog API's maximum
AGGREGATED_PAGE_SIZE = 500  # the Compute API's maximum

N1_SHAPES: tuple[str, ...] = ("n1-standard-4", "n1-standard-8", "n1-standard-16")
N1_GPU_COUNTS: tuple[int, ...] = (1, 2, 4)
# Max vCPUs of an N1 VM per attached GPU count (GCP "GPU machine types" doc, N1 table; recalled).
N1_MAX_VCPUS: dict[str, dict[int, int]] = {
    "T4": {1: 48, 2: 48, 4: 96},
    "P4": {1: 24, 2: 48, 4: 96},
    "V100": {1: 12, 2: 24, 4: 48, 8: 96},
    "P100": {1: 16, 2: 32, 4: 64},
    "K80": {1: 8, 2: 16, 4: 32, 8: 64},
}

# Names `providers.accelerators` does not know yet (mapped here, locally) and per-GPU memory for them.
_LOCAL_ALIASES: dict[str, str] = {
    "NVIDIA-TESLA-P100": "P100",
    "NVIDIA-TESLA-P4": "P4",
    "NVIDIA-TESLA-A100-80GB": "A100-80GB",
    "NVIDIA-H100-80GB-MEGA": "H100-MEGA",
}
_LOCAL_MEMORY_GIB: dict[str, int] = {"P100": 16, "P4": 8}

_EXCLUDED_WORDS: tuple[str, ...] = (
    "Commitment",
    "Reserved",
    "Custom",
    "Sole Tenancy",
    "Virtual Workstation",
    "DWS",
    "Calendar",
    "Flex",
    "Extended",
)
_SPOT_PREFIX = r"(?:Spot Preemptible |Preemptible )?"
_MACHINE_SKU = re.compile(
    _SPOT_PREFIX + r"(?P<family>[A-Z][A-Za-z0-9]*) (?:Predefined )?Instance (?P<kind>Core|Ram) running in (?P<place>.+)"
)
_GPU_SKU = re.compile(
    _SPOT_PREFIX + r"Nvidia (?P<model>.+?) GPU (?:attached to Spot Preemptible VMs )?running in (?P<place>.+)"
)
_UNITS = {"core": "h", "ram": "GiBy.h", "gpu": "h"}
_NANO = Decimal("1e-9")
_MIB_PER_GIB = Decimal(1024)


def accelerator_name(name: str) -> str:
    """Canonical accelerator for a Compute API type (`nvidia-tesla-a100`) or a SKU model ("Tesla A100")."""
    upper = name.strip().upper().replace(" ", "-")
    if not upper.startswith("NVIDIA-"):
        upper = "NVIDIA-" + upper
    return _LOCAL_ALIASES.get(upper) or canonical(upper)


def gpu_memory(accelerator: str) -> int:
    """Per-GPU memory in GiB of a canonical accelerator (0 when unknown)."""
    return memory_gib(accelerator) or _LOCAL_MEMORY_GIB.get(accelerator, 0)


def combo_instance_type(machine: str, accelerator_type: str, count: int) -> str:
    """The pool name of an N1 machine with attached GPUs, e.g. `n1-standard-8+2xnvidia-tesla-t4`."""
    return f"{machine}+{count}x{accelerator_type}"


def split_instance_type(instance_type: str) -> tuple[str, str | None, int]:
    """`(machine type, attached accelerator type or None, count)` of a pool name this feed emits."""
    machine, plus, attached = instance_type.partition("+")
    if not plus:
        return machine, None, 0
    count, _, accelerator_type = attached.partition("x")
    return machine, accelerator_type, int(count)


@dataclass(frozen=True, slots=True)
class SkuRate:
    """One usable unit price: a machine family's core or RAM rate, or a GPU model's rate, in some regions."""

    sku_id: str
    description: str
    kind: str  # "core" | "ram" | "gpu"
    subject: str  # machine family ("A2", "N1") for core/ram, canonical accelerator for gpu
    spot: bool
    regions: tuple[str, ...]
    usd: Decimal  # per usage unit: hour, or GiB-hour for RAM


def money_usd(units: int, nanos: int) -> Decimal:
    """`google.type.Money` units + nanos as an exact Decimal."""
    return Decimal(units) + Decimal(nanos) * _NANO


def parse_sku(sku: billing_v1.Sku) -> SkuRate | str | None:
    """A usable rate, a reason string when the SKU looks like a VM part but cannot be used, or None when the
    SKU is not a VM part at all (network, storage, licences, commitments...)."""
    category = sku.category
    if category.resource_family != "Compute" or category.usage_type not in ("OnDemand", "Preemptible"):
        return None
    description = sku.description.strip()
    if any(word in description for word in _EXCLUDED_WORDS):
        return None
    machine = _MACHINE_SKU.fullmatch(description)
    gpu = None if machine else _GPU_SKU.fullmatch(description)
    if machine:
        kind, subject = machine["kind"].lower(), machine["family"].upper()
    elif gpu:
        kind, subject = "gpu", accelerator_name(gpu["model"])
    else:
        return None
    spot = category.usage_type == "Preemptible"
    if ("Preemptible" in description) != spot:
        return f"SKU {sku.sku_id} '{description}': usageType {category.usage_type} contradicts its description"
    if not sku.pricing_info:
        return f"SKU {sku.sku_id} '{description}': no pricingInfo"
    expression = sku.pricing_info[-1].pricing_expression
    if expression.usage_unit != _UNITS[kind]:
        return f"SKU {sku.sku_id} '{description}': unit {expression.usage_unit!r}, expected {_UNITS[kind]!r}"
    tiers = list(expression.tiered_rates)
    if not tiers:
        return f"SKU {sku.sku_id} '{description}': no tieredRates"
    tier = next((t for t in tiers if t.start_usage_amount == 0), tiers[-1])
    price = tier.unit_price
    if price.currency_code not in ("USD", ""):
        return f"SKU {sku.sku_id} '{description}': priced in {price.currency_code}, not USD"
    regions = tuple(sku.service_regions)
    return SkuRate(sku.sku_id, description, kind, subject, spot, regions, money_usd(price.units, price.nanos))


@dataclass
class PriceIndex:
    """Unit rates by (region, kind, family-or-accelerator, spot), built from SKUs; `warnings` lists SKUs that
    looked like VM parts but could not be used, and conflicting duplicates (the first one seen is kept)."""

    rates: dict[tuple[str, str, str, bool], SkuRate] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    skus_seen: int = 0

    @classmethod
    def from_skus(cls, skus: Iterable[billing_v1.Sku]) -> PriceIndex:
        index = cls()
        for sku in skus:
            index.add(sku)
        return index

    def add(self, sku: billing_v1.Sku) -> None:
        self.skus_seen += 1
        parsed = parse_sku(sku)
        if parsed is None:
            return
        if isinstance(parsed, str):
            self.warnings.append(parsed)
            return
        for region in parsed.regions:
            key = (region, parsed.kind, parsed.subject, parsed.spot)
            known = self.rates.get(key)
            if known is None:
                self.rates[key] = parsed
            elif known.usd != parsed.usd:
                self.warnings.append(
                    f"SKUs {known.sku_id} and {parsed.sku_id} both price {parsed.kind} of {parsed.subject} "
                    f"{'spot' if parsed.spot else 'on-demand'} in {region}; kept {known.sku_id}"
                )

    def rate(self, region: str, kind: str, subject: str, spot: bool) -> SkuRate | None:
        return self.rates.get((region, kind, subject, spot))

    def vm_hourly(
        self, region: str, family: str, accelerator: str, vcpus: int, memory_gib: Decimal, gpus: int, spot: bool
    ) -> Decimal | list[str]:
        """The exact hourly price of a VM, or the list of parts ("A3 core", "H100 GPU") with no SKU."""
        parts = (("core", family, Decimal(vcpus)), ("ram", family, memory_gib), ("gpu", accelerator, Decimal(gpus)))
        total = Decimal(0)
        missing: list[str] = []
        for kind, subject, quantity in parts:
            found = self.rate(region, kind, subject, spot)
            if found is None:
                missing.append(f"{subject} {kind}")
            else:
                total += quantity * found.usd
        return missing or total


@dataclass(frozen=True, slots=True)
class _Shape:
    """One priceable VM shape in one zone."""

    zone: str
    instance_type: str
    family: str
    accelerator: str
    gpus: int
    vcpus: int
    memory_gib: Decimal


def region_of(zone: str) -> str:
    """`us-central1-a` -> `us-central1`."""
    return zone.rsplit("-", 1)[0]


def _zone_of(scope: str) -> str | None:
    """`zones/us-central1-a` -> `us-central1-a`; regions and other scopes -> None."""
    kind, _, name = scope.partition("/")
    return name if kind == "zones" and name else None


def _usable(deprecated_state: str) -> bool:
    return deprecated_state not in ("OBSOLETE", "DELETED")


T = TypeVar("T")


class GcpPriceFeed:
    """Offerings for GCP GPU VMs from injected Google clients. See the module docstring for the contract."""

    name = FEED_NAME

    def __init__(
        self,
        billing: billing_v1.CloudCatalogClient,
        machine_types: compute_v1.MachineTypesClient,
        accelerator_types: compute_v1.AcceleratorTypesClient,
        project: str,
        service_id: str = COMPUTE_ENGINE_SERVICE_ID,
        regions: Collection[str] | None = None,
        *,
        spot_interruption_rate: float = DEFAULT_SPOT_INTERRUPTION_RATE,
        retry: Retry | None = DEFAULT_RETRY,
        timeout: float = DEFAULT_TIMEOUT_S,
        sku_page_size: int = SKU_PAGE_SIZE,
        aggregated_page_size: int = AGGREGATED_PAGE_SIZE,
    ) -> None:
        self.billing = billing
        self.machine_types = machine_types
        self.accelerator_types = accelerator_types
        self.project = project
        self.service_id = service_id
        self.regions = frozenset(regions) if regions is not None else None
        self.spot_interruption_rate = spot_interruption_rate
        self.retry = retry
        self.timeout = timeout
        self.sku_page_size = sku_page_size
        self.aggregated_page_size = aggregated_page_size
        self.last_warnings: list[str] = []
        self.last_skipped_pools = 0

    # -- OfferingSource ----------------------------------------------------------------------------------------

    def offerings(self, now: datetime) -> list[Offering]:
        accelerators = self._call("listing accelerator types", self._accelerator_types)
        machines = self._call("listing machine types", self._machine_types)
        if not machines:
            raise FeedError(self.name, f"project {self.project} lists no machine types in any zone")
        index = self._call(f"listing SKUs of service {self.service_id}", self._price_index)
        if not index.rates:
            raise FeedError(
                self.name,
                f"service {self.service_id} has no usable Compute core/RAM/GPU SKUs among {index.skus_seen} "
                "(wrong service id?)",
            )
        warnings: set[str] = set(index.warnings)
        skipped = 0
        out: list[Offering] = []
        for shape in self._shapes(machines, accelerators):
            region = region_of(shape.zone)
            for spot in (False, True):
                price = index.vm_hourly(
                    region, shape.family, shape.accelerator, shape.vcpus, shape.memory_gib, shape.gpus, spot
                )
                capacity = CapacityType.SPOT if spot else CapacityType.ON_DEMAND
                if isinstance(price, list):
                    skipped += 1
                    warnings.add(f"no {capacity} SKU for {', '.join(price)} in {region}: {shape.instance_type} skipped")
                    continue
                out.append(self._offering(shape, region, capacity, price, now))
        self.last_warnings = sorted(warnings)
        self.last_skipped_pools = skipped
        if skipped or index.warnings:
            log.warning(
                "gcp feed: %d offerings, %d pools skipped for missing SKUs, %d unusable SKUs (see last_warnings)",
                len(out),
                skipped,
                len(index.warnings),
            )
        return out

    def _offering(self, shape: _Shape, region: str, capacity: CapacityType, hourly: Decimal, now: datetime) -> Offering:
        spot = capacity is CapacityType.SPOT
        return Offering(
            provider=self.name,
            region=region,
            zone=shape.zone,
            instance_type=shape.instance_type,
            accelerator=shape.accelerator,
            accelerator_count=shape.gpus,
            gpu_memory_gib=gpu_memory(shape.accelerator),
            vcpus=shape.vcpus,
            memory_gib=shape.memory_gib,
            capacity_type=capacity,
            price=Price(hourly_usd=hourly, source=PRICE_SOURCE, observed_at=now),
            interruption_rate_per_hour=self.spot_interruption_rate if spot else 0.0,
            egress_usd_per_gb=EGRESS_USD_PER_GB,
            interruption_basis=INTERRUPTION_BASIS if spot else "",
        )

    # -- shapes ------------------------------------------------------------------------------------------------

    def _wanted(self, zone: str) -> bool:
        return self.regions is None or region_of(zone) in self.regions

    def _shapes(
        self,
        machines: dict[str, list[compute_v1.MachineType]],
        accelerators: dict[str, list[compute_v1.AcceleratorType]],
    ) -> Iterator[_Shape]:
        for zone in sorted(z for z in machines if self._wanted(z)):
            by_name = {m.name: m for m in machines[zone] if _usable(m.deprecated.state)}
            for machine in by_name.values():
                if not machine.accelerators:
                    continue
                bundled = machine.accelerators[0]
                if len(machine.accelerators) > 1 or bundled.guest_accelerator_count <= 0:
                    continue
                yield _Shape(
                    zone=zone,
                    instance_type=machine.name,
                    family=machine.name.split("-", 1)[0].upper(),
                    accelerator=accelerator_name(bundled.guest_accelerator_type),
                    gpus=bundled.guest_accelerator_count,
                    vcpus=machine.guest_cpus,
                    memory_gib=Decimal(machine.memory_mb) / _MIB_PER_GIB,
                )
            for card in accelerators.get(zone, []):
                acc = accelerator_name(card.name)
                limits = N1_MAX_VCPUS.get(acc)
                if limits is None or not _usable(card.deprecated.state):
                    continue
                for shape_name in N1_SHAPES:
                    n1 = by_name.get(shape_name)
                    if n1 is None:
                        continue
                    for count in N1_GPU_COUNTS:
                        max_cards = card.maximum_cards_per_instance or count
                        if count > max_cards or n1.guest_cpus > limits.get(count, 0):
                            continue
                        yield _Shape(
                            zone=zone,
                            instance_type=combo_instance_type(shape_name, card.name, count),
                            family="N1",
                            accelerator=acc,
                            gpus=count,
                            vcpus=n1.guest_cpus,
                            memory_gib=Decimal(n1.memory_mb) / _MIB_PER_GIB,
                        )

    # -- Google calls ------------------------------------------------------------------------------------------

    def _accelerator_types(self) -> dict[str, list[compute_v1.AcceleratorType]]:
        request = compute_v1.AggregatedListAcceleratorTypesRequest(
            project=self.project, max_results=self.aggregated_page_size
        )
        pager = self.accelerator_types.aggregated_list(request=request, retry=self.retry, timeout=self.timeout)
        out: dict[str, list[compute_v1.AcceleratorType]] = {}
        # The pager yields each zone once per page (empty ones with a NO_RESULTS_ON_PAGE warning), so merge.
        for scope, scoped in pager:
            zone = _zone_of(scope)
            if zone is not None and scoped.accelerator_types:
                out.setdefault(zone, []).extend(scoped.accelerator_types)
        return out

    def _machine_types(self) -> dict[str, list[compute_v1.MachineType]]:
        request = compute_v1.AggregatedListMachineTypesRequest(
            project=self.project, max_results=self.aggregated_page_size
        )
        pager = self.machine_types.aggregated_list(request=request, retry=self.retry, timeout=self.timeout)
        out: dict[str, list[compute_v1.MachineType]] = {}
        for scope, scoped in pager:
            zone = _zone_of(scope)
            if zone is not None and scoped.machine_types:
                out.setdefault(zone, []).extend(scoped.machine_types)
        return out

    def _price_index(self) -> PriceIndex:
        request = billing_v1.ListSkusRequest(parent=f"services/{self.service_id}", page_size=self.sku_page_size)
        pager = self.billing.list_skus(request=request, retry=self.retry, timeout=self.timeout)
        return PriceIndex.from_skus(pager)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one (paginated) Google listing, turning its failures into FeedError."""
        try:
            return fn()
        except gexc.Unauthorized as exc:
            raise FeedError(self.name, f"not authenticated {what} (check the credentials): {exc.message}") from exc
        except gexc.Forbidden as exc:  # REST answers map by HTTP status: 403 is Forbidden, not PermissionDenied
            raise FeedError(self.name, f"permission denied {what} (project {self.project}): {exc.message}") from exc
        except gexc.TooManyRequests as exc:  # 429; ResourceExhausted is its subclass
            raise FeedError(self.name, f"rate limited or out of quota {what}: {exc.message}") from exc
        except gexc.ServiceUnavailable as exc:
            raise FeedError(self.name, f"Google API unavailable {what}: {exc.message}") from exc
        except gexc.RetryError as exc:
            raise FeedError(self.name, f"gave up retrying {what}: {exc.cause or exc}") from exc
        except gexc.GoogleAPICallError as exc:
            raise FeedError(self.name, f"Google API error {what}: {exc.code} {exc.message}") from exc
        except requests.exceptions.RequestException as exc:
            raise FeedError(self.name, f"cannot reach the Google API {what}: {exc}") from exc
        except ParseError as exc:
            raise FeedError(self.name, f"unusable answer {what}: {exc}") from exc
