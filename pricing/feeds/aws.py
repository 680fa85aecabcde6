"""AWS price feed: GPU spot and on-demand pools per availability zone, from the EC2 and Price List APIs.

Role: an `OfferingSource` (providers.base) named "aws". Clients are injected (one boto3 EC2 client per region and
an optional us-east-1 Pricing client), so tests hand it clients pointed at a local moto server or a Stubber.

Flow per region, every call paginated:
1. DescribeInstanceTypes → GPU types (GpuInfo: canonical accelerator, count, per-GPU memory; vCPUs; memory).
   With `instance_types=None` every type showing GpuInfo with at least one whole GPU is used (the list is cached
   per region for the feed's life); otherwise only the listed types the region offers (non-GPU types dropped).
2. DescribeInstanceTypeOfferings (LocationType=availability-zone) → the zones offering each type.
3. DescribeSpotPriceHistory (StartTime=now, or now - `history_window`) for "Linux/UNIX" and the legacy
   "Linux/UNIX (Amazon VPC)": AWS returns price-change events, the first being the effective price at StartTime.
   Per (type, zone) "Linux/UNIX" wins over the legacy description, then the newest event wins.
4. Pricing GetProducts per (type, region) for the Linux/Shared/NA/Used on-demand price. When the Pricing API
   fails (then it is not asked again during this refresh) or has no product, `on_demand_fallback` supplies the
   price (`Price.estimated=True`, source "catalog"); with neither the pool has no on-demand offering.

Contract:
- Offerings: one SPOT offering per (type, zone) with a spot price, one ON_DEMAND offering per (type, zone) offered
  when an on-demand price is known. Money is Decimal, `observed_at` is the `now` passed in (UTC).
- Spot `interruption_rate_per_hour` comes from the Spot Advisor band (`pricing.advisor`); without advisor data it
  is band `default_band` (2, 10-15%/month) and the basis says it was assumed.
- EC2 failures raise `FeedError` naming the region and API (throttling and auth failures called out), so the
  broker keeps the last good prices; a partial region set is never returned.
- `gpu_memory_gib` is per GPU: the reported MiB in GiB, snapped to the accelerator's nominal size when within 10%
  (an A10G reports 22888 MiB of its 24 GB) so pools compare across clouds. An A100 or V100 whose memory matches a
  larger variant is named as that variant (A100-80GB, V100-32GB).
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from pricing.advisor import Band, SpotAdvisor
from pricing.feeds import FeedError
from pricing.transfer import internet_egress_usd_per_gb
from providers.accelerators import ACCELERATORS, canonical, memory_gib
from providers.model import CapacityType, Offering, Price

log = logging.getLogger(__name__)

FEED = "aws"
SPOT_SOURCE = "aws:spot-price-history"
ON_DEMAND_SOURCE = "aws:pricing-api"
FALLBACK_SOURCE = "catalog"
EGRESS_USD_PER_GB = internet_egress_usd_per_gb("aws")
PRODUCT_DESCRIPTIONS: tuple[str, ...] = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
DEFAULT_BAND_INDEX = 2
PRICING_REGION = "us-east-1"

_THROTTLED = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException"})
_AUTH = frozenset(
    {
        "UnauthorizedOperation",
        "AuthFailure",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "ExpiredToken",
        "SignatureDoesNotMatch",
    }
)
_MAX_TYPES_PER_CALL = 100  # DescribeInstanceTypes.InstanceTypes allows at most 100; used for every type list
_NOMINAL_TOLERANCE = 0.10


class EC2Client(Protocol):
    """What the feed uses of a boto3 EC2 client (paginators only)."""

    def get_paginator(self, operation_name: str) -> Any: ...


class PricingClient(Protocol):
    """What the feed uses of a boto3 Pricing client (us-east-1 Price List Query API)."""

    def get_paginator(self, operation_name: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class GpuInstanceType:
    """The hardware of one GPU instance type, from DescribeInstanceTypes."""

    instance_type: str
    accelerator: str
    accelerator_count: int
    gpu_memory_gib: int
    vcpus: int
    memory_gib: Decimal


@dataclass(frozen=True, slots=True)
class SpotPricePoint:
    """One DescribeSpotPriceHistory event: the spot price of a type in a zone from `changed_at` on.

    `zone` is the AZ name (`us-east-1a`) and `zone_id` the AZ id (`use1-az4`); either may be empty when the
    source only has the other (the 2022 public capture has ids only).
    """

    instance_type: str
    zone: str
    zone_id: str
    product_description: str
    hourly_usd: Decimal
    changed_at: datetime

    @property
    def location(self) -> str:
        return self.zone or self.zone_id


def _utc(value: datetime | str) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _decimal(value: object) -> Decimal | None:
    try:
        price = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        return None
    return price if price.is_finite() and price > 0 else None


def parse_spot_price_history(response: Mapping[str, Any]) -> list[SpotPricePoint]:
    """Points from one DescribeSpotPriceHistory response (boto3 page or the CLI's JSON); unusable prices skipped."""
    points = []
    for row in response.get("SpotPriceHistory") or ():
        price = _decimal(row.get("SpotPrice"))
        if price is None or "Timestamp" not in row or "InstanceType" not in row:
            continue
        points.append(
            SpotPricePoint(
                instance_type=str(row["InstanceType"]),
                zone=str(row.get("AvailabilityZone") or ""),
                zone_id=str(row.get("AvailabilityZoneId") or ""),
                product_description=str(row.get("ProductDescription") or ""),
                hourly_usd=price,
                changed_at=_utc(row["Timestamp"]),
            )
        )
    return points


def read_spot_price_csv(path: Path | str) -> list[SpotPricePoint]:
    """Points from the public capture format `az_id,instance_type,product_description,spot_price_usd_per_hr,
    timestamp_utc` (ericpauley/aws-spot-price-history)."""
    points = []
    with Path(path).open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            price = _decimal(row.get("spot_price_usd_per_hr"))
            if price is None:
                continue
            points.append(
                SpotPricePoint(
                    instance_type=row["instance_type"],
                    zone=row.get("availability_zone") or "",
                    zone_id=row.get("az_id") or "",
                    product_description=row.get("product_description") or "",
                    hourly_usd=price,
                    changed_at=_utc(row["timestamp_utc"]),
                )
            )
    return points


def latest_spot_prices(
    points: Iterable[SpotPricePoint], products: Sequence[str] = PRODUCT_DESCRIPTIONS
) -> dict[tuple[str, str], SpotPricePoint]:
    """The current price per (instance type, zone): the earliest-listed product description wins ("Linux/UNIX"
    over the legacy "Linux/UNIX (Amazon VPC)"), then the newest event. Other descriptions are ignored."""
    rank = {p: i for i, p in enumerate(products)}
    best: dict[tuple[str, str], SpotPricePoint] = {}
    for point in points:
        if point.product_description not in rank:
            continue
        key = (point.instance_type, point.location)
        held = best.get(key)
        if held is None or (-rank[point.product_description], point.changed_at) > (
            -rank[held.product_description],
            held.changed_at,
        ):
            best[key] = point
    return best


def on_demand_price(price_list: Iterable[str | Mapping[str, Any]]) -> Decimal | None:
    """The hourly on-demand USD price in a GetProducts `PriceList` (JSON strings, as the API returns them).

    Reads product.terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD for hourly dimensions. Products whose
    `marketoption` is not OnDemand (capacity blocks) or whose operation is not plain RunInstances are ignored, as
    are zero prices; if several remain, the lowest wins.
    """
    found: list[Decimal] = []
    for item in price_list:
        product: Mapping[str, Any] = json.loads(item) if isinstance(item, str) else item
        attributes = (product.get("product") or {}).get("attributes") or {}
        if attributes.get("marketoption", "OnDemand") != "OnDemand":
            continue
        if attributes.get("operation", "RunInstances") != "RunInstances":
            continue
        for term in ((product.get("terms") or {}).get("OnDemand") or {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                if str(dim.get("unit", "Hrs")).lower() not in ("hrs", "hours", "hour"):
                    continue
                price = _decimal((dim.get("pricePerUnit") or {}).get("USD"))
                if price is not None:
                    found.append(price)
    return min(found) if found else None


def pricing_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    """GetProducts filters for the Linux, shared-tenancy, no-preinstalled-software on-demand price."""
    fields = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def gpu_instance_type(info: Mapping[str, Any]) -> GpuInstanceType | None:
    """The GPU hardware of one DescribeInstanceTypes entry; None without GpuInfo or without a whole GPU
    (fractional types such as g6f report a count of 0)."""
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if not gpus:
        return None
    first = gpus[0]
    count = sum(int(g.get("Count") or 0) for g in gpus)
    if count < 1:
        return None
    reported_gib = float((first.get("MemoryInfo") or {}).get("SizeInMiB") or 0) / 1024
    accelerator = _accelerator_name(str(first.get("Name") or "unknown"), reported_gib)
    nominal = memory_gib(accelerator)
    if nominal and abs(reported_gib - nominal) <= _NOMINAL_TOLERANCE * nominal:
        gpu_gib = nominal
    else:
        gpu_gib = round(reported_gib)
    return GpuInstanceType(
        instance_type=str(info["InstanceType"]),
        accelerator=accelerator,
        accelerator_count=count,
        gpu_memory_gib=gpu_gib,
        vcpus=int((info.get("VCpuInfo") or {}).get("DefaultVCpus") or 0),
        memory_gib=Decimal(int((info.get("MemoryInfo") or {}).get("SizeInMiB") or 0)) / Decimal(1024),
    )


def _accelerator_name(aws_name: str, reported_gib: float) -> str:
    """Canonical name, picking the memory variant AWS does not spell out (p4de "A100" with 80 GiB → A100-80GB)."""
    name = canonical(aws_name)
    nominal = memory_gib(name)
    if nominal and reported_gib > nominal * (1 + _NOMINAL_TOLERANCE):
        variant = f"{name}-{round(reported_gib)}GB"
        if variant in ACCELERATORS:
            return variant
    return name


def _chunks(items: Sequence[str], size: int = _MAX_TYPES_PER_CALL) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _error_message(region: str, api: str, exc: Exception) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error") or {}
        code = str(error.get("Code") or "Unknown")
        detail = str(error.get("Message") or "").strip()
        if code in _THROTTLED:
            return f"{api} in {region} was throttled by AWS ({code}); retry later"
        if code in _AUTH:
            return f"{api} in {region} was refused ({code}): check the credentials and the IAM permission for {api}"
        return f"{api} in {region} failed ({code}): {detail}" if detail else f"{api} in {region} failed ({code})"
    return f"{api} in {region} could not be called: {type(exc).__name__}: {exc}"


@contextmanager
def _calling(region: str, api: str) -> Iterator[None]:
    """Turn botocore failures inside the block into FeedError naming the region and API."""
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise FeedError(FEED, _error_message(region, api, exc)) from exc


class AwsPriceFeed:
    """GPU spot and on-demand offerings for the regions of the injected EC2 clients. See the module docstring."""

    name = FEED

    def __init__(
        self,
        ec2_clients: Mapping[str, EC2Client],
        pricing_client: PricingClient | None = None,
        *,
        instance_types: Sequence[str] | None = None,
        advisor: SpotAdvisor | None = None,
        on_demand_fallback: Mapping[tuple[str, str], Decimal] | None = None,
        history_window: timedelta | None = None,
        page_size: int | None = None,
        default_band: int = DEFAULT_BAND_INDEX,
        refresh_seconds: float = 300.0,
    ) -> None:
        if not ec2_clients:
            raise ValueError("AwsPriceFeed needs at least one regional EC2 client")
        self.ec2_clients = dict(ec2_clients)
        self.pricing_client = pricing_client
        self.instance_types = tuple(dict.fromkeys(instance_types)) if instance_types is not None else None
        self.advisor = advisor
        self.on_demand_fallback = dict(on_demand_fallback or {})
        self.history_window = history_window
        self.page_size = page_size
        self.default_band = Band.of(default_band)
        self.refresh_seconds = refresh_seconds
        self._types: dict[str, dict[str, GpuInstanceType | None]] = {}
        self._discovered: set[str] = set()

    # -- OfferingSource ---------------------------------------------------------------------------------------

    def offerings(self, now: datetime) -> list[Offering]:
        now = _utc(now)
        pricing_ok = self.pricing_client is not None
        out: list[Offering] = []
        for region in sorted(self.ec2_clients):
            client = self.ec2_clients[region]
            zones = self._zones_and_types(region, client)
            types = self._types[region]
            start = now - self.history_window if self.history_window else now
            spot = latest_spot_prices(self._spot_points(region, client, sorted(zones), start, None))
            for instance_type in sorted(zones):
                spec = types[instance_type]
                assert spec is not None
                od_price, pricing_ok = self._on_demand(region, instance_type, now, pricing_ok)
                for zone in zones[instance_type]:
                    point = spot.get((instance_type, zone))
                    if point is not None:
                        out.append(self._spot_offering(region, zone, spec, point, now))
                    if od_price is not None:
                        out.append(self._offering(region, zone, spec, CapacityType.ON_DEMAND, od_price))
        return out

    # -- window query -----------------------------------------------------------------------------------------

    def spot_price_history(
        self, region: str, instance_types: Sequence[str], start: datetime, end: datetime | None = None
    ) -> list[SpotPricePoint]:
        """Every spot price change for the types in `region` between `start` and `end` (default: now), oldest
        first. The first event per (type, zone) may predate `start`: it is the price in effect at `start`."""
        client = self.ec2_clients.get(region)
        if client is None:
            raise FeedError(FEED, f"no EC2 client for region {region}")
        points = self._spot_points(region, client, list(dict.fromkeys(instance_types)), _utc(start), end)
        return sorted(points, key=lambda p: (p.changed_at, p.instance_type, p.location, p.product_description))

    # -- EC2 ----------------------------------------------------------------------------------------------------

    def _paginate(self, client: Any, operation: str, limit: int, **params: Any) -> Iterator[dict[str, Any]]:
        config = {"PageSize": max(5, min(self.page_size, limit))} if self.page_size else {}
        yield from client.get_paginator(operation).paginate(**params, PaginationConfig=config)

    def _zones_and_types(self, region: str, client: EC2Client) -> dict[str, list[str]]:
        """GPU type → sorted zones offering it, filling `self._types[region]` with the hardware."""
        known = self._types.setdefault(region, {})
        if self.instance_types is None:
            if region not in self._discovered:
                for info in self._describe_types(region, client, None):
                    spec = gpu_instance_type(info)
                    if spec is not None:
                        known[spec.instance_type] = spec
                self._discovered.add(region)
            wanted = sorted(t for t, spec in known.items() if spec is not None)
            return self._zones(region, client, wanted)
        zones = self._zones(region, client, list(self.instance_types))
        missing = sorted(t for t in zones if t not in known)
        if missing:
            for info in self._describe_types(region, client, missing):
                known[str(info["InstanceType"])] = gpu_instance_type(info)
            for instance_type in missing:
                known.setdefault(instance_type, None)
        return {t: z for t, z in zones.items() if known.get(t) is not None}

    def _describe_types(self, region: str, client: EC2Client, names: Sequence[str] | None) -> list[dict[str, Any]]:
        api = "DescribeInstanceTypes"
        found: list[dict[str, Any]] = []
        with _calling(region, api):
            batches: Iterable[list[str] | None] = [None] if names is None else _chunks(names)
            for batch in batches:
                params = {} if batch is None else {"InstanceTypes": batch}
                for page in self._paginate(client, "describe_instance_types", 100, **params):
                    found.extend(page.get("InstanceTypes") or ())
        return found

    def _zones(self, region: str, client: EC2Client, names: Sequence[str]) -> dict[str, list[str]]:
        zones: dict[str, set[str]] = {}
        with _calling(region, "DescribeInstanceTypeOfferings"):
            for batch in _chunks(names):
                filters = [{"Name": "instance-type", "Values": batch}]
                pages = self._paginate(
                    client,
                    "describe_instance_type_offerings",
                    1000,
                    LocationType="availability-zone",
                    Filters=filters,
                )
                for page in pages:
                    for row in page.get("InstanceTypeOfferings") or ():
                        if row.get("InstanceType") in batch and row.get("Location"):
                            zones.setdefault(str(row["InstanceType"]), set()).add(str(row["Location"]))
        return {t: sorted(z) for t, z in zones.items()}

    def _spot_points(
        self, region: str, client: EC2Client, names: Sequence[str], start: datetime, end: datetime | None
    ) -> list[SpotPricePoint]:
        points: list[SpotPricePoint] = []
        with _calling(region, "DescribeSpotPriceHistory"):
            for batch in _chunks(names):
                params: dict[str, Any] = {
                    "StartTime": start,
                    "InstanceTypes": batch,
                    "ProductDescriptions": list(PRODUCT_DESCRIPTIONS),
                }
                if end is not None:
                    params["EndTime"] = _utc(end)
                for page in self._paginate(client, "describe_spot_price_history", 1000, **params):
                    points.extend(p for p in parse_spot_price_history(page) if p.instance_type in batch)
        return points

    # -- on-demand ----------------------------------------------------------------------------------------------

    def _on_demand(self, region: str, instance_type: str, now: datetime, pricing_ok: bool) -> tuple[Price | None, bool]:
        """The on-demand price and whether the Pricing API may still be asked during this refresh."""
        if pricing_ok and self.pricing_client is not None:
            try:
                items: list[str] = []
                pages = self._paginate(
                    self.pricing_client,
                    "get_products",
                    100,
                    ServiceCode="AmazonEC2",
                    Filters=pricing_filters(region, instance_type),
                )
                for page in pages:
                    items.extend(page.get("PriceList") or ())
                price = on_demand_price(items)
            except (ClientError, BotoCoreError, ValueError, TypeError, AttributeError) as exc:
                message = _error_message(PRICING_REGION, "Pricing GetProducts", exc)
                log.warning("aws feed: %s; using the fallback on-demand prices for this refresh", message)
                pricing_ok = False
            else:
                if price is not None:
                    return Price(price, ON_DEMAND_SOURCE, now), pricing_ok
        fallback = self.on_demand_fallback.get((region, instance_type))
        if fallback is None:
            return None, pricing_ok
        return Price(Decimal(fallback), FALLBACK_SOURCE, now, estimated=True), pricing_ok

    # -- offerings ----------------------------------------------------------------------------------------------

    def _spot_offering(
        self, region: str, zone: str, spec: GpuInstanceType, point: SpotPricePoint, now: datetime
    ) -> Offering:
        band = self.advisor.band(region, spec.instance_type) if self.advisor is not None else None
        if band is not None:
            assert self.advisor is not None
            basis = band.describe(self.advisor.source)
            if self.advisor.as_of:
                basis += f" as of {self.advisor.as_of}"
        else:
            band = self.default_band
            basis = f"no spot advisor data for {spec.instance_type} in {region}: assumed {band.describe()}"
        price = Price(point.hourly_usd, SPOT_SOURCE, now)
        return self._offering(region, zone, spec, CapacityType.SPOT, price, band.rate_per_hour, basis)

    @staticmethod
    def _offering(
        region: str,
        zone: str,
        spec: GpuInstanceType,
        capacity: CapacityType,
        price: Price,
        rate: float = 0.0,
        basis: str = "",
    ) -> Offering:
        return Offering(
            provider=FEED,
            region=region,
            zone=zone,
            instance_type=spec.instance_type,
            accelerator=spec.accelerator,
            accelerator_count=spec.accelerator_count,
            gpu_memory_gib=spec.gpu_memory_gib,
            vcpus=spec.vcpus,
            memory_gib=spec.memory_gib,
            capacity_type=capacity,
            price=price,
            interruption_rate_per_hour=rate,
            egress_usd_per_gb=EGRESS_USD_PER_GB,
            interruption_basis=basis[:200],
        )
