"""The AWS price feed and the Spot Advisor: the client flow against a real moto server, exact values through
botocore Stubbers, and the parsers against real captured AWS shapes from ../shared/data.

moto answers with AWS's real instance catalogue and per-AZ offerings but placeholder spot prices ("0.00001",
dated 2006), ignores MaxResults (one page), and has no Pricing API (HTTP 500), so the moto tests assert the flow
and the on-demand fallback; pagination and real prices are asserted with Stubbers.
"""

from __future__ import annotations

import gzip
import json
import math
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")

from botocore.config import Config  # noqa: E402
from botocore.stub import Stubber  # noqa: E402

from pricing.advisor import SPOT_ADVISOR_URL, Band, SpotAdvisor, fetch_advisor, rate_per_hour  # noqa: E402
from pricing.feeds import FeedError  # noqa: E402
from pricing.feeds.aws import (  # noqa: E402
    EGRESS_USD_PER_GB,
    AwsPriceFeed,
    gpu_instance_type,
    latest_spot_prices,
    on_demand_price,
    parse_spot_price_history,
    read_spot_price_csv,
)
from providers.base import OfferingSource  # noqa: E402
from providers.model import CapacityType, Offering  # noqa: E402
from tests.data import shared_file  # noqa: E402
from tests.moto_server import stop_threaded  # noqa: E402

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
LINUX = "Linux/UNIX"
LINUX_VPC = "Linux/UNIX (Amazon VPC)"

# -- moto server ---------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server_module = pytest.importorskip("moto.server")
    port = _free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_threaded(server)


def _client(service: str, region: str, url: str) -> Any:
    config = Config(retries={"total_max_attempts": 1})
    return boto3.client(service, region_name=region, endpoint_url=url, config=config, **CREDS)


def _record_params(client: Any, calls: list[tuple[str, dict[str, Any]]]) -> None:
    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        calls.append((model.name, dict(params)))

    client.meta.events.register("provide-client-params.*.*", record)


def _moto_zones(client: Any, instance_type: str) -> list[str]:
    rows = client.describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
    )["InstanceTypeOfferings"]
    return sorted(r["Location"] for r in rows)


def _by(offerings: list[Offering], **match: object) -> list[Offering]:
    return [o for o in offerings if all(getattr(o, k) == v for k, v in match.items())]


@pytest.mark.integration
def test_moto_spot_and_on_demand_offerings_for_listed_gpu_types(moto_url: str) -> None:
    regions = ("us-east-1", "us-west-2")
    ec2 = {r: _client("ec2", r, moto_url) for r in regions}
    calls: list[tuple[str, dict[str, Any]]] = []
    for client in ec2.values():
        _record_params(client, calls)
    pricing = _client("pricing", "us-east-1", moto_url)
    pricing_calls: list[tuple[str, dict[str, Any]]] = []
    _record_params(pricing, pricing_calls)
    fallback = {
        ("us-east-1", "p4d.24xlarge"): Decimal("32.7726"),
        ("us-east-1", "g5.xlarge"): Decimal("1.006"),
        ("us-west-2", "g5.xlarge"): Decimal("1.006"),
    }  # nothing for p4d in us-west-2: that pool gets no on-demand offering
    advisor = SpotAdvisor.from_json({"spot_advisor": {"us-east-1": {"Linux": {"g5.xlarge": {"r": 1, "s": 70}}}}})
    feed = AwsPriceFeed(
        ec2,
        pricing,
        instance_types=["p4d.24xlarge", "g5.xlarge", "m5.large"],
        advisor=advisor,
        on_demand_fallback=fallback,
        page_size=5,
    )
    assert isinstance(feed, OfferingSource)

    offerings = feed.offerings(NOW)
    feed_calls = list(calls)

    assert len({o.key for o in offerings}) == len(offerings)
    assert {o.instance_type for o in offerings} == {"p4d.24xlarge", "g5.xlarge"}  # m5.large has no GPU
    for region in regions:
        for instance_type in ("p4d.24xlarge", "g5.xlarge"):
            zones = _moto_zones(ec2[region], instance_type)
            assert zones and all(z.startswith(region) for z in zones)
            spot = _by(offerings, region=region, instance_type=instance_type, capacity_type=CapacityType.SPOT)
            assert sorted(o.zone for o in spot) == zones
            od = _by(offerings, region=region, instance_type=instance_type, capacity_type=CapacityType.ON_DEMAND)
            if (region, instance_type) in fallback:
                assert sorted(o.zone for o in od) == zones
            else:
                assert od == []
    for off in offerings:
        assert off.provider == "aws" and off.egress_usd_per_gb == EGRESS_USD_PER_GB
        assert off.price.observed_at == NOW
        if off.instance_type == "p4d.24xlarge":
            assert (off.accelerator, off.accelerator_count, off.gpu_memory_gib) == ("A100", 8, 40)
            assert (off.vcpus, off.memory_gib) == (96, Decimal(1152))
        else:
            assert (off.accelerator, off.accelerator_count, off.gpu_memory_gib) == ("A10G", 1, 24)
            assert (off.vcpus, off.memory_gib) == (4, Decimal(16))
        if off.capacity_type is CapacityType.SPOT:
            assert off.price.source == "aws:spot-price-history" and not off.price.estimated
            assert off.price.hourly_usd > 0  # moto's placeholder; the value itself is not asserted
            assert off.interruption_rate_per_hour > 0
        else:
            # moto has no Pricing API: the catalog fallback is used and marked estimated
            assert off.price.source == "catalog" and off.price.estimated
            assert off.price.hourly_usd == fallback[(off.region, off.instance_type)]
            assert off.interruption_rate_per_hour == 0.0
    advised = _by(offerings, region="us-east-1", instance_type="g5.xlarge", capacity_type=CapacityType.SPOT)
    assert all(o.interruption_basis == "aws-spot-advisor band 1 (5-10%/month)" for o in advised)
    assert advised[0].interruption_rate_per_hour == pytest.approx(-math.log(1 - 0.075) / 720)
    assumed = _by(offerings, region="us-west-2", instance_type="p4d.24xlarge", capacity_type=CapacityType.SPOT)
    assert assumed[0].interruption_basis.startswith("no spot advisor data for p4d.24xlarge in us-west-2")
    assert "band 2 (10-15%/month)" in assumed[0].interruption_basis

    names = [name for name, _ in feed_calls]
    for api in ("DescribeInstanceTypes", "DescribeInstanceTypeOfferings", "DescribeSpotPriceHistory"):
        assert names.count(api) == 2  # once per region
        assert all(params["MaxResults"] == 5 for name, params in feed_calls if name == api)
    spot_params = [params for name, params in feed_calls if name == "DescribeSpotPriceHistory"]
    assert all(p["StartTime"] == NOW and p["ProductDescriptions"] == [LINUX, LINUX_VPC] for p in spot_params)
    # the Pricing API failed once; the feed did not ask it again for every other pool
    assert [name for name, _ in pricing_calls] == ["GetProducts"]

    history = feed.spot_price_history("us-east-1", ["g5.xlarge"], NOW - timedelta(days=1), NOW)
    assert sorted(p.zone for p in history) == _moto_zones(ec2["us-east-1"], "g5.xlarge")
    assert all(p.instance_type == "g5.xlarge" and p.changed_at.tzinfo is not None for p in history)


@pytest.mark.integration
def test_moto_discovers_every_whole_gpu_type(moto_url: str) -> None:
    ec2 = _client("ec2", "us-west-2", moto_url)
    feed = AwsPriceFeed({"us-west-2": ec2})  # no Pricing client, no fallback: spot offerings only

    offerings = feed.offerings(NOW)

    types = {o.instance_type: o for o in offerings}
    assert {"p4d.24xlarge", "g5.xlarge", "g4dn.xlarge"} <= set(types)
    assert all(o.capacity_type is CapacityType.SPOT for o in offerings)
    assert not any(t.startswith(("m5.", "c5.", "t3.")) for t in types)
    assert not any(o.accelerator_count < 1 for o in offerings)  # fractional g6f types are left out
    if "p4de.24xlarge" in types:
        assert (types["p4de.24xlarge"].accelerator, types["p4de.24xlarge"].gpu_memory_gib) == ("A100-80GB", 80)
    if "p3dn.24xlarge" in types:
        assert (types["p3dn.24xlarge"].accelerator, types["p3dn.24xlarge"].gpu_memory_gib) == ("V100-32GB", 32)
    zones = _moto_zones(ec2, "g5.xlarge")
    assert sorted(o.zone for o in offerings if o.instance_type == "g5.xlarge") == zones


# -- exact flow with Stubbers --------------------------------------------------------------------------------------


def _gpu_type(name: str, gpu: str, count: int, gpu_mib: int, vcpus: int, mib: int) -> dict[str, Any]:
    return {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": vcpus},
        "MemoryInfo": {"SizeInMiB": mib},
        "GpuInfo": {
            "Gpus": [{"Name": gpu, "Manufacturer": "NVIDIA", "Count": count, "MemoryInfo": {"SizeInMiB": gpu_mib}}],
            "TotalGpuMemoryInMiB": gpu_mib * count,
        },
    }


def _spot(instance_type: str, zone: str, product: str, price: str, at: datetime) -> dict[str, Any]:
    return {
        "AvailabilityZone": zone,
        "InstanceType": instance_type,
        "ProductDescription": product,
        "SpotPrice": price,
        "Timestamp": at,
    }


def g5_xlarge_product(hourly: str = "1.0060000000") -> dict[str, Any]:
    """A GetProducts PriceList entry in the real AWS shape (written by hand: one product, OnDemand and Reserved)."""
    sku = "JKTA8FR9TZ6TRHXG"
    return {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": "g5.xlarge",
                "instanceFamily": "GPU instance",
                "vcpu": "4",
                "memory": "16 GiB",
                "gpu": "1",
                "gpuMemory": "24 GiB",
                "regionCode": "us-east-1",
                "location": "US East (N. Virginia)",
                "locationType": "AWS Region",
                "operatingSystem": "Linux",
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "capacitystatus": "Used",
                "licenseModel": "No License required",
                "marketoption": "OnDemand",
                "operation": "RunInstances",
                "usagetype": "BoxUsage:g5.xlarge",
                "servicecode": "AmazonEC2",
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "endRange": "Inf",
                            "description": "$1.006 per On Demand Linux g5.xlarge Instance Hour",
                            "appliesTo": [],
                            "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                            "beginRange": "0",
                            "pricePerUnit": {"USD": hourly},
                        }
                    },
                    "sku": sku,
                    "effectiveDate": "2026-10-01T00:00:00Z",
                    "offerTermCode": "JRTCKXETXF",
                    "termAttributes": {},
                }
            },
            "Reserved": {
                f"{sku}.4NA7Y494T4": {
                    "priceDimensions": {
                        f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "description": "Linux/UNIX (Amazon VPC), g5.xlarge reserved instance applied",
                            "pricePerUnit": {"USD": "0.6030000000"},
                        }
                    },
                    "sku": sku,
                    "offerTermCode": "4NA7Y494T4",
                    "termAttributes": {"LeaseContractLength": "1yr", "PurchaseOption": "No Upfront"},
                }
            },
        },
        "version": "20261001000000",
        "publicationDate": "2026-10-01T00:00:00Z",
    }


def test_price_list_product_parses_to_the_on_demand_hourly_decimal() -> None:
    product = g5_xlarge_product()
    assert on_demand_price([json.dumps(product)]) == Decimal("1.006")  # the reserved 0.603 is not on-demand
    capacity_block = g5_xlarge_product("0.5000000000")
    capacity_block["product"]["attributes"]["marketoption"] = "CapacityBlock"
    assert on_demand_price([json.dumps(capacity_block), json.dumps(product)]) == Decimal("1.006")
    assert on_demand_price([json.dumps(g5_xlarge_product("0.0000000000"))]) is None
    assert on_demand_price([]) is None


def _ec2_stub(region: str = "us-east-1") -> tuple[Any, Stubber]:
    client = boto3.client("ec2", region_name=region, **CREDS)
    return client, Stubber(client)


def test_stubbed_flow_prices_pagination_and_fallback() -> None:
    ec2, stub = _ec2_stub()
    pricing = boto3.client("pricing", region_name="us-east-1", **CREDS)
    pricing_stub = Stubber(pricing)
    names = ["g5.xlarge", "p4de.24xlarge"]
    stub.add_response(
        "describe_instance_type_offerings",
        {
            "InstanceTypeOfferings": [
                {"InstanceType": "g5.xlarge", "LocationType": "availability-zone", "Location": "us-east-1a"},
                {"InstanceType": "g5.xlarge", "LocationType": "availability-zone", "Location": "us-east-1b"},
                {"InstanceType": "p4de.24xlarge", "LocationType": "availability-zone", "Location": "us-east-1a"},
            ]
        },
        {
            "LocationType": "availability-zone",
            "Filters": [{"Name": "instance-type", "Values": names}],
            "MaxResults": 5,
        },
    )
    stub.add_response(
        "describe_instance_types",
        {
            "InstanceTypes": [
                _gpu_type("g5.xlarge", "A10G", 1, 22888, 4, 16384),
                _gpu_type("p4de.24xlarge", "A100", 8, 81920, 96, 1179648),
            ]
        },
        {"InstanceTypes": names, "MaxResults": 5},
    )
    spot_params = {"StartTime": NOW, "InstanceTypes": names, "ProductDescriptions": [LINUX, LINUX_VPC]}
    stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                _spot("g5.xlarge", "us-east-1a", LINUX, "0.400000", NOW - timedelta(hours=3)),
                _spot("g5.xlarge", "us-east-1a", LINUX_VPC, "0.300000", NOW - timedelta(minutes=10)),
                _spot("g5.xlarge", "us-east-1b", LINUX_VPC, "0.390000", NOW - timedelta(hours=5)),
            ],
            "NextToken": "page-2",
        },
        {**spot_params, "MaxResults": 5},
    )
    stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                _spot("g5.xlarge", "us-east-1a", LINUX, "0.420000", NOW - timedelta(hours=1)),
                _spot("p4de.24xlarge", "us-east-1a", LINUX, "12.000000", NOW - timedelta(days=2)),
            ],
            "NextToken": "",
        },
        {**spot_params, "MaxResults": 5, "NextToken": "page-2"},
    )
    pricing_stub.add_response(
        "get_products", {"FormatVersion": "aws_v1", "PriceList": [json.dumps(g5_xlarge_product())]}, None
    )
    pricing_stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []}, None)
    advisor = SpotAdvisor.from_json({"spot_advisor": {"us-east-1": {"Linux": {"g5.xlarge": {"r": 1, "s": 70}}}}})
    feed = AwsPriceFeed(
        {"us-east-1": ec2},
        pricing,
        instance_types=names,
        advisor=advisor,
        on_demand_fallback={("us-east-1", "p4de.24xlarge"): Decimal("40.9657")},
        page_size=5,
    )

    with stub, pricing_stub:
        offerings = feed.offerings(NOW)
        stub.assert_no_pending_responses()
        pricing_stub.assert_no_pending_responses()

    got = {(o.zone, o.instance_type, o.capacity_type.value): o for o in offerings}
    assert {k: (v.hourly_usd, v.price.source, v.price.estimated) for k, v in got.items()} == {
        ("us-east-1a", "g5.xlarge", "spot"): (Decimal("0.42"), "aws:spot-price-history", False),
        ("us-east-1b", "g5.xlarge", "spot"): (Decimal("0.39"), "aws:spot-price-history", False),
        ("us-east-1a", "g5.xlarge", "on_demand"): (Decimal("1.006"), "aws:pricing-api", False),
        ("us-east-1b", "g5.xlarge", "on_demand"): (Decimal("1.006"), "aws:pricing-api", False),
        ("us-east-1a", "p4de.24xlarge", "spot"): (Decimal("12"), "aws:spot-price-history", False),
        ("us-east-1a", "p4de.24xlarge", "on_demand"): (Decimal("40.9657"), "catalog", True),
    }
    p4de = got[("us-east-1a", "p4de.24xlarge", "spot")]
    assert (p4de.accelerator, p4de.accelerator_count, p4de.gpu_memory_gib, p4de.memory_gib) == (
        "A100-80GB",
        8,
        80,
        Decimal(1152),
    )
    assert p4de.interruption_rate_per_hour == pytest.approx(rate_per_hour(0.125))
    assert got[("us-east-1a", "g5.xlarge", "spot")].interruption_rate_per_hour == pytest.approx(rate_per_hour(0.075))
    # the hardware is cached: a second refresh asks only for zones and prices
    stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": []}, None)
    with stub:
        assert feed.offerings(NOW) == []


def test_stubbed_spot_price_history_window_follows_next_token() -> None:
    ec2, stub = _ec2_stub("us-west-2")
    start, end = NOW - timedelta(days=7), NOW
    params = {
        "StartTime": start,
        "EndTime": end,
        "InstanceTypes": ["p5.48xlarge"],
        "ProductDescriptions": [LINUX, LINUX_VPC],
    }
    stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [_spot("p5.48xlarge", "us-west-2b", LINUX, "30.1", NOW - timedelta(days=1))],
            "NextToken": "t1",
        },
        {**params, "MaxResults": 5},
    )
    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [_spot("p5.48xlarge", "us-west-2b", LINUX, "29.5", NOW - timedelta(days=8))]},
        {**params, "MaxResults": 5, "NextToken": "t1"},
    )
    feed = AwsPriceFeed({"us-west-2": ec2}, page_size=5)
    with stub:
        points = feed.spot_price_history("us-west-2", ["p5.48xlarge"], start, end)
    assert [(p.hourly_usd, p.changed_at) for p in points] == [
        (Decimal("29.5"), NOW - timedelta(days=8)),  # the price in effect at `start`
        (Decimal("30.1"), NOW - timedelta(days=1)),
    ]


def test_pricing_api_failure_falls_back_and_is_not_retried_for_other_pools() -> None:
    ec2, stub = _ec2_stub()
    pricing = boto3.client("pricing", region_name="us-east-1", **CREDS)
    pricing_stub = Stubber(pricing)
    names = ["g5.xlarge", "g6.xlarge"]
    stub.add_response(
        "describe_instance_type_offerings",
        {"InstanceTypeOfferings": [{"InstanceType": n, "Location": "us-east-1c"} for n in names]},
        None,
    )
    stub.add_response(
        "describe_instance_types",
        {
            "InstanceTypes": [
                _gpu_type("g5.xlarge", "A10G", 1, 22888, 4, 16384),
                _gpu_type("g6.xlarge", "L4", 1, 22888, 4, 16384),
            ]
        },
        None,
    )
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": []}, None)
    pricing_stub.add_client_error("get_products", "AccessDeniedException", "not authorized", 400)
    fallback = {("us-east-1", "g5.xlarge"): Decimal("1.006"), ("us-east-1", "g6.xlarge"): Decimal("0.8048")}
    feed = AwsPriceFeed({"us-east-1": ec2}, pricing, instance_types=names, on_demand_fallback=fallback)
    with stub, pricing_stub:
        offerings = feed.offerings(NOW)
        pricing_stub.assert_no_pending_responses()
    assert [(o.instance_type, o.capacity_type, o.hourly_usd, o.price.estimated) for o in offerings] == [
        ("g5.xlarge", CapacityType.ON_DEMAND, Decimal("1.006"), True),
        ("g6.xlarge", CapacityType.ON_DEMAND, Decimal("0.8048"), True),
    ]
    assert offerings[1].accelerator == "L4" and offerings[1].gpu_memory_gib == 24


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("RequestLimitExceeded", "throttled"),
        ("Throttling", "throttled"),
        ("UnauthorizedOperation", "credentials"),
        ("AuthFailure", "credentials"),
        ("InternalError", "failed (InternalError)"),
    ],
)
def test_ec2_client_errors_become_feed_errors_naming_region_and_api(code: str, says: str) -> None:
    ec2, stub = _ec2_stub("eu-west-1")
    stub.add_client_error("describe_instance_type_offerings", code, "Request limit exceeded.", 503)
    feed = AwsPriceFeed({"eu-west-1": ec2}, instance_types=["g5.xlarge"])
    with stub, pytest.raises(FeedError) as raised:
        feed.offerings(NOW)
    message = str(raised.value)
    assert raised.value.feed == "aws"
    assert "eu-west-1" in message and "DescribeInstanceTypeOfferings" in message and says in message


def test_spot_history_auth_error_names_the_api() -> None:
    ec2, stub = _ec2_stub()
    stub.add_client_error("describe_spot_price_history", "UnauthorizedOperation", "You are not authorized", 403)
    feed = AwsPriceFeed({"us-east-1": ec2})
    with stub, pytest.raises(FeedError, match=r"DescribeSpotPriceHistory in us-east-1 was refused"):
        feed.spot_price_history("us-east-1", ["g5.xlarge"], NOW - timedelta(hours=1))


def test_gpu_hardware_mapping() -> None:
    assert gpu_instance_type({"InstanceType": "m5.large", "VCpuInfo": {"DefaultVCpus": 2}}) is None
    fractional = _gpu_type("g6f.large", "L4", 0, 2861, 2, 8192)
    assert gpu_instance_type(fractional) is None
    v100 = gpu_instance_type(_gpu_type("p3dn.24xlarge", "V100", 8, 32768, 96, 786432))
    assert v100 is not None and (v100.accelerator, v100.gpu_memory_gib) == ("V100-32GB", 32)
    h200 = gpu_instance_type(_gpu_type("p5e.48xlarge", "H200", 8, 144384, 192, 2097152))
    assert h200 is not None and (h200.accelerator, h200.gpu_memory_gib, h200.memory_gib) == ("H200", 141, 2048)
    new = gpu_instance_type(_gpu_type("g7.xlarge", "RTX PRO 4500", 1, 32768, 4, 16384))
    assert new is not None and (new.accelerator, new.gpu_memory_gib) == ("RTX-PRO-4500", 32)


def test_band_rates_are_monotonic_and_described() -> None:
    bands = [Band.of(i) for i in range(5)]
    assert [b.monthly_fraction for b in bands] == [0.025, 0.075, 0.125, 0.175, 0.25]
    rates = [b.rate_per_hour for b in bands]
    assert rates == sorted(rates) and rates[1] == pytest.approx(-math.log(0.925) / 720)
    assert bands[4].describe() == "aws-spot-advisor band 4 (>20%/month)"


def test_fetch_advisor_uses_the_injected_fetch_and_wraps_failures() -> None:
    body = gzip.compress(json.dumps({"spot_advisor": {"eu-west-1": {"Linux": {"p3.2xlarge": {"r": 4}}}}}).encode())
    asked: list[str] = []

    def http_get(url: str) -> bytes:
        asked.append(url)
        return body

    advisor = fetch_advisor(http_get)
    assert asked == [SPOT_ADVISOR_URL]
    band = advisor.band("eu-west-1", "p3.2xlarge")
    assert band is not None and band.label == ">20%"

    def down(url: str) -> bytes:
        raise ConnectionError("no route to host")

    with pytest.raises(FeedError, match="could not fetch"):
        fetch_advisor(down)
    with pytest.raises(FeedError, match="unusable document"):
        fetch_advisor(lambda url: b"<html>not json</html>")


# -- real captured shapes (../shared/data) -------------------------------------------------------------------------


@pytest.mark.integration
def test_cli_describe_spot_price_history_example_parses() -> None:
    doc = json.loads(shared_file("fixtures/aws-cli-examples/describe-spot-price-history_linux-vpc.json").read_text())
    points = parse_spot_price_history(doc)
    assert [(p.instance_type, p.zone, p.hourly_usd) for p in points] == [
        ("m1.xlarge", "us-west-1a", Decimal("0.08")),
        ("m1.xlarge", "us-west-1c", Decimal("0.08")),
    ]
    assert points[0].changed_at == datetime(2014, 1, 6, 4, 32, 53, tzinfo=UTC)
    latest = latest_spot_prices(points)  # only the legacy VPC description: accepted
    assert set(latest) == {("m1.xlarge", "us-west-1a"), ("m1.xlarge", "us-west-1c")}


@pytest.mark.integration
def test_2022_spot_price_capture_parses() -> None:
    points = read_spot_price_csv(shared_file("aws-spot-price-history/2022-05-31_linux_spot_prices.csv"))
    assert len(points) > 9000
    assert all(p.hourly_usd > 0 and p.changed_at.tzinfo is UTC and p.zone_id and not p.zone for p in points)
    assert all(p.product_description == LINUX for p in points)
    first = points[0]
    assert (first.zone_id, first.instance_type, first.hourly_usd) == ("euw3-az2", "g4dn.4xlarge", Decimal("0.4664"))
    assert first.changed_at == datetime(2022, 5, 31, 18, 20, 41, tzinfo=UTC)
    newest: dict[tuple[str, str], datetime] = {}
    for p in points:
        key = (p.instance_type, p.zone_id)
        newest[key] = max(newest.get(key, p.changed_at), p.changed_at)
    latest = latest_spot_prices(points)
    assert {k: v.changed_at for k, v in latest.items()} == newest


@pytest.mark.integration
def test_spot_advisor_feed_and_bands_csv_agree() -> None:
    raw = shared_file("fixtures/aws-spot-advisor/spot-advisor-data_2021-02-10.json.gz").read_bytes()
    advisor = SpotAdvisor.from_json(raw)  # gzip bytes, as published on S3 with Content-Encoding
    assert len(advisor) > 5_000 and "us-east-1" in advisor.regions
    p3 = advisor.band("us-east-1", "p3.2xlarge")
    g4 = advisor.band("us-east-1", "g4dn.xlarge")
    assert p3 is not None and (p3.index, p3.label, p3.savings_pct) == (4, ">20%", 70)
    assert g4 is not None and (g4.index, g4.label) == (1, "5-10%")
    assert advisor.band("us-east-1", "p3.2xlarge", os="Windows") is not None
    assert advisor.band("us-east-1", "no-such.type") is None

    table = SpotAdvisor.from_bands_csv(shared_file("spot-advisor/spot-advisor-gpu-interruption-bands.csv"))
    assert table.as_of == "2021-02-10" and len(table) > 500
    for (region, os_name, instance_type), band in table.items():
        from_feed = advisor.band(region, instance_type, os_name)
        assert from_feed is not None and (from_feed.index, from_feed.label) == (band.index, band.label)
        assert from_feed.rate_per_hour == pytest.approx(band.rate_per_hour)
