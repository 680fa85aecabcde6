"""Building the live price feeds the settings enable, with real SDK clients (imported only when enabled).

- `OVERSPILL_AWS_REGIONS=["us-east-1","us-west-2"]`: the AWS feed (boto3; credentials from the usual AWS chain,
  `OVERSPILL_AWS_ENDPOINT_URL` to point EC2 at another endpoint such as a moto server).
- `OVERSPILL_GCP_PROJECT=...` (+ `OVERSPILL_GCP_REGIONS`): the GCP feed (Application Default Credentials).
- `OVERSPILL_AZURE_REGIONS=["eastus"]`: the Azure Retail Prices feed (no credentials needed).
Each feed is asked at most every `price_refresh_seconds`.
"""

from __future__ import annotations

from broker.settings import Settings
from providers.base import OfferingSource


def build_price_feeds(settings: Settings) -> list[OfferingSource]:
    feeds: list[OfferingSource] = []
    if settings.aws_regions:
        feeds.append(_aws(settings))
    if settings.gcp_project:
        feeds.append(_gcp(settings))
    if settings.azure_regions:
        feeds.append(_azure(settings))
    return feeds


def _aws(settings: Settings) -> OfferingSource:
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

    from pricing.feeds.gcp import GcpPriceFeed

    options = ClientOptions(api_endpoint=settings.gcp_endpoint) if settings.gcp_endpoint else None
    feed = GcpPriceFeed(
        billing_v1.CloudCatalogClient(transport="rest", client_options=options),
        compute_v1.MachineTypesClient(transport="rest", client_options=options),
        compute_v1.AcceleratorTypesClient(transport="rest", client_options=options),
        settings.gcp_project,
        regions=settings.gcp_regions or None,
    )
    feed.refresh_seconds = settings.price_refresh_seconds  # type: ignore[attr-defined]
    return feed


def _azure(settings: Settings) -> OfferingSource:
    import httpx

    from pricing.feeds.azure import AzurePriceFeed

    feed = AzurePriceFeed(httpx.Client(timeout=60), settings.azure_regions, base_url=settings.azure_prices_url)
    feed.refresh_seconds = settings.price_refresh_seconds  # type: ignore[attr-defined]
    return feed
