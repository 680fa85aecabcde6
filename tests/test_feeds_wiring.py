"""Feeds enabled by configuration reach the broker's pools: AWS against a moto server and Azure against a local
Retail Prices endpoint, refreshed by `overspill prices refresh`, then served by GET /v1/pools."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from broker.app import create_app
from broker.cli.main import app
from broker.config.settings import DEV_API_KEY, Settings
from broker.runtime import build_runtime
from tests.azure_fake import AzureFake
from tests.moto_server import stop_threaded


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server_module = pytest.importorskip("moto.server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    stop_threaded(server)


def _last_json(output: str) -> list[dict[str, object]]:
    """The CLI's JSON line (the in-process moto server prints its own notes to stdout)."""
    return json.loads(output.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.integration
def test_configured_feeds_fill_the_pools(moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with AzureFake() as azure:
        env = {
            "OVERSPILL_DATABASE_URL": f"sqlite:///{tmp_path / 'feeds.db'}",
            "OVERSPILL_SIMULATED": "false",
            "OVERSPILL_AWS_REGIONS": '["us-east-1"]',
            "OVERSPILL_AWS_INSTANCE_TYPES": '["p4d.24xlarge", "g5.xlarge"]',
            "OVERSPILL_AWS_ENDPOINT_URL": moto_endpoint,
            "OVERSPILL_AZURE_REGIONS": '["eastus"]',
            "OVERSPILL_AZURE_PRICES_URL": azure.prices_url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        catalog = tmp_path / "aws_vms.csv"
        catalog.write_text(
            "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\n"
            "p4d.24xlarge,A100,8,96,1152,32.7726,,us-east-1,\n"
        )
        imported = CliRunner().invoke(app, ["prices", "import-catalog", str(catalog), "--json"])
        assert imported.exit_code == 0, imported.output
        out = CliRunner().invoke(app, ["prices", "refresh", "--json"])
        assert out.exit_code == 0, out.output
        feeds = {r["feed"]: r for r in _last_json(out.output)}
        assert feeds["prices:aws"]["ok"] and feeds["prices:aws"]["pools"] > 0
        assert feeds["prices:azure"]["ok"] and feeds["prices:azure"]["pools"] > 0

        rt = build_runtime(Settings())
        api = TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
        pools = api.get("/v1/pools", params={"limit": 10_000}).json()["items"]
        aws = [p for p in pools if p["provider"] == "aws" and p["feed"] == "prices:aws"]
        assert {p["instance_type"] for p in aws} == {"p4d.24xlarge", "g5.xlarge"}
        assert all(p["zone"].startswith("us-east-1") and p["feed"] == "prices:aws" for p in aws)
        assert {p["accelerator"] for p in aws} == {"A100", "A10G"}
        fallback = [p for p in aws if p["capacity_type"] == "on_demand" and p["feed"] == "prices:aws"]
        assert fallback and {p["instance_type"] for p in fallback} == {"p4d.24xlarge"}  # Pricing API absent in moto
        assert all(p["estimated"] and p["hourly_usd"] == "32.7726" for p in fallback)
        assert fallback[0]["usd_per_gpu_hour"] == "4.096575"
        assert not any(p["simulated"] for p in pools)
        az = {(p["instance_type"], p["capacity_type"]): p for p in pools if p["provider"] == "azure"}
        assert az[("Standard_NC24ads_A100_v4", "on_demand")]["hourly_usd"] == "3.673"
        assert az[("Standard_NC24ads_A100_v4", "spot")]["hourly_usd"] == "0.67877"

        azure.fail("prices", 500)
        again = CliRunner().invoke(app, ["prices", "refresh", "--json"])
        assert again.exit_code == 1
        failed = {r["feed"]: r for r in _last_json(again.output)}
        assert not failed["prices:azure"]["ok"] and "500" in failed["prices:azure"]["error"]
        kept = api.get("/v1/pools", params={"provider": "azure"}).json()["items"]
        assert kept and all(p["stale"] for p in kept)


@pytest.mark.integration
def test_the_azure_feed_sizes_pools_through_the_configured_arm_client(tmp_path: Path) -> None:
    """The feed's ARM client is the launch adapter's (`azure_compute_client`): the endpoint override and its
    credential reach the vmSizes call, so a configured broker never sizes pools against another ARM."""
    from datetime import UTC, datetime

    from broker.config.feeds import build_price_feeds
    from broker.store.db import make_engine
    from tests.azure_fake import default_vm_sizes

    sizes = default_vm_sizes()
    for s in sizes["eastus"]:
        if s["name"] == "Standard_NC24ads_A100_v4":
            s["memoryInMB"] = 230400  # 225 GiB: only ARM says so (the built-in table has 220)
    with AzureFake(vm_sizes=sizes) as azure:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 'feeds.db'}",
            simulated=False,
            azure_regions=["eastus"],
            azure_prices_url=azure.prices_url,
            azure_subscription_id="00000000-0000-0000-0000-000000000001",
            azure_endpoint=azure.arm_url,
            azure_static_test_token=True,
        )
        [feed] = build_price_feeds(settings, make_engine(settings))
        offerings = feed.offerings(datetime.now(UTC))
        calls = azure.recorded("vmsizes")
    [a100] = [o for o in offerings if o.instance_type == "Standard_NC24ads_A100_v4" and o.capacity_type.value == "spot"]
    assert a100.memory_gib == 225
    assert len(calls) == 1 and calls[0].headers["Authorization"].startswith("Bearer ")
