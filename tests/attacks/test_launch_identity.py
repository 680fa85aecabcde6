"""Attacks on what a launched training instance exposes: its role's credentials through the instance metadata
service, and the job's data left on its disk.

Finding: instances were launched with the account's IMDS defaults (IMDSv1 open, any hop count) and the AMI's root
volume as it came (unencrypted unless the account defaults otherwise). A training container, running arbitrary user
code behind Docker's bridge, could then read the instance role's credentials with one unauthenticated GET to
169.254.169.254, and a volume snapshot or a leftover volume held the job's data in the clear. The broker now launches
with IMDSv2 required and a PUT response hop limit of 1 (the token answer cannot cross the bridge into a container;
the agent on the host still gets it) and an encrypted root volume deleted with the instance.

The instances are launched through the adapter built from settings, as in production, on a moto EC2 server, and
their metadata options and volumes are read back from EC2 (what AWS enforces on the instance)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from broker.config.providers import build_providers
from broker.config.settings import Settings
from providers.aws import parse_instance_ref
from tests.moto_server import moto_client, running_moto_server
from tests.provider_contract import ContractEnv
from tests.test_provider_aws import offering

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.fixture
def launched(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, Any]]:
    """An instance the broker launched with its default launch settings, as EC2 describes it."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    ec2 = moto_client("ec2", REGION, moto_url)
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    settings = Settings(
        simulated=False, aws_launch=True, aws_regions=[REGION], aws_image_id=ami, aws_endpoint_url=moto_url
    )
    (provider,) = build_providers(settings)
    inst = provider.launch(ContractEnv(provider=provider, offering=offering(), broker_id=settings.broker_id).request())
    described = ec2.describe_instances(InstanceIds=[parse_instance_ref(inst.id)[1]])
    return ec2, described["Reservations"][0]["Instances"][0]


@pytest.mark.integration
def test_a_training_container_cannot_fetch_the_instance_role_credentials_from_imds(
    launched: tuple[Any, dict[str, Any]],
) -> None:
    _, raw = launched
    options = raw["MetadataOptions"]
    assert options["HttpTokens"] == "required", "IMDSv1 open: one GET from the container returns the credentials"
    assert options["HttpPutResponseHopLimit"] == 1, "a token answer with a hop to spare reaches a bridged container"
    assert options.get("HttpEndpoint", "enabled") == "enabled", "the agent on the host still needs IMDS"


@pytest.mark.integration
def test_the_jobs_data_on_the_root_volume_is_not_readable_from_a_snapshot_or_a_leftover_volume(
    launched: tuple[Any, dict[str, Any]],
) -> None:
    ec2, raw = launched
    root = next(m for m in raw["BlockDeviceMappings"] if m["DeviceName"] == raw["RootDeviceName"])
    assert root["Ebs"]["DeleteOnTermination"] is True, "the volume would outlive the instance"
    volume = ec2.describe_volumes(VolumeIds=[root["Ebs"]["VolumeId"]])["Volumes"][0]
    assert volume["Encrypted"] is True, "the job's data sits in the clear on the volume"
