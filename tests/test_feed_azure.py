"""End-to-end tests of the Azure price feed: a real `httpx.Client` and the real `ComputeManagementClient` against the
local fake in tests/azure_fake.py (Retail Prices API + ARM vmSizes), plus one integration test that serves the real
libcloud vmSizes fixture from ../shared/data through the SDK."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest
from azure.core.credentials import AccessToken
from azure.core.pipeline import PipelineRequest
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.core.policies import ARMChallengeAuthenticationPolicy

from pricing.feeds import FeedError
from pricing.feeds.azure import (
    API_VERSION,
    EGRESS_USD_PER_GB,
    SOURCE,
    AzurePriceFeed,
    VmSize,
    odata_literal,
    retail_filter,
)
from providers.base import OfferingSource
from providers.model import CapacityType, Offering
from tests.azure_fake import AzureFake, default_vm_sizes, parse_filter
from tests.data import shared_file

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
SUB = "00000000-0000-0000-0000-000000000001"
SCOPE = "https://management.azure.com/.default"
EAST_FILTER = "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' and priceType eq 'Consumption'"


class FakeCredential:
    """A TokenCredential that hands out a fixed token and counts how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.calls += 1
        return AccessToken("fake-arm-token", int(time.time()) + 3600)


class PlainHttpBearerPolicy(ARMChallengeAuthenticationPolicy):
    """ARM bearer auth that allows plain http (the fake has no TLS): azure-core refuses bearer tokens over http
    unless `enforce_https` is False in the request context."""

    def on_request(self, request: PipelineRequest[Any]) -> None:
        request.context["enforce_https"] = False
        super().on_request(request)


def compute_client(fake: AzureFake, subscription: str = SUB, *, allow_http: bool = True) -> ComputeManagementClient:
    cred = FakeCredential()
    extra: dict[str, Any] = {}
    if allow_http:
        extra["authentication_policy"] = PlainHttpBearerPolicy(cred, SCOPE)
    return ComputeManagementClient(
        cred,
        subscription,
        base_url=fake.arm_url,
        credential_scopes=[SCOPE],
        retry_total=0,
        **extra,
    )


@pytest.fixture
def fake() -> Iterator[AzureFake]:
    with AzureFake() as server:
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0) as client:
        yield client


def by_key(offerings: list[Offering]) -> dict[tuple[str, str, CapacityType], Offering]:
    return {(o.region, o.instance_type, o.capacity_type): o for o in offerings}


def test_eastus_prices_end_to_end(fake: AzureFake, http: httpx.Client) -> None:
    feed = AzurePriceFeed(http, ["eastus"], compute=compute_client(fake), base_url=fake.prices_url)
    assert isinstance(feed, OfferingSource)
    assert feed.name == "azure"

    offerings = feed.offerings(NOW)
    got = by_key(offerings)

    od = got[("eastus", "Standard_NC24ads_A100_v4", CapacityType.ON_DEMAND)]
    spot = got[("eastus", "Standard_NC24ads_A100_v4", CapacityType.SPOT)]
    assert od.price.hourly_usd == Decimal("3.673") and str(od.price.hourly_usd) == "3.673"
    assert spot.price.hourly_usd == Decimal("0.67877") and str(spot.price.hourly_usd) == "0.67877"
    assert got[("eastus", "Standard_ND96asr_v4", CapacityType.SPOT)].hourly_usd == Decimal("5.98334")
    for off in (od, spot):
        assert off.provider == "azure" and off.region == "eastus" and off.zone == "eastus"
        assert (off.accelerator, off.accelerator_count, off.gpu_memory_gib) == ("A100-80GB", 1, 80)
        assert (off.vcpus, off.memory_gib) == (24, Decimal(220))
        assert off.price.source == SOURCE and off.price.observed_at == NOW and not off.price.estimated
        assert off.egress_usd_per_gb == EGRESS_USD_PER_GB == Decimal("0.087")
    assert od.interruption_rate_per_hour == 0.0 and od.interruption_basis == ""
    assert spot.interruption_rate_per_hour > 0 and "SpotResources" in spot.interruption_basis
    assert od.key == "azure/eastus/eastus/Standard_NC24ads_A100_v4/on_demand"

    nd = got[("eastus", "Standard_ND96asr_v4", CapacityType.ON_DEMAND)]
    assert (nd.accelerator, nd.accelerator_count, nd.gpu_memory_gib, nd.vcpus) == ("A100", 8, 40, 96)

    # Windows (4.409 / 1.4146), Low Priority (0.7346), DevTest and Reservation rows never become prices; the
    # non-GPU D2s_v3, fractional NV6ads_A10_v5 and the per-100-hours row are dropped too.
    assert {o.instance_type for o in offerings} == {
        "Standard_NC24ads_A100_v4",
        "Standard_ND96asr_v4",
        "Standard_NC4as_T4_v3",
    }
    assert len(offerings) == 6
    assert not {o.hourly_usd for o in offerings} & {Decimal("4.409"), Decimal("1.4146"), Decimal("0.7346")}

    # The primary meter wins over a non-primary duplicate, and the ambiguity is reported.
    assert got[("eastus", "Standard_NC4as_T4_v3", CapacityType.ON_DEMAND)].hourly_usd == Decimal("0.526")
    warnings = "\n".join(feed.last_warnings)
    assert "Standard_NC4as_T4_v3 on_demand has 2 prices" in warnings
    assert "'100 Hours'" in warnings and "Standard_ND40rs_v2" in warnings
    assert "Standard_NV6ads_A10_v5 holds a fraction of a GPU" in warnings


def test_paging_follows_next_page_link_with_the_exact_filter(fake: AzureFake, http: httpx.Client) -> None:
    feed = AzurePriceFeed(http, ["eastus"], base_url=fake.prices_url)
    feed.offerings(NOW)

    calls = fake.recorded("prices")
    east_rows = [i for i in fake.items if i["armRegionName"] == "eastus" and i["type"] == "Consumption"]
    east_rows = [i for i in east_rows if i["serviceName"] == "Virtual Machines"]
    pages = -(-len(east_rows) // fake.page_size)
    assert pages >= 3
    assert len(calls) == pages
    assert calls[0].query == {"api-version": [API_VERSION], "$filter": [EAST_FILTER]}
    assert [c.query.get("$skip", ["0"])[0] for c in calls] == [str(fake.page_size * n) for n in range(pages)]
    assert all(c.query["$filter"] == [EAST_FILTER] for c in calls)
    assert not fake.recorded("vmsizes")  # no compute client: the built-in table sizes the pools


def test_vm_sizes_from_arm_override_the_table(http: httpx.Client) -> None:
    sizes = default_vm_sizes()
    for s in sizes["eastus"]:
        if s["name"] == "Standard_NC24ads_A100_v4":
            s["memoryInMB"] = 230400  # 225 GiB, unlike the table's 220
    with AzureFake(vm_sizes=sizes) as fake:
        feed = AzurePriceFeed(http, ["eastus"], compute=compute_client(fake), base_url=fake.prices_url)
        got = by_key(feed.offerings(NOW))
        feed.offerings(NOW)  # sizes are cached per region
        calls = fake.recorded("vmsizes")
    assert got[("eastus", "Standard_NC24ads_A100_v4", CapacityType.SPOT)].memory_gib == Decimal(225)
    assert len(calls) == 1
    assert calls[0].path == f"/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/vmSizes"
    assert calls[0].headers["Authorization"] == "Bearer fake-arm-token"
    assert "api-version" in calls[0].query


def test_two_regions(fake: AzureFake, http: httpx.Client) -> None:
    feed = AzurePriceFeed(http, ["eastus", "westus2"], compute=compute_client(fake), base_url=fake.prices_url)
    offerings = feed.offerings(NOW)
    got = by_key(offerings)
    assert got[("westus2", "Standard_NC24ads_A100_v4", CapacityType.SPOT)].hourly_usd == Decimal("1.623099")
    assert got[("westus2", "Standard_NC4as_T4_v3", CapacityType.SPOT)].zone == "westus2"
    assert ("westus2", "Standard_ND96asr_v4", CapacityType.ON_DEMAND) not in got
    assert [o.region for o in offerings] == sorted(o.region for o in offerings)


def test_region_in_the_wrong_case_yields_nothing_and_a_warning(fake: AzureFake, http: httpx.Client) -> None:
    feed = AzurePriceFeed(http, ["EastUS"], compute=compute_client(fake), base_url=fake.prices_url)
    assert feed.offerings(NOW) == []
    assert any("'EastUS'" in w and "case-sensitive" in w and "'eastus'" in w for w in feed.last_warnings)
    (call,) = fake.recorded("prices")
    assert "armRegionName eq 'EastUS'" in call.query["$filter"][0]  # sent as given, not silently lower-cased
    assert not fake.recorded("vmsizes")


@pytest.mark.parametrize(
    ("status", "retry_after", "page", "expected"),
    [
        (429, "7", 1, "HTTP 429, Retry-After 7s) for region 'eastus' page 1"),
        (500, None, 2, "server error (HTTP 500) for region 'eastus' page 2"),
        (503, None, 1, "server error (HTTP 503) for region 'eastus' page 1"),
    ],
)
def test_throttling_and_server_errors_raise_feed_error(
    fake: AzureFake, http: httpx.Client, status: int, retry_after: str | None, page: int, expected: str
) -> None:
    fake.fail("prices", status, retry_after=retry_after, page=page)
    feed = AzurePriceFeed(http, ["eastus"], base_url=fake.prices_url)
    with pytest.raises(FeedError) as err:
        feed.offerings(NOW)
    assert err.value.feed == "azure"
    assert expected in str(err.value)


def test_timeout_raises_feed_error(fake: AzureFake) -> None:
    fake.delay("prices", 0.6)
    with httpx.Client(timeout=0.2) as slow:
        feed = AzurePriceFeed(slow, ["eastus"], base_url=fake.prices_url)
        with pytest.raises(FeedError, match=r"timed out \(ReadTimeout\) for region 'eastus' page 1"):
            feed.offerings(NOW)


def test_unreachable_endpoint_raises_feed_error(http: httpx.Client) -> None:
    with AzureFake() as gone:
        url = gone.prices_url
    feed = AzurePriceFeed(http, ["eastus"], base_url=url)
    with pytest.raises(FeedError, match="unreachable for region 'eastus' page 1"):
        feed.offerings(NOW)


@pytest.mark.parametrize("status", [429, 500])
def test_arm_vmsizes_failure_falls_back_to_the_table(fake: AzureFake, http: httpx.Client, status: int) -> None:
    fake.fail("vmsizes", status, retry_after="3")
    feed = AzurePriceFeed(http, ["eastus"], compute=compute_client(fake), base_url=fake.prices_url)
    got = by_key(feed.offerings(NOW))
    off = got[("eastus", "Standard_NC24ads_A100_v4", CapacityType.ON_DEMAND)]
    assert off.hourly_usd == Decimal("3.673") and off.memory_gib == Decimal(220)
    assert any(f"ARM vmSizes failed (HTTP {status}" in w for w in feed.last_warnings)
    assert len(fake.recorded("vmsizes")) == 1  # retry_total=0: exactly one attempt


def test_bearer_over_plain_http_is_refused_without_the_policy(fake: AzureFake, http: httpx.Client) -> None:
    feed = AzurePriceFeed(http, ["eastus"], compute=compute_client(fake, allow_http=False), base_url=fake.prices_url)
    assert len(feed.offerings(NOW)) == 6
    assert any("non-TLS" in w for w in feed.last_warnings)
    assert not fake.recorded("vmsizes")  # azure-core refused before sending


def test_filter_literals_are_quote_escaped_and_case_kept() -> None:
    assert odata_literal("it's") == "'it''s'"
    text = retail_filter("Don't'Region")
    assert text == (
        "serviceName eq 'Virtual Machines' and armRegionName eq 'Don''t''Region' and priceType eq 'Consumption'"
    )
    assert parse_filter(text) == [
        ("servicename", "Virtual Machines"),
        ("armregionname", "Don't'Region"),
        ("pricetype", "Consumption"),
    ]
    assert parse_filter("contains(meterName, 'Spot')") is None


def test_regions_must_be_a_sequence_and_now_aware(http: httpx.Client) -> None:
    with pytest.raises(TypeError):
        AzurePriceFeed(http, "eastus")
    with pytest.raises(ValueError):
        AzurePriceFeed(http, ["eastus"]).offerings(datetime(2026, 11, 2, 8, 0))


@pytest.mark.integration
def test_real_libcloud_vmsizes_fixture_through_the_sdk(http: httpx.Client) -> None:
    path = shared_file(
        "fixtures/libcloud/azure_arm/_subscriptions_99999999_providers_Microsoft_Compute_locations_eastus_vmSizes.json"
    )
    raw = path.read_bytes()
    expected = json.loads(raw)["value"]
    served = {"/subscriptions/99999999/providers/microsoft.compute/locations/eastus/vmsizes": raw}
    with AzureFake(vm_sizes_raw=served) as fake:
        feed = AzurePriceFeed(http, ["eastus"], compute=compute_client(fake, "99999999"), base_url=fake.prices_url)
        sizes = feed.vm_sizes("eastus")
        assert sizes == {
            s["name"].lower(): VmSize(s["name"], s["numberOfCores"], Decimal(s["memoryInMB"]) / 1024) for s in expected
        }
        assert sizes["standard_a0"] == VmSize("Standard_A0", 1, Decimal("0.75"))
        # The fixture has no GPU sizes, so GPU pools keep the built-in table's vCPUs and memory.
        got = by_key(feed.offerings(NOW))
    off = got[("eastus", "Standard_NC24ads_A100_v4", CapacityType.SPOT)]
    assert (off.vcpus, off.memory_gib, off.hourly_usd) == (24, Decimal(220), Decimal("0.67877"))
