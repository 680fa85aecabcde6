"""Building the live price feeds the settings enable, with real SDK clients (imported only when enabled).

- `OVERSPILL_AWS_REGIONS=["us-east-1","us-west-2"]`: the AWS feed (boto3; credentials from the usual AWS chain,
  `OVERSPILL_AWS_ENDPOINT_URL` to point EC2 at another endpoint such as a moto server).
- `OVERSPILL_GCP_PROJECT=...` (+ `OVERSPILL_GCP_REGIONS`): the GCP feed (Application Default Credentials).
- `OVERSPILL_AZURE_REGIONS=["eastus"]`: the Azure Retail Prices feed (no credentials needed); with
  `OVERSPILL_AZURE_SUBSCRIPTION_ID` VM sizes also come from azure-mgmt-compute (DefaultAzureCredential).
Imported catalogs (`overspill prices import-catalog`) serve as the AWS feed's on-demand fallback.
Each feed is asked at most every `price_refresh_seconds`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from broker.config.settings import Settings
from broker.store.tables import OfferingRow
from providers.base import OfferingSource
from providers.model import CapacityType, Offering


def build_price_feeds(settings: Settings, engine: Engine) -> list[OfferingSource]:
    feeds: list[OfferingSource] = []
    if settings.aws_regions:
        feeds.append(CatalogFallbackFeed(_aws(settings), engine))
    if settings.gcp_project:
        feeds.append(_gcp(settings))
    if settings.azure_regions:
        feeds.append(_azure(settings))
    return feeds


class CatalogFallbackFeed:
    """Runs the AWS feed with on-demand prices from imported catalogs as its fallback (used, marked estimated,
    when the Price List API fails or lacks a product). The fallback is re-read from the database per refresh."""

    def __init__(self, feed: Any, engine: Engine) -> None:
        self._feed = feed
        self._engine = engine
        self.name: str = feed.name
        self.refresh_seconds: float = feed.refresh_seconds

    def offerings(self, now: datetime) -> list[Offering]:
        with Session(self._engine) as session:
            rows = session.exec(
                select(OfferingRow.region, OfferingRow.instance_type, OfferingRow.hourly_usd).where(
                    OfferingRow.provider == self.name,
                    OfferingRow.capacity_type == CapacityType.ON_DEMAND.value,
                    col(OfferingRow.feed).startswith("catalog:"),
                )
            ).all()
        self._feed.on_demand_fallback = {(region, itype): price for region, itype, price in rows}
        return list(self._feed.offerings(now))


def _aws(settings: Settings) -> Any:
    import boto3

    from pricing.advisor import SpotAdvisor
    from pricing.feeds.aws import AwsPriceFeed

    session = boto3.session.Session()
    ec2 = {
        region: session.client("ec2", region_name=region, endpoint_url=settings.aws_endpoint_url)
        for region in settings.aws_regions
    }
    pricing = session.client("pricing", region_name="us-east-1", endpoint_url=settings.aws_endpoint_url)
    advisor = None
    if settings.aws_spot_advisor_file is not None:
        advisor = SpotAdvisor.from_json(settings.aws_spot_advisor_file.read_bytes())
    return AwsPriceFeed(
        ec2,
        pricing,
        instance_types=settings.aws_instance_types or None,
        advisor=advisor,
        refresh_seconds=settings.price_refresh_seconds,
    )


def _gcp(settings: Settings) -> OfferingSource:
    from google.api_core.client_options import ClientOptions
    from google.cloud import billing_v1, compute_v1

    from broker.config.providers import gcp_credentials
    from pricing.feeds.gcp import GcpPriceFeed

    options = ClientOptions(api_endpoint=settings.gcp_endpoint) if settings.gcp_endpoint else None
    credentials = gcp_credentials(settings)  # the launch adapter's: ADC, or the test endpoint's anonymous ones
    feed = GcpPriceFeed(
        billing_v1.CloudCatalogClient(transport="rest", client_options=options, credentials=credentials),
        compute_v1.MachineTypesClient(transport="rest", client_options=options, credentials=credentials),
        compute_v1.AcceleratorTypesClient(transport="rest", client_options=options, credentials=credentials),
        settings.gcp_project,
        regions=settings.gcp_regions or None,
    )
    feed.refresh_seconds = settings.price_refresh_seconds  # type: ignore[attr-defined]
    return feed


def _azure(settings: Settings) -> OfferingSource:
    import httpx

    from pricing.feeds.azure import AzurePriceFeed

    compute = None
    if settings.azure_subscription_id:
        from broker.config.providers import azure_compute_client

        # the launch adapter's client: its credential, endpoint override and timeouts (a failed VM-size read
        # keeps the built-in sizes until the next refresh)
        compute = azure_compute_client(settings)
    feed = AzurePriceFeed(
        httpx.Client(timeout=60), settings.azure_regions, compute=compute, base_url=settings.azure_prices_url
    )
    feed.refresh_seconds = settings.price_refresh_seconds  # type: ignore[attr-defined]
    return feed
