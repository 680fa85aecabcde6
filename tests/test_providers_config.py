"""`broker.providers_config.build_providers` for GCP and Azure: the settings that enable launching there build the
real SDK clients (google-cloud-compute over REST with Application Default Credentials, azure-mgmt-compute), each
adapter with the broker's retry policy and timeout and each SDK's own retries off; a setting left out is a
`ValueError` naming its `OVERSPILL_` variable; the test-only credentials stay test-only.

The built providers are driven against the local Compute Engine and ARM stand-ins (tests/gcp_compute_fake.py,
tests/azure_compute_fake.py) through their endpoint overrides.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.providers_config import build_providers
from broker.settings import Settings
from providers.azure import AzureProvider
from providers.base import InstanceState, Throttled
from providers.gcp import GcpProvider, instance_name
from tests.azure_compute_fake import AzureComputeFake
from tests.gcp_compute_fake import GcpComputeFake, adc_file
from tests.provider_contract import ContractEnv
from tests.test_provider_azure import IMAGE as AZURE_IMAGE
from tests.test_provider_azure import RG, SSH_KEY, SUB, SUBNET
from tests.test_provider_azure import offering as azure_offering
from tests.test_provider_gcp import IMAGE as GCP_IMAGE
from tests.test_provider_gcp import offering as gcp_offering

PRODUCTION = {
    "env": "production",
    "bootstrap_api_key": "ovs_prodkey1_" + "k" * 40,
    "callback_secret": "c" * 40,
}


def gcp_settings(endpoint: str | None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "simulated": False,
        "gcp_launch": True,
        "gcp_project": "proj",
        "gcp_regions": ["us-central1"],
        "gcp_image": GCP_IMAGE,
        "gcp_endpoint": endpoint,
        **overrides,
    }
    return Settings(**values)


def azure_settings(endpoint: str | None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "simulated": False,
        "azure_launch": True,
        "azure_subscription_id": SUB,
        "azure_resource_group": RG,
        "azure_location": "eastus",
        "azure_subnet_id": SUBNET,
        "azure_image_reference": AZURE_IMAGE,
        "azure_ssh_public_key": SSH_KEY,
        "azure_endpoint": endpoint,
        "azure_polling_interval_seconds": 0,
        **overrides,
    }
    return Settings(**values)


@pytest.fixture
def gcp_fake() -> Iterator[GcpComputeFake]:
    with GcpComputeFake() as server:
        yield server


@pytest.fixture
def azure_fake() -> Iterator[AzureComputeFake]:
    with AzureComputeFake(SUB) as server:
        yield server


def test_nothing_is_built_unless_launching_is_enabled() -> None:
    assert build_providers(Settings(simulated=False, gcp_project="proj", azure_subscription_id=SUB)) == []


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"gcp_project": ""}, "OVERSPILL_GCP_PROJECT"),
        ({"gcp_regions": []}, "OVERSPILL_GCP_REGIONS"),
        ({"gcp_image": ""}, "OVERSPILL_GCP_IMAGE"),
    ],
)
def test_gcp_launch_without_a_required_setting_names_it(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        build_providers(gcp_settings("http://127.0.0.1:9", gcp_anonymous_credentials=True, **overrides))


def test_azure_launch_names_every_missing_setting() -> None:
    settings = azure_settings(
        "http://127.0.0.1:9", azure_static_test_token=True, azure_resource_group="", azure_ssh_public_key=""
    )
    with pytest.raises(ValueError) as caught:
        build_providers(settings)
    message = str(caught.value)
    assert "OVERSPILL_AZURE_RESOURCE_GROUP" in message and "OVERSPILL_AZURE_SSH_PUBLIC_KEY" in message
    assert "OVERSPILL_AZURE_SUBNET_ID" not in message and "OVERSPILL_AZURE_LOCATION" not in message
    with pytest.raises(ValueError, match="OVERSPILL_AZURE_IMAGE_REFERENCE"):
        build_providers(azure_settings("http://127.0.0.1:9", azure_static_test_token=True, azure_image_reference={}))


def test_azure_prices_in_a_location_the_provider_cannot_launch_in_are_refused() -> None:
    settings = azure_settings("http://127.0.0.1:9", azure_static_test_token=True, azure_regions=["eastus", "westus2"])
    with pytest.raises(ValueError, match="westus2"):
        build_providers(settings)
    ok = azure_settings("http://127.0.0.1:9", azure_static_test_token=True, azure_regions=["EastUS"])
    assert [p.name for p in build_providers(ok)] == ["azure"]


def test_test_credentials_need_an_endpoint_override_and_are_refused_in_production() -> None:
    with pytest.raises(ValueError, match="OVERSPILL_GCP_ENDPOINT"):
        build_providers(gcp_settings(None, gcp_anonymous_credentials=True))
    with pytest.raises(ValueError, match="OVERSPILL_AZURE_ENDPOINT"):
        build_providers(azure_settings(None, azure_static_test_token=True))
    with pytest.raises(ValueError, match="production"):
        build_providers(gcp_settings("http://127.0.0.1:9", gcp_anonymous_credentials=True, **PRODUCTION))
    with pytest.raises(ValueError, match="production"):
        build_providers(azure_settings("http://127.0.0.1:9", azure_static_test_token=True, **PRODUCTION))


def test_gcp_provider_from_settings_launches_with_the_configured_image_network_and_policy(
    gcp_fake: GcpComputeFake,
) -> None:
    settings = gcp_settings(
        gcp_fake.endpoint,
        gcp_anonymous_credentials=True,
        gcp_network="global/networks/gpu-burst",
        gcp_termination_action="DELETE",
        cloud_retry_attempts=4,
        cloud_timeout_seconds=7,
    )
    (provider,) = build_providers(settings)
    assert isinstance(provider, GcpProvider) and provider.name == "gcp"
    assert provider.retry.attempts == 4 and provider.timeout == 7
    req = ContractEnv(provider=provider, offering=gcp_offering(), broker_id=settings.broker_id).request()
    inst = provider.launch(req)
    assert inst.state is InstanceState.RUNNING and inst.id.endswith(instance_name(req.launch_token))
    (insert,) = gcp_fake.recorded("POST", "/instances")
    assert insert.body["disks"][0]["initializeParams"]["sourceImage"] == GCP_IMAGE
    assert insert.body["networkInterfaces"][0]["network"] == "global/networks/gpu-burst"
    assert insert.body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert "authorization" not in insert.headers, "anonymous: no credentials at all"
    assert [i.id for i in provider.list_instances()] == [inst.id]


def test_gcp_provider_uses_application_default_credentials(
    gcp_fake: GcpComputeFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc_file(tmp_path / "adc.json", "ya29.from-adc")))
    (provider,) = build_providers(gcp_settings(gcp_fake.endpoint))
    provider.launch(ContractEnv(provider=provider, offering=gcp_offering()).request())
    (insert,) = gcp_fake.recorded("POST", "/instances")
    assert insert.headers["authorization"] == "Bearer ya29.from-adc"


def test_gcp_client_library_retries_are_off_and_calls_time_out(gcp_fake: GcpComputeFake, silent_endpoint: str) -> None:
    (provider,) = build_providers(
        gcp_settings(gcp_fake.endpoint, gcp_anonymous_credentials=True, cloud_retry_attempts=1)
    )
    gcp_fake.fail("get", 503, "backendError", count=5)  # the generated `get` alone would retry this for 600 s
    with pytest.raises(Throttled):
        provider.get("us-central1-a/ovs-missing-0")
    assert len(gcp_fake.recorded("GET", "/instances/ovs-missing-0")) == 1

    settings = gcp_settings(
        silent_endpoint, gcp_anonymous_credentials=True, cloud_retry_attempts=2, cloud_timeout_seconds=0.3
    )
    (hung,) = build_providers(settings)
    started = time.monotonic()
    with pytest.raises(Throttled):
        hung.get("us-central1-a/ovs-missing-0")
    assert time.monotonic() - started < 5 and hung.retry.attempts_made == 2  # type: ignore[attr-defined]


def test_azure_provider_from_settings_launches_with_the_configured_vm(azure_fake: AzureComputeFake) -> None:
    settings = azure_settings(
        azure_fake.url,
        azure_static_test_token=True,
        azure_admin_username="trainer",
        azure_eviction_policy="Deallocate",
        cloud_retry_attempts=5,
    )
    (provider,) = build_providers(settings)
    assert isinstance(provider, AzureProvider) and provider.name == "azure" and provider.retry.attempts == 5
    inst = provider.launch(ContractEnv(provider=provider, offering=azure_offering()).request())
    assert inst.state is InstanceState.RUNNING
    (put,) = azure_fake.recorded("PUT")
    props = put.body["properties"]
    assert put.body["location"] == "eastus" and props["evictionPolicy"] == "Deallocate"
    assert props["storageProfile"]["imageReference"] == AZURE_IMAGE
    assert props["osProfile"]["adminUsername"] == "trainer"
    assert props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == SSH_KEY
    nic = props["networkProfile"]["networkInterfaceConfigurations"][0]
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"] == SUBNET
    assert put.headers["authorization"] == "Bearer overspill-static-test-token"


def test_azure_core_retries_are_off_and_calls_time_out(azure_fake: AzureComputeFake, silent_endpoint: str) -> None:
    (provider,) = build_providers(azure_settings(azure_fake.url, azure_static_test_token=True, cloud_retry_attempts=1))
    azure_fake.fail("get", 500, "InternalExecutionError", count=5)  # azure-core alone would retry a 500 three times
    with pytest.raises(Throttled):
        provider.get("ovs-missing-0")
    assert len(azure_fake.recorded("GET", "/virtualMachines/ovs-missing-0")) == 1

    settings = azure_settings(
        silent_endpoint, azure_static_test_token=True, cloud_retry_attempts=2, cloud_timeout_seconds=0.3
    )
    (hung,) = build_providers(settings)
    started = time.monotonic()
    with pytest.raises(Throttled):
        hung.get("ovs-missing-0")
    assert time.monotonic() - started < 5 and hung.retry.attempts_made == 2  # type: ignore[attr-defined]
