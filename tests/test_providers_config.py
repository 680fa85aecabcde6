"""`broker.config.providers.build_providers` for AWS, GCP and Azure: the settings that enable launching there build
the real SDK clients (boto3, google-cloud-compute over REST with Application Default Credentials,
azure-mgmt-compute), each adapter with the broker's retry policy and timeout and each SDK's own retries off, and
with the launch settings (identity, security groups, IMDSv2, images per region, extra tags and labels, disks); a
setting left out or malformed is a `ValueError` naming its `OVERSPILL_` variable; the test-only credentials stay
test-only; what each launching cloud's instances bill beside compute (`broker.config.launch.instance_extras`).

The built providers are driven against moto and the local Compute Engine and ARM stand-ins
(tests/gcp_compute_fake.py, tests/azure_compute_fake.py) through their endpoint overrides.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from broker.config.launch import instance_extras
from broker.config.providers import build_providers
from broker.config.settings import Settings
from providers.aws import AwsProvider, parse_instance_ref
from providers.azure import AzureProvider
from providers.base import InstanceState, Throttled
from providers.gcp import GcpProvider, instance_name
from providers.model import CostKind
from tests.azure_compute_fake import AzureComputeFake
from tests.gcp_compute_fake import GcpComputeFake, adc_file
from tests.moto_server import moto_client, running_moto_server
from tests.provider_contract import ContractEnv
from tests.test_provider_aws import offering as aws_offering
from tests.test_provider_azure import IMAGE as AZURE_IMAGE
from tests.test_provider_azure import RG, SSH_KEY, SUB, SUBNET
from tests.test_provider_azure import offering as azure_offering
from tests.test_provider_gcp import IMAGE as GCP_IMAGE
from tests.test_provider_gcp import offering as gcp_offering

PRODUCTION = {
    "env": "production",
    "bootstrap_api_key": "ovs_prodkey1_" + "k" * 40,
    "callback_secret": "c" * 40,
    "metrics_token": "m" * 40,
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
        **overrides,
    }
    return Settings(**values)


def aws_settings(endpoint: str | None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "simulated": False,
        "aws_launch": True,
        "aws_regions": ["us-east-1"],
        "aws_image_id": "ami-0123456789abcdef0",
        "aws_endpoint_url": endpoint,
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
    assert inst.state is InstanceState.PENDING and inst.id.endswith(instance_name(req.launch_token))
    (insert,) = gcp_fake.recorded("POST", "/instances")
    assert insert.body["disks"][0]["initializeParams"] == {
        "sourceImage": GCP_IMAGE,
        "diskSizeGb": "200",
        "diskType": "zones/us-central1-a/diskTypes/pd-balanced",
    }
    assert "serviceAccounts" not in insert.body
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
    assert inst.state is InstanceState.PENDING
    (put,) = azure_fake.recorded("PUT")
    props = put.body["properties"]
    assert put.body["location"] == "eastus" and props["evictionPolicy"] == "Deallocate"
    assert props["storageProfile"]["imageReference"] == AZURE_IMAGE
    assert props["storageProfile"]["osDisk"]["diskSizeGB"] == 200
    assert props["storageProfile"]["osDisk"]["managedDisk"] == {"storageAccountType": "StandardSSD_LRS"}
    assert "identity" not in put.body
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


# -- the launch settings --------------------------------------------------------------------------------------------

IDENTITY = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/jobs"


def test_gcp_launch_settings_reach_the_vm(gcp_fake: GcpComputeFake) -> None:
    regional = "projects/proj/global/images/train-usc1"
    settings = gcp_settings(
        gcp_fake.endpoint,
        gcp_anonymous_credentials=True,
        gcp_image="",
        gcp_images={"us-central1": regional},
        gcp_service_account="jobs@proj.iam.gserviceaccount.com",
        gcp_extra_labels={"cost-center": "ml"},
        gcp_disk_gb=500,
        gcp_disk_type="pd-ssd",
    )
    (provider,) = build_providers(settings)
    provider.launch(ContractEnv(provider=provider, offering=gcp_offering()).request())
    (insert,) = gcp_fake.recorded("POST", "/instances")
    assert insert.body["serviceAccounts"][0]["email"] == "jobs@proj.iam.gserviceaccount.com"
    assert insert.body["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert insert.body["disks"][0]["initializeParams"] == {
        "sourceImage": regional,
        "diskSizeGb": "500",
        "diskType": "zones/us-central1-a/diskTypes/pd-ssd",
    }
    assert insert.body["labels"]["cost-center"] == "ml"


def test_azure_launch_settings_reach_the_vm(azure_fake: AzureComputeFake) -> None:
    here = {"id": f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/images/train"}
    settings = azure_settings(
        azure_fake.url,
        azure_static_test_token=True,
        azure_image_reference={},
        azure_image_references={"EastUS": here},
        azure_managed_identity_id=IDENTITY,
        azure_extra_tags={"cost-center": "ml"},
        azure_os_disk_gb=128,
        azure_os_disk_type="Premium_LRS",
    )
    (provider,) = build_providers(settings)
    provider.launch(ContractEnv(provider=provider, offering=azure_offering()).request())
    (put,) = azure_fake.recorded("PUT")
    assert put.body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    assert put.body["properties"]["storageProfile"]["imageReference"] == here
    assert put.body["properties"]["storageProfile"]["osDisk"]["managedDisk"] == {"storageAccountType": "Premium_LRS"}
    assert put.body["tags"]["cost-center"] == "ml"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.mark.integration
def test_aws_launch_settings_reach_the_instance(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    ec2 = moto_client("ec2", "us-east-1", moto_url)
    ssm = moto_client("ssm", "us-east-1", moto_url)
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    ssm.put_parameter(Name="/overspill/ami", Value=ami, Type="String", Overwrite=True)
    profile = moto_client("iam", "us-east-1", moto_url).create_instance_profile(InstanceProfileName="jobs")
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    group = ec2.create_security_group(GroupName="jobs", Description="jobs", VpcId=vpc)["GroupId"]
    settings = aws_settings(
        moto_url,
        aws_image_id="",
        aws_image_ids={"us-east-1": "resolve:ssm:/overspill/ami"},
        aws_instance_profile=profile["InstanceProfile"]["Arn"],
        aws_security_group_ids={"us-east-1": [group]},
        aws_extra_tags={"cost-center": "ml"},
        aws_root_volume_gb=100,
    )
    (provider,) = build_providers(settings)
    assert isinstance(provider, AwsProvider)
    inst = provider.launch(
        ContractEnv(provider=provider, offering=aws_offering(), broker_id=settings.broker_id).request()
    )
    raw = ec2.describe_instances(InstanceIds=[parse_instance_ref(inst.id)[1]])["Reservations"][0]["Instances"][0]
    assert raw["ImageId"] == ami, "the region's image, read from SSM"
    assert raw["IamInstanceProfile"]["Arn"] == profile["InstanceProfile"]["Arn"]
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == [group]
    assert raw["MetadataOptions"]["HttpTokens"] == "required", "IMDSv2 by default"
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}["cost-center"] == "ml"
    volume_id = raw["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    volume = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
    assert (volume["Size"], volume["Encrypted"]) == (100, True)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"aws_image_id": ""}, "OVERSPILL_AWS_IMAGE_IDS"),
        ({"aws_image_ids": {"us-east-1": "not-an-ami"}}, "OVERSPILL_AWS_IMAGE_IDS['us-east-1']"),
        ({"aws_image_id": "ubuntu-22.04"}, "OVERSPILL_AWS_IMAGE_ID"),
        ({"aws_image_ids": {"eu-west-9": "ami-0123456789abcdef0"}}, "OVERSPILL_AWS_IMAGE_IDS names eu-west-9"),
        ({"aws_image_ids": {"us-east-1": "resolve:ssm:bad name!"}}, "OVERSPILL_AWS_IMAGE_IDS"),
        ({"aws_instance_profile": "arn:aws:iam::123:role/not-a-profile"}, "OVERSPILL_AWS_INSTANCE_PROFILE"),
        ({"aws_security_group_ids": ["default"]}, "OVERSPILL_AWS_SECURITY_GROUP_IDS"),
        ({"aws_security_group_ids": {"us-west-2": ["sg-0123456789abcdef0"]}}, "OVERSPILL_AWS_SECURITY_GROUP_IDS"),
        ({"aws_extra_tags": {"aws:owner": "x"}}, "OVERSPILL_AWS_EXTRA_TAGS"),
        ({"aws_extra_tags": {"overspill:job": "x"}}, "OVERSPILL_AWS_EXTRA_TAGS"),
        ({"aws_root_volume_gb": 4}, "OVERSPILL_AWS_ROOT_VOLUME_GB"),
        ({"aws_root_volume_type": "st1"}, "OVERSPILL_AWS_ROOT_VOLUME_TYPE"),
    ],
)
def test_bad_aws_launch_settings_stop_the_broker_naming_the_variable(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError) as caught:
        build_providers(aws_settings("http://127.0.0.1:9", **overrides))
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"gcp_image": ""}, "OVERSPILL_GCP_IMAGES"),
        ({"gcp_images": {"europe-west4": "img"}}, "OVERSPILL_GCP_IMAGES names europe-west4"),
        ({"gcp_service_account": "not an email"}, "OVERSPILL_GCP_SERVICE_ACCOUNT"),
        ({"gcp_extra_labels": {"Cost Center": "ml"}}, "OVERSPILL_GCP_EXTRA_LABELS"),
        ({"gcp_extra_labels": {"team": "ML Research"}}, "OVERSPILL_GCP_EXTRA_LABELS['team']"),
        ({"gcp_extra_labels": {"overspill-job": "x"}}, "OVERSPILL_GCP_EXTRA_LABELS"),
        ({"gcp_disk_gb": 5}, "OVERSPILL_GCP_DISK_GB"),
        ({"gcp_disk_type": "local-ssd"}, "OVERSPILL_GCP_DISK_TYPE"),
    ],
)
def test_bad_gcp_launch_settings_stop_the_broker_naming_the_variable(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError) as caught:
        build_providers(gcp_settings("http://127.0.0.1:9", gcp_anonymous_credentials=True, **overrides))
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"azure_managed_identity_id": "jobs-identity"}, "OVERSPILL_AZURE_MANAGED_IDENTITY_ID"),
        ({"azure_image_references": {"westus2": {"id": "/x"}}}, "OVERSPILL_AZURE_IMAGE_REFERENCES names westus2"),
        ({"azure_image_reference": {"publisher": "p"}}, "OVERSPILL_AZURE_IMAGE_REFERENCE"),
        ({"azure_extra_tags": {"cost/center": "ml"}}, "OVERSPILL_AZURE_EXTRA_TAGS"),
        ({"azure_os_disk_gb": 0}, "OVERSPILL_AZURE_OS_DISK_GB"),
        ({"azure_os_disk_type": "UltraSSD_LRS"}, "OVERSPILL_AZURE_OS_DISK_TYPE"),
    ],
)
def test_bad_azure_launch_settings_stop_the_broker_naming_the_variable(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError) as caught:
        build_providers(azure_settings("http://127.0.0.1:9", azure_static_test_token=True, **overrides))
    assert named in str(caught.value)


def test_what_each_launching_clouds_instances_bill_beside_compute() -> None:
    off = instance_extras(Settings(simulated=False))
    assert off == {}, "nothing launches: nothing extra is billed (the simulated clouds have no extras)"
    extras = instance_extras(
        Settings(simulated=False, aws_launch=True, gcp_launch=True, azure_launch=True, azure_os_disk_gb=200)
    )
    aws = {c.kind: c for c in extras["aws"].charges("spot")}
    assert aws[CostKind.DISK].hourly_usd == Decimal("0.08") * 200 / 730 and aws[CostKind.DISK].unit == "GB-Hours"
    assert aws[CostKind.PUBLIC_IP].hourly_usd == Decimal("0.005")
    gcp = {c.kind: c.hourly_usd for c in extras["gcp"].charges("spot")}
    assert gcp[CostKind.PUBLIC_IP] == Decimal("0.0025"), "Google charges a Spot VM's address half"
    assert {c.kind: c.hourly_usd for c in extras["gcp"].charges("on_demand")}[CostKind.PUBLIC_IP] == Decimal("0.005")
    (azure_disk,) = extras["azure"].charges("spot")  # no public IP on Azure VMs
    assert azure_disk.quantity_per_hour == 256, "a 200 GB managed disk is billed as its 256 GiB tier"
    assert azure_disk.hourly_usd == Decimal("0.075") * 256 / 730

    priced = instance_extras(
        Settings(
            simulated=False,
            aws_launch=True,
            aws_public_ipv4=False,
            disk_usd_per_gb_month={"aws/gp3": "0.0952"},
        )
    )
    assert priced["aws"].hourly_usd("on_demand") == Decimal("0.0952") * 200 / 730
    with pytest.raises(ValueError, match="OVERSPILL_PUBLIC_IPV4_USD_PER_HOUR"):
        instance_extras(Settings(simulated=False, public_ipv4_usd_per_hour={"oracle": "0.004"}))
    with pytest.raises(ValueError, match="OVERSPILL_DISK_USD_PER_GB_MONTH"):
        instance_extras(Settings(simulated=False, aws_launch=True, aws_root_volume_type="io3"))
