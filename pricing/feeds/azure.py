"""Azure price feed: GPU VM pools priced by the Azure Retail Prices API, sized by ARM's vmSizes when available.

Contract (an `OfferingSource`, see providers.base):
- `AzurePriceFeed.offerings(now)` returns one on-demand and one spot `Offering` per known GPU VM size per region the
  Retail Prices API prices, Linux only, in USD per hour, `source="azure:retail-prices"`, `observed_at=now`.
- Query: `GET {base_url}?api-version=2023-01-01-preview&$filter=serviceName eq 'Virtual Machines' and
  armRegionName eq '<region>' and priceType eq 'Consumption'`, then every `NextPageLink` until it is null.
  Since 2023-01-01-preview filter VALUES are case-sensitive: a region must be spelled as ARM spells it
  (`eastus`, not `EastUS`); a wrongly spelled region yields no rows and a warning, never a crash.
- Rows kept: `type == "Consumption"`, productName without "Windows", no "Low Priority" in meterName/skuName,
  `unitOfMeasure == "1 Hour"` and `currencyCode == "USD"` (else skipped with a warning), `armSkuName` in the
  built-in GPU size table. Spot rows have "Spot" in both meterName and skuName. Prices are parsed from the JSON
  text straight into `Decimal` (`json.loads(parse_float=Decimal)`), so no binary float noise reaches money.
- Azure retail prices have no zones: `zone == region`.
- GPU model, count and per-GPU memory come from the built-in table (ARM's vmSizes does not report GPUs); vCPUs and
  memory come from an injected `ComputeManagementClient` (`virtual_machine_sizes.list(location)`) when given and it
  knows the size, else from the table. A failing vmSizes call is a warning (the table still sizes the pool).
- Spot interruption risk is a documented default prior (`interruption_basis` says so). Azure's real eviction rates
  live in Azure Resource Graph (`SpotResources`, `microsoft.compute/skuspotevictionrate/location`); querying it
  needs the azure-mgmt-resourcegraph client and is out of scope here.
- HTTP 429 / 5xx / other non-200, timeouts, transport errors and unusable bodies raise `FeedError` naming the status,
  region and page. `last_warnings` holds the warnings of the latest `offerings` call.
- Fractional-GPU sizes (NVadsA10 v5 below NV36ads) are skipped: a pool must hold whole GPUs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from pricing.feeds import FeedError
from pricing.transfer import internet_egress_usd_per_gb
from providers.accelerators import canonical, memory_gib
from providers.model import CapacityType, Offering, Price

if TYPE_CHECKING:
    from azure.mgmt.compute import ComputeManagementClient

log = logging.getLogger(__name__)

FEED_NAME = "azure"
PROVIDER = "azure"
SOURCE = "azure:retail-prices"
DEFAULT_BASE_URL = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"
EGRESS_USD_PER_GB = internet_egress_usd_per_gb("azure")
DEFAULT_SPOT_INTERRUPTION_RATE = 0.05
DEFAULT_SPOT_BASIS = "azure default prior (eviction rates from Resource Graph SpotResources not queried)"
DEFAULT_MAX_PAGES = 1000
_MIB_PER_GIB = Decimal(1024)

# Fallbacks for accelerator names used below while providers.accelerators does not know them: the H100 NVL (94 GB)
# of NC H100 v5 counts as an H100 until it has its own canonical name. Per-GPU memory stays 94 either way.
_LOCAL_ALIASES: dict[str, str] = {"H100-NVL": "H100"}


def _accelerator(name: str) -> str:
    """The canonical name; a name providers.accelerators does not know falls back to its local alias."""
    known = canonical(name)
    if memory_gib(known) > 0 or name not in _LOCAL_ALIASES:
        return known
    return canonical(_LOCAL_ALIASES[name])


@dataclass(frozen=True, slots=True)
class GpuSize:
    """A GPU VM size: whole GPUs of one model, per-GPU memory, and the size's documented vCPUs and memory."""

    name: str
    accelerator: str
    gpu_count: int
    gpu_memory_gib: int
    vcpus: int
    memory_gib: Decimal


@dataclass(frozen=True, slots=True)
class VmSize:
    """What ARM's vmSizes says about one size."""

    name: str
    vcpus: int
    memory_gib: Decimal


def _g(name: str, accelerator: str, count: int, gpu_mem: int, vcpus: int, mem_gib: str) -> GpuSize:
    return GpuSize(name, _accelerator(accelerator), count, gpu_mem, vcpus, Decimal(mem_gib))


# Main N-series sizes (Microsoft Learn size pages; memory as ARM reports it). Keyed by lower-cased name because
# ARM treats size names case-insensitively.
GPU_SIZES: dict[str, GpuSize] = {
    s.name.lower(): s
    for s in (
        # NCasT4_v3: NVIDIA T4 16 GB.
        _g("Standard_NC4as_T4_v3", "T4", 1, 16, 4, "28"),
        _g("Standard_NC8as_T4_v3", "T4", 1, 16, 8, "56"),
        _g("Standard_NC16as_T4_v3", "T4", 1, 16, 16, "110"),
        _g("Standard_NC64as_T4_v3", "T4", 4, 16, 64, "440"),
        # NCv3: V100 16 GB.
        _g("Standard_NC6s_v3", "V100", 1, 16, 6, "112"),
        _g("Standard_NC12s_v3", "V100", 2, 16, 12, "224"),
        _g("Standard_NC24s_v3", "V100", 4, 16, 24, "448"),
        _g("Standard_NC24rs_v3", "V100", 4, 16, 24, "448"),
        # NDv2: 8x V100 32 GB (NVLink).
        _g("Standard_ND40rs_v2", "V100-32GB", 8, 32, 40, "672"),
        # NC A100 v4: A100 PCIe 80 GB.
        _g("Standard_NC24ads_A100_v4", "A100-80GB", 1, 80, 24, "220"),
        _g("Standard_NC48ads_A100_v4", "A100-80GB", 2, 80, 48, "440"),
        _g("Standard_NC96ads_A100_v4", "A100-80GB", 4, 80, 96, "880"),
        # ND A100 v4 (40 GB) and NDm A100 v4 (80 GB), 8 GPUs each.
        _g("Standard_ND96asr_v4", "A100", 8, 40, 96, "900"),
        _g("Standard_ND96amsr_A100_v4", "A100-80GB", 8, 80, 96, "1800"),
        # NC H100 v5: H100 NVL 94 GB.
        _g("Standard_NC40ads_H100_v5", "H100-NVL", 1, 94, 40, "320"),
        _g("Standard_NC80adis_H100_v5", "H100-NVL", 2, 94, 80, "640"),
        # ND H100 v5 / ND H200 v5 / ND MI300X v5: 8 GPUs each.
        _g("Standard_ND96isr_H100_v5", "H100", 8, 80, 96, "1900"),
        _g("Standard_ND96isr_H200_v5", "H200", 8, 141, 96, "1850"),
        _g("Standard_ND96isr_MI300X_v5", "MI300X", 8, 192, 96, "1850"),
        # NC A10 v4 and the whole-GPU NVadsA10 v5 sizes: A10 24 GB.
        _g("Standard_NC8ads_A10_v4", "A10", 1, 24, 8, "100"),
        _g("Standard_NC16ads_A10_v4", "A10", 1, 24, 16, "200"),
        _g("Standard_NC32ads_A10_v4", "A10", 2, 24, 32, "400"),
        _g("Standard_NV36ads_A10_v5", "A10", 1, 24, 36, "440"),
        _g("Standard_NV36adms_A10_v5", "A10", 1, 24, 36, "880"),
        _g("Standard_NV72ads_A10_v5", "A10", 2, 24, 72, "880"),
    )
}

# Sizes that hold a fraction of a GPU (1/6, 1/3, 1/2 of an A10): priced by Azure, never offered by this feed.
FRACTIONAL_GPU_SIZES: frozenset[str] = frozenset(
    n.lower() for n in ("Standard_NV6ads_A10_v5", "Standard_NV12ads_A10_v5", "Standard_NV18ads_A10_v5")
)


def odata_literal(value: str) -> str:
    """An OData string literal: single-quoted, embedded quotes doubled. The value's case is kept exactly."""
    return "'" + value.replace("'", "''") + "'"


def retail_filter(region: str) -> str:
    """The `$filter` for one region's pay-as-you-go VM meters (values are case-sensitive)."""
    clauses = (("serviceName", "Virtual Machines"), ("armRegionName", region), ("priceType", "Consumption"))
    return " and ".join(f"{field} eq {odata_literal(value)}" for field, value in clauses)


def _decimal(value: object) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, Decimal):
        return value
    if isinstance(value, int | str):
        try:
            return Decimal(str(value))
        except InvalidOperation:
            return None
    if isinstance(value, float):  # only if a caller parsed without parse_float; str() avoids binary expansion
        return Decimal(str(value))
    return None


@dataclass(frozen=True, slots=True)
class _Candidate:
    size: GpuSize
    capacity: CapacityType
    price: Decimal
    primary: bool
    effective: str
    meter: str


class AzurePriceFeed:
    """Live Azure GPU prices (see the module docstring for the contract)."""

    name = FEED_NAME

    def __init__(
        self,
        http: httpx.Client,
        regions: Sequence[str],
        *,
        compute: ComputeManagementClient | None = None,
        base_url: str = DEFAULT_BASE_URL,
        api_version: str = API_VERSION,
        spot_interruption_rate_per_hour: float = DEFAULT_SPOT_INTERRUPTION_RATE,
        max_pages: int = DEFAULT_MAX_PAGES,
    ) -> None:
        if isinstance(regions, str):
            raise TypeError("regions must be a sequence of region names, not one string")
        self._http = http
        self._compute = compute
        self.regions: tuple[str, ...] = tuple(regions)
        self.base_url = base_url
        self.api_version = api_version
        self.spot_interruption_rate_per_hour = spot_interruption_rate_per_hour
        self.max_pages = max_pages
        self.last_warnings: list[str] = []
        self._size_cache: dict[str, dict[str, VmSize]] = {}

    # ------------------------------------------------------------------ public

    def offerings(self, now: datetime) -> list[Offering]:
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError("now must be timezone-aware (UTC)")
        self.last_warnings = []
        out: list[Offering] = []
        for region in self.regions:
            items = self.fetch_region(region)
            chosen = self._choose(region, items)
            if not chosen:
                hint = ""
                if region != region.lower():
                    hint = (
                        f"; Retail Prices filter values are case-sensitive and ARM region names are lower-case"
                        f" (did you mean {region.lower()!r}?)"
                    )
                self._warn(f"region {region!r}: no usable GPU price rows ({len(items)} rows returned){hint}")
                continue
            sizes = self.vm_sizes(region)
            for cand in chosen:
                out.append(self._offering(region, cand, sizes.get(cand.size.name.lower()), now))
        out.sort(key=lambda o: (o.region, o.instance_type, o.capacity_type.value))
        return out

    def fetch_region(self, region: str) -> list[dict[str, Any]]:
        """Every Retail Prices item for one region's pay-as-you-go VM meters, all pages followed."""
        params: dict[str, str] = {"api-version": self.api_version, "$filter": retail_filter(region)}
        base_host = urlsplit(self.base_url).hostname
        items: list[dict[str, Any]] = []
        seen: set[str] = set()
        url: str = self.base_url
        page = 1
        body = self._get_page(url, params, region, page)
        while True:
            items.extend(body["Items"])
            next_link = body.get("NextPageLink")
            if not next_link:
                return items
            if not isinstance(next_link, str):
                raise FeedError(self.name, f"region {region!r} page {page}: NextPageLink is not a string")
            if urlsplit(next_link).hostname != base_host:
                raise FeedError(
                    self.name, f"region {region!r} page {page}: NextPageLink leaves {base_host}: {next_link}"
                )
            if next_link in seen:
                raise FeedError(self.name, f"region {region!r} page {page}: NextPageLink repeats: {next_link}")
            seen.add(next_link)
            page += 1
            if page > self.max_pages:
                raise FeedError(self.name, f"region {region!r}: more than {self.max_pages} pages, giving up")
            body = self._get_page(next_link, None, region, page)

    def vm_sizes(self, region: str) -> dict[str, VmSize]:
        """ARM's sizes for a region keyed by lower-cased name; {} without a compute client or when ARM fails."""
        if self._compute is None:
            return {}
        cached = self._size_cache.get(region)
        if cached is not None:
            return cached
        from azure.core.exceptions import AzureError  # azure-core is present whenever a client was given

        sizes: dict[str, VmSize] = {}
        try:
            for s in self._compute.virtual_machine_sizes.list(location=region):
                if not s.name or not s.number_of_cores or not s.memory_in_mb:
                    continue
                sizes[s.name.lower()] = VmSize(s.name, int(s.number_of_cores), Decimal(s.memory_in_mb) / _MIB_PER_GIB)
        except AzureError as exc:
            status = getattr(exc, "status_code", None)
            what = f"HTTP {status}" if status else type(exc).__name__
            self._warn(f"region {region!r}: ARM vmSizes failed ({what}: {exc.message}); using built-in sizes")
            return {}
        self._size_cache[region] = sizes
        return sizes

    # ------------------------------------------------------------------ internals

    def _warn(self, message: str) -> None:
        self.last_warnings.append(message)
        log.warning("azure feed: %s", message)

    def _get_page(self, url: str, params: dict[str, str] | None, region: str, page: int) -> dict[str, Any]:
        where = f"region {region!r} page {page}"
        try:
            resp = self._http.get(url, params=params, headers={"Accept": "application/json"})
        except httpx.TimeoutException as exc:
            raise FeedError(self.name, f"Retail Prices API timed out ({type(exc).__name__}) for {where}") from exc
        except httpx.HTTPError as exc:
            raise FeedError(self.name, f"Retail Prices API unreachable for {where}: {exc}") from exc
        if resp.status_code == 429:
            retry = resp.headers.get("Retry-After")
            after = f", Retry-After {retry}s" if retry else ""
            raise FeedError(self.name, f"Retail Prices API throttled (HTTP 429{after}) for {where}")
        if resp.status_code >= 500:
            raise FeedError(self.name, f"Retail Prices API server error (HTTP {resp.status_code}) for {where}")
        if resp.status_code != 200:
            raise FeedError(
                self.name, f"Retail Prices API refused (HTTP {resp.status_code}) for {where}: {resp.text[:300]}"
            )
        try:
            body = json.loads(resp.content, parse_float=Decimal)
        except ValueError as exc:
            raise FeedError(self.name, f"Retail Prices API sent invalid JSON for {where}: {exc}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("Items"), list):
            raise FeedError(self.name, f"Retail Prices API answer for {where} has no Items list")
        return body

    def _choose(self, region: str, items: list[dict[str, Any]]) -> list[_Candidate]:
        """The one price per (size, capacity type) that applies, with anomalies reported as warnings."""
        groups: dict[tuple[str, CapacityType], list[_Candidate]] = {}
        fractional: set[str] = set()
        for item in items:
            if not isinstance(item, dict):
                self._warn(f"region {region!r}: skipped a non-object item")
                continue
            sku = str(item.get("armSkuName") or "")
            size = GPU_SIZES.get(sku.lower())
            if size is None:
                if sku.lower() in FRACTIONAL_GPU_SIZES:
                    fractional.add(sku)
                continue
            if item.get("type") != "Consumption" or item.get("armRegionName") != region:
                continue
            product = str(item.get("productName") or "")
            meter = str(item.get("meterName") or "")
            sku_name = str(item.get("skuName") or "")
            if "Windows" in product or "Low Priority" in meter or "Low Priority" in sku_name:
                continue
            if ("Spot" in meter) != ("Spot" in sku_name):
                self._warn(f"region {region!r}: {sku} meter {meter!r} / sku {sku_name!r} half-marked Spot, skipped")
                continue
            unit = item.get("unitOfMeasure")
            if unit != "1 Hour":
                self._warn(f"region {region!r}: {sku} meter {meter!r} priced per {unit!r}, not '1 Hour'; skipped")
                continue
            currency = item.get("currencyCode")
            if currency != "USD":
                self._warn(f"region {region!r}: {sku} meter {meter!r} priced in {currency!r}, not USD; skipped")
                continue
            price = _decimal(item.get("retailPrice"))
            if price is None or price <= 0:
                self._warn(f"region {region!r}: {sku} meter {meter!r} has no usable retailPrice; skipped")
                continue
            capacity = CapacityType.SPOT if "Spot" in meter else CapacityType.ON_DEMAND
            cand = _Candidate(
                size=size,
                capacity=capacity,
                price=price,
                primary=item.get("isPrimaryMeterRegion") is not False,
                effective=str(item.get("effectiveStartDate") or ""),
                meter=meter,
            )
            groups.setdefault((size.name, capacity), []).append(cand)
        for sku in sorted(fractional):
            self._warn(f"region {region!r}: {sku} holds a fraction of a GPU; not offered")
        chosen: list[_Candidate] = []
        for (sku, capacity), cands in sorted(groups.items()):
            # Prefer the primary meter, then the latest effective price, then the higher price (a ceiling is a
            # promise, so when Azure is ambiguous over-estimate rather than under-estimate).
            best = max(cands, key=lambda c: (c.primary, c.effective, c.price))
            if len({c.price for c in cands}) > 1:
                others = ", ".join(sorted(str(c.price) for c in cands))
                self._warn(
                    f"region {region!r}: {sku} {capacity.value} has {len(cands)} prices ({others}); using {best.price}"
                )
            chosen.append(best)
        return chosen

    def _offering(self, region: str, cand: _Candidate, vm: VmSize | None, now: datetime) -> Offering:
        size = cand.size
        spot = cand.capacity is CapacityType.SPOT
        return Offering(
            provider=PROVIDER,
            region=region,
            zone=region,
            instance_type=size.name,
            accelerator=size.accelerator,
            accelerator_count=size.gpu_count,
            gpu_memory_gib=size.gpu_memory_gib,
            vcpus=vm.vcpus if vm else size.vcpus,
            memory_gib=vm.memory_gib if vm else size.memory_gib,
            capacity_type=cand.capacity,
            price=Price(hourly_usd=cand.price, source=SOURCE, observed_at=now),
            interruption_rate_per_hour=self.spot_interruption_rate_per_hour if spot else 0.0,
            egress_usd_per_gb=EGRESS_USD_PER_GB,
            interruption_basis=DEFAULT_SPOT_BASIS if spot else "",
        )
