"""The AWS compute provider: the provider contract and the launch, interruption and multi-region flows against a
real moto server (with the launch settings: instance profile, security groups, IMDSv2, extra tags, root volume, an
image per region resolved from SSM); error mapping and the state mapping moto cannot produce (spot reclaim, self
shutdown, launch failures, policy denials) through botocore Stubbers and hand-written DescribeInstances responses in
AWS's real shape.

moto 5.2 ignores RunInstances' ClientToken and only ever records Client.UserInitiatedShutdown, see providers/aws.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from botocore.stub import Stubber  # noqa: E402

from providers.aws import (  # noqa: E402
    TAG_LAUNCH_TOKEN,
    TAG_OFFERING,
    AmiResolver,
    AwsLaunchOptions,
    AwsProvider,
    client_token,
    ensure_interruption_queue,
    instance_from_description,
    instance_ref,
    parse_instance_ref,
    transition_time,
)
from providers.base import (  # noqa: E402
    AuthError,
    ComputeProvider,
    InstanceState,
    InsufficientCapacity,
    InterruptionSource,
    InvalidRequest,
    NotFound,
    PolicyDenied,
    ProviderError,
    QuotaExceeded,
    Scope,
    Throttled,
)
from providers.model import CapacityType, Offering, Price  # noqa: E402
from providers.retry import RetryPolicy  # noqa: E402
from tests.moto_server import CREDS, moto_client, running_moto_server  # noqa: E402
from tests.provider_contract import BROKER_ID, USER_DATA, ContractEnv, ProviderContract  # noqa: E402

REGION = "us-east-1"
ZONE = "us-east-1a"
WEST = "us-west-2"
NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
UNKNOWN = "us-east-1:i-0123456789abcdef0"
IMAGE = "ghcr.io/example/train:1.0"  # the contract spec's image


def offering(
    capacity: CapacityType = CapacityType.SPOT,
    *,
    region: str = REGION,
    zone: str = ZONE,
    instance_type: str = "g5.xlarge",
) -> Offering:
    return Offering(
        provider="aws",
        region=region,
        zone=zone,
        instance_type=instance_type,
        accelerator="A10G",
        accelerator_count=1,
        gpu_memory_gib=24,
        vcpus=4,
        memory_gib=Decimal("16"),
        capacity_type=capacity,
        price=Price(Decimal("0.45"), "test", NOW),
    )


# -- moto fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def ec2(moto_url: str) -> Any:
    return moto_client("ec2", REGION, moto_url)


@pytest.fixture(scope="module")
def ami(ec2: Any) -> str:
    return str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])


def _raw(ec2: Any, instance_id: str) -> dict[str, Any]:
    _, ec2_id = parse_instance_ref(instance_id)
    return dict(ec2.describe_instances(InstanceIds=[ec2_id])["Reservations"][0]["Instances"][0])


def _by_token(ec2: Any, token: str) -> list[str]:
    pages = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_LAUNCH_TOKEN}", "Values": [token]}])
    return [i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"]]


# -- the contract --------------------------------------------------------------------------------------------------


class TestAwsContract(ProviderContract):
    @pytest.fixture(
        params=[(False, CapacityType.SPOT), (True, CapacityType.ON_DEMAND)], ids=["run-spot", "fleet-on-demand"]
    )
    def env(self, request: pytest.FixtureRequest, ec2: Any, ami: str) -> ContractEnv:
        use_fleet, capacity = request.param
        provider = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for=ami, use_fleet=use_fleet)

        def make_foreign() -> str:
            raw = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="g5.xlarge")["Instances"][0]
            return instance_ref(REGION, raw["InstanceId"])

        return ContractEnv(
            provider=provider,
            offering=offering(capacity),
            make_foreign=make_foreign,
            unknown_id=UNKNOWN,
            # stopped (not by its own shutdown, which terminates it): the EBS volume stays until it is terminated
            end_by_itself=lambda iid: ec2.stop_instances(InstanceIds=[parse_instance_ref(iid)[1]]),
        )


def test_satisfies_the_protocols(ec2: Any) -> None:
    provider = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for="ami-1")
    assert isinstance(provider, ComputeProvider) and isinstance(provider, InterruptionSource)
    assert provider.poll_interruptions() == []  # no queue configured


# -- launch on moto --------------------------------------------------------------------------------------------


def test_spot_launch_sets_market_options_user_data_and_tags(ec2: Any, ami: str) -> None:
    provider = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for=lambda o: ami)
    env = ContractEnv(provider=provider, offering=offering(CapacityType.SPOT, instance_type="p3.2xlarge"))
    req = env.request()
    inst = provider.launch(req)

    assert inst.id.startswith(f"{REGION}:i-") and inst.provider == "aws"
    assert inst.offering_key == "aws/us-east-1/us-east-1a/p3.2xlarge/spot" and inst.launch_token == req.launch_token
    raw = _raw(ec2, inst.id)
    assert raw["InstanceLifecycle"] == "spot"
    assert raw["InstanceType"] == "p3.2xlarge" and raw["Placement"]["AvailabilityZone"] == ZONE
    assert raw["ClientToken"] == req.launch_token
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags == {**req.tags.as_dict(), TAG_LAUNCH_TOKEN: req.launch_token, TAG_OFFERING: req.offering.key}
    _, ec2_id = parse_instance_ref(inst.id)
    user_data = base64.b64decode(
        ec2.describe_instance_attribute(InstanceId=ec2_id, Attribute="userData")["UserData"]["Value"]
    ).decode()
    assert user_data == req.user_data == USER_DATA  # the start-up script, as the broker rendered it
    shutdown = ec2.describe_instance_attribute(InstanceId=ec2_id, Attribute="instanceInitiatedShutdownBehavior")
    assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    volumes = ec2.describe_volumes(Filters=[{"Name": f"tag:{TAG_LAUNCH_TOKEN}", "Values": [req.launch_token]}])
    assert len(volumes["Volumes"]) == 1

    on_demand = provider.launch(ContractEnv(provider, offering(CapacityType.ON_DEMAND)).request())
    assert "InstanceLifecycle" not in _raw(ec2, on_demand.id)


def test_fleet_spot_launch_tags_the_instance_and_removes_its_template(ec2: Any, ami: str) -> None:
    provider = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for=ami, use_fleet=True)
    req = ContractEnv(provider=provider, offering=offering(CapacityType.SPOT)).request()
    inst = provider.launch(req)

    raw = _raw(ec2, inst.id)
    assert raw["InstanceLifecycle"] == "spot" and raw["InstanceType"] == "g5.xlarge"
    assert inst.tags[TAG_LAUNCH_TOKEN] == req.launch_token and inst.tags["overspill:job"] == req.tags.job_id
    _, ec2_id = parse_instance_ref(inst.id)
    user_data = ec2.describe_instance_attribute(InstanceId=ec2_id, Attribute="userData")["UserData"]["Value"]
    assert base64.b64decode(user_data).decode() == USER_DATA
    names = [t["LaunchTemplateName"] for t in ec2.describe_launch_templates()["LaunchTemplates"]]
    assert not [n for n in names if n.startswith("overspill-")]
    assert provider.launch(req).id == inst.id


def test_relaunch_after_a_crash_returns_the_same_instance(ec2: Any, ami: str) -> None:
    first_process = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for=ami)
    req = ContractEnv(provider=first_process, offering=offering()).request()
    launched = first_process.launch(req).id  # the broker crashes before recording this id

    restarted = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for=ami)
    assert restarted.launch(req).id == launched
    assert _by_token(ec2, req.launch_token) == [parse_instance_ref(launched)[1]]

    # once the attempt is over the token still names it (as AWS answers a repeated ClientToken): no second instance
    restarted.terminate(launched)
    again = restarted.launch(req)
    assert again.id == launched and again.state is InstanceState.TERMINATED
    assert len(_by_token(ec2, req.launch_token)) == 1


def test_instances_in_several_regions(moto_url: str, ec2: Any, ami: str) -> None:
    west = moto_client("ec2", WEST, moto_url)
    provider = AwsProvider({REGION: ec2, WEST: west}, broker_id="overspill-regions", image_id_for=ami)
    env = ContractEnv(
        provider=provider, offering=offering(region=WEST, zone="us-west-2b"), broker_id="overspill-regions"
    )
    there = provider.launch(env.request())
    here = provider.launch(ContractEnv(provider, offering(), broker_id="overspill-regions").request())

    assert there.id.startswith(f"{WEST}:i-") and here.id.startswith(f"{REGION}:i-")
    assert {i.id for i in provider.list_instances()} == {there.id, here.id}
    assert provider.get(parse_instance_ref(there.id)[1]).id == there.id  # a bare EC2 id is searched for
    with pytest.raises(NotFound):
        provider.get(f"eu-west-1:{parse_instance_ref(there.id)[1]}")  # a region this provider has no client for
    with pytest.raises(NotFound):
        provider.get("not-an-instance")
    with pytest.raises(InvalidRequest):
        provider.launch(ContractEnv(provider, offering(region="eu-west-1", zone="eu-west-1a")).request())
    provider.terminate(parse_instance_ref(there.id)[1])
    assert provider.get(there.id).state is InstanceState.TERMINATED


def test_launch_settings_give_the_instance_its_identity_groups_imds_tags_and_encrypted_root_volume(
    moto_url: str, ec2: Any, ami: str
) -> None:
    iam = moto_client("iam", REGION, moto_url)
    profile = iam.create_instance_profile(InstanceProfileName="overspill-jobs")["InstanceProfile"]
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    group = ec2.create_security_group(GroupName="overspill-jobs", Description="jobs", VpcId=vpc)["GroupId"]
    options = AwsLaunchOptions(
        instance_profile=profile["Arn"],
        security_group_ids={"*": (group,)},
        extra_tags={"cost-center": "ml-research", "overspill:job": "ignored"},
        root_volume_gb=300,
        root_volume_type="gp3",
    )
    provider = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for=ami, options=options)
    sent: dict[str, Any] = {}
    ec2.meta.events.register("provide-client-params.ec2.RunInstances", lambda params, **_: sent.update(params))
    try:
        req = ContractEnv(provider=provider, offering=offering()).request()
        inst = provider.launch(req)
    finally:
        ec2.meta.events.unregister("provide-client-params.ec2.RunInstances")
    assert sent["MetadataOptions"] == {
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 1,
        "HttpEndpoint": "enabled",
    }
    root = ec2.describe_images(ImageIds=[ami])["Images"][0]["RootDeviceName"]
    assert sent["BlockDeviceMappings"] == [
        {
            "DeviceName": root,
            "Ebs": {"VolumeSize": 300, "VolumeType": "gp3", "DeleteOnTermination": True, "Encrypted": True},
        }
    ]

    raw = _raw(ec2, inst.id)
    assert raw["IamInstanceProfile"]["Arn"] == profile["Arn"]
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == [group]
    assert raw["MetadataOptions"]["HttpTokens"] == "required" and raw["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags["cost-center"] == "ml-research" and tags["overspill:job"] == req.tags.job_id, "the broker's tag wins"
    (mapping,) = [m for m in raw["BlockDeviceMappings"] if m["DeviceName"] == root]
    volume = ec2.describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"][0]
    assert (volume["Size"], volume["VolumeType"], volume["Encrypted"]) == (300, "gp3", True)
    assert {t["Key"]: t["Value"] for t in volume["Tags"]}["cost-center"] == "ml-research"

    by_name = AwsProvider(
        {REGION: ec2},
        broker_id=BROKER_ID,
        image_id_for=ami,
        options=AwsLaunchOptions(instance_profile="overspill-jobs"),
    )
    named = by_name.launch(ContractEnv(provider=by_name, offering=offering()).request())
    assert _raw(ec2, named.id)["IamInstanceProfile"]["Arn"] == profile["Arn"]


def test_images_are_per_region_and_ssm_parameters_are_resolved_once_and_cached(
    moto_url: str, ec2: Any, ami: str
) -> None:
    ssm = moto_client("ssm", REGION, moto_url)
    ssm.put_parameter(Name="/overspill/gpu-ami", Value=ami, Type="String", Overwrite=True)
    calls: list[str] = []
    ssm.meta.events.register("provide-client-params.ssm.GetParameter", lambda params, **_: calls.append(params["Name"]))
    now = [NOW]
    resolver = AmiResolver(
        {REGION: "resolve:ssm:/overspill/gpu-ami", WEST: "ami-0123456789abcdef0"},
        ssm_clients={REGION: ssm},
        clock=lambda: now[0],
    )
    provider = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for=resolver)
    first = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert _raw(ec2, first.id)["ImageId"] == ami and calls == ["/overspill/gpu-ami"], "read once, then cached"
    assert resolver(offering(region=WEST, zone="us-west-2b")) == "ami-0123456789abcdef0"
    now[0] += timedelta(hours=2)
    assert resolver(offering()) == ami and len(calls) == 2, "re-read once the cache is old"
    with pytest.raises(InvalidRequest, match="eu-west-1"):
        resolver(offering(region="eu-west-1", zone="eu-west-1a"))
    missing = AmiResolver({REGION: "resolve:ssm:/overspill/no-such-parameter"}, ssm_clients={REGION: ssm})
    with pytest.raises(InvalidRequest) as caught:
        missing(offering())
    assert caught.value.detail == "ParameterNotFound"


def test_a_stopped_instance_lingers_and_a_terminated_one_is_released() -> None:
    stopped = instance_from_description(
        described("stopped", "Client.UserInitiatedShutdown", transition=USER), region=REGION, provider="aws"
    )
    assert stopped.state is InstanceState.TERMINATED and stopped.lingering and not stopped.released
    gone = instance_from_description(
        described("terminated", "Client.UserInitiatedShutdown", transition=USER), region=REGION, provider="aws"
    )
    assert gone.released and not gone.lingering
    done = instance_from_description(
        described("shutting-down", "Client.InstanceInitiatedShutdown", transition=USER), region=REGION, provider="aws"
    )
    assert done.state is InstanceState.SUCCEEDED and done.released


def test_a_launch_denied_by_policy_is_refused_for_the_request_with_awss_message() -> None:
    client, stub = _stubbed()
    message = (
        "You are not authorized to perform this operation. User: arn:aws:sts::123456789012:assumed-role/overspill/x "
        "is not authorized to perform: ec2:RunInstances on resource: arn:aws:ec2:us-east-1:123456789012:instance/* "
        "with an explicit deny in a service control policy. Encoded authorization failure message: AbC"
    )
    stub.add_response("describe_instances", {"Reservations": []})
    stub.add_client_error(
        "run_instances", service_error_code="UnauthorizedOperation", service_message=message, http_status_code=403
    )
    provider = AwsProvider({REGION: client}, broker_id=BROKER_ID, image_id_for="ami-12c6146b", retry=RetryPolicy(1))
    with stub, pytest.raises(PolicyDenied) as caught:
        provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert caught.value.scope is Scope.REQUEST and "explicit deny in a service control policy" in str(caught.value)


# -- spot interruption end to end ------------------------------------------------------------------------------


def test_spot_interruption_warning_end_to_end(moto_url: str, ec2: Any, ami: str) -> None:
    sqs = moto_client("sqs", REGION, moto_url)
    events = moto_client("events", REGION, moto_url)
    queue_url = ensure_interruption_queue(events, sqs, "overspill-interruptions")
    assert ensure_interruption_queue(events, sqs, "overspill-interruptions") == queue_url  # idempotent
    provider = AwsProvider({REGION: ec2}, broker_id=BROKER_ID, image_id_for=ami, sqs_client=sqs, queue_url=queue_url)
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    ec2_id = parse_instance_ref(inst.id)[1]

    def put(detail_type: str, detail: dict[str, str], at: datetime) -> None:
        result = events.put_events(
            Entries=[
                {
                    "Source": "aws.ec2",
                    "DetailType": detail_type,
                    "Detail": json.dumps(detail),
                    "Resources": [f"arn:aws:ec2:{ZONE}:instance/{ec2_id}"],  # as AWS sends it: the zone, no account
                    "Time": at,
                }
            ]
        )
        assert result["FailedEntryCount"] == 0

    put("EC2 Instance Rebalance Recommendation", {"instance-id": ec2_id}, NOW)
    put("EC2 Spot Instance Interruption Warning", {"instance-id": ec2_id, "instance-action": "terminate"}, NOW)
    sqs.send_message(QueueUrl=queue_url, MessageBody="not json")
    sqs.send_message(
        QueueUrl=queue_url, MessageBody=json.dumps({"detail-type": "EC2 Spot Instance Interruption Warning"})
    )
    sqs.send_message(
        QueueUrl=queue_url, MessageBody=json.dumps({"detail-type": "EC2 Instance State-change Notification"})
    )

    notices = provider.poll_interruptions()
    by_kind = {n.kind: n for n in notices}
    assert sorted(by_kind) == ["interruption", "rebalance"] and len(notices) == 2
    warning = by_kind["interruption"]
    assert warning.instance_id == inst.id and warning.provider == "aws"
    assert warning.at == NOW and warning.action_at == NOW + timedelta(minutes=2)
    assert warning.raw["detail"] == {"instance-id": ec2_id, "instance-action": "terminate"}
    assert by_kind["rebalance"].instance_id == inst.id and by_kind["rebalance"].action_at is None
    assert provider.poll_interruptions() == []  # in flight: not delivered again while the broker acts
    provider.ack_interruptions(notices)  # acted on: deleted (tests/test_crash.py covers the crash in between)
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0" and attrs["ApproximateNumberOfMessagesNotVisible"] == "0"

    # two minutes later AWS reclaims it; moto can only terminate it as a user would (Client.UserInitiatedShutdown)
    ec2.terminate_instances(InstanceIds=[ec2_id])
    after = provider.get(inst.id)
    assert after.state.terminal and after.state is InstanceState.TERMINATED
    assert after.ended_at is not None and after.started_at == after.launched_at


# -- error mapping (Stubber) ---------------------------------------------------------------------------------------


def _stubbed(region: str = REGION) -> tuple[Any, Stubber]:
    client = boto3.client("ec2", region_name=region, **CREDS)
    return client, Stubber(client)


@pytest.mark.parametrize(
    ("code", "error", "scope"),
    [
        ("InsufficientInstanceCapacity", InsufficientCapacity, Scope.ZONE),
        ("SpotMaxPriceTooLow", InsufficientCapacity, Scope.ZONE),
        ("VcpuLimitExceeded", QuotaExceeded, Scope.REGION),
        ("MaxSpotInstanceCountExceeded", QuotaExceeded, Scope.REGION),
        ("RequestLimitExceeded", Throttled, Scope.REQUEST),
        ("UnauthorizedOperation", PolicyDenied, Scope.REQUEST),
        ("AuthFailure", AuthError, Scope.PROVIDER),
        ("InvalidClientTokenId", AuthError, Scope.PROVIDER),
        ("InvalidParameterValue", InvalidRequest, Scope.REQUEST),
        ("Unsupported", InvalidRequest, Scope.REQUEST),
        ("SomethingNew", ProviderError, Scope.REQUEST),
    ],
)
def test_launch_errors_are_typed(code: str, error: type[ProviderError], scope: Scope) -> None:
    client, stub = _stubbed()
    stub.add_response("describe_instances", {"Reservations": []})
    stub.add_client_error("run_instances", service_error_code=code, service_message="nope", http_status_code=400)
    # one attempt: this test is about the mapping (retries of transient codes are tested in test_faults.py)
    provider = AwsProvider({REGION: client}, broker_id=BROKER_ID, image_id_for="ami-12c6146b", retry=RetryPolicy(1))
    with stub, pytest.raises(error) as caught:
        provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert type(caught.value) is error and caught.value.scope is scope
    assert caught.value.detail == code and caught.value.provider == "aws"
    stub.assert_no_pending_responses()


def test_fleet_errors_in_the_response_are_typed() -> None:
    client, stub = _stubbed()
    stub.add_response("describe_instances", {"Reservations": []})
    stub.add_response("create_launch_template", {"LaunchTemplate": {"LaunchTemplateName": "overspill-x"}})
    stub.add_response(
        "create_fleet",
        {
            "FleetId": "fleet-1",
            "Errors": [{"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "no g5 in us-east-1a"}],
            "Instances": [],
        },
    )
    stub.add_response("delete_launch_template", {})
    provider = AwsProvider({REGION: client}, broker_id=BROKER_ID, image_id_for="ami-12c6146b", use_fleet=True)
    with stub, pytest.raises(InsufficientCapacity, match="no g5"):
        provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    stub.assert_no_pending_responses()


def test_read_and_terminate_errors() -> None:
    client, stub = _stubbed()
    provider = AwsProvider({REGION: client}, broker_id=BROKER_ID, image_id_for="ami-12c6146b", retry=RetryPolicy(1))
    stub.add_client_error("describe_instances", service_error_code="AuthFailure", http_status_code=401)
    stub.add_client_error("describe_instances", service_error_code="InvalidInstanceID.Malformed")
    stub.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound")
    stub.add_client_error("terminate_instances", service_error_code="Throttling")
    with stub:
        with pytest.raises(AuthError):
            provider.get(UNKNOWN)
        with pytest.raises(NotFound):
            provider.get(UNKNOWN)
        provider.terminate(UNKNOWN)  # converges
        with pytest.raises(Throttled):
            provider.terminate(UNKNOWN)
    stub.assert_no_pending_responses()


def test_a_just_launched_instance_is_not_lost_to_describe_lag() -> None:
    client, stub = _stubbed()
    now = [NOW]
    provider = AwsProvider({REGION: client}, broker_id=BROKER_ID, image_id_for="ami-12c6146b", clock=lambda: now[0])
    req = ContractEnv(provider=provider, offering=offering()).request("a" * 80)  # longer than a ClientToken
    sent: dict[str, Any] = {}
    client.meta.events.register("provide-client-params.ec2.RunInstances", lambda params, **_: sent.update(params))
    stub.add_response("describe_instances", {"Reservations": []})
    stub.add_response(
        "run_instances",
        {
            "Instances": [
                {"InstanceId": "i-0aaaabbbbccccdddd", "State": {"Code": 0, "Name": "pending"}, "LaunchTime": NOW}
            ]
        },
        expected_params=None,
    )
    stub.add_client_error("describe_instances", service_error_code="InvalidInstanceID.NotFound")
    stub.add_client_error("describe_instances", service_error_code="InvalidInstanceID.NotFound")
    with stub:
        inst = provider.launch(req)
        assert inst.id == "us-east-1:i-0aaaabbbbccccdddd" and inst.state is InstanceState.PENDING
        assert inst.launch_token == req.launch_token and inst.offering_key == req.offering.key
        assert sent["ClientToken"] == client_token(req.launch_token) and len(sent["ClientToken"]) == 64
        assert provider.get(inst.id) == inst  # DescribeInstances does not show it yet
        now[0] = NOW + timedelta(minutes=5)
        with pytest.raises(NotFound):
            provider.get(inst.id)
    stub.assert_no_pending_responses()


def test_client_tokens_fit_aws_limits() -> None:
    assert client_token("0123abcd" * 4) == "0123abcd" * 4
    long = client_token("x" * 65)
    assert len(long) == 64 and long == client_token("x" * 65) != client_token("y" * 65)
    assert len(client_token("jöb")) == 64
    assert parse_instance_ref("us-east-1:i-0abc") == ("us-east-1", "i-0abc")
    assert parse_instance_ref("i-0abc") == (None, "i-0abc")


# -- state mapping from AWS's real DescribeInstances shape ---------------------------------------------------------

LAUNCHED = datetime(2026, 11, 2, 6, 0, tzinfo=UTC)


def described(
    state: str,
    code: str = "",
    message: str = "",
    *,
    spot: bool = True,
    transition: str = "",
) -> dict[str, Any]:
    """One `Reservations[].Instances[]` entry as boto3 returns it (LaunchTime parsed to an aware datetime)."""
    codes = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}
    raw: dict[str, Any] = {
        "AmiLaunchIndex": 0,
        "ImageId": "ami-0abcdef1234567890",
        "InstanceId": "i-0123456789abcdef0",
        "InstanceType": "g5.xlarge",
        "LaunchTime": LAUNCHED,
        "Placement": {"AvailabilityZone": ZONE, "GroupName": "", "Tenancy": "default"},
        "State": {"Code": codes[state], "Name": state},
        "StateTransitionReason": transition,
        "Tags": [
            {"Key": "overspill:broker", "Value": BROKER_ID},
            {"Key": TAG_LAUNCH_TOKEN, "Value": "tok-1"},
            {"Key": TAG_OFFERING, "Value": "aws/us-east-1/us-east-1a/g5.xlarge/spot"},
        ],
        "ClientToken": "tok-1",
    }
    if spot:
        raw["InstanceLifecycle"] = "spot"
        raw["SpotInstanceRequestId"] = "sir-abcd1234"
    if code:
        raw["StateReason"] = {"Code": code, "Message": message or f"{code}: reason"}
    return raw


SPOT_MESSAGE = "Server.SpotInstanceTermination: Spot instance termination"
USER = "User initiated (2026-11-02 09:30:00 GMT)"
P, R, S, F, T, X = (
    InstanceState.PENDING,
    InstanceState.RUNNING,
    InstanceState.SUCCEEDED,
    InstanceState.FAILED,
    InstanceState.TERMINATED,
    InstanceState.PREEMPTED,
)


@pytest.mark.parametrize(
    ("raw", "state", "started", "ended"),
    [
        pytest.param(described("pending"), P, False, False, id="pending"),
        pytest.param(described("running"), R, True, False, id="running"),
        pytest.param(
            described("terminated", "Server.SpotInstanceTermination", SPOT_MESSAGE), X, True, False, id="spot-reclaim"
        ),
        pytest.param(
            described("shutting-down", "Server.SpotInstanceTermination", SPOT_MESSAGE), X, True, False, id="spot-ending"
        ),
        pytest.param(described("stopped", "Server.ScheduledStop", spot=False), X, True, False, id="retirement"),
        pytest.param(described("terminated", "Server.InsufficientInstanceCapacity"), X, False, False, id="no-capacity"),
        pytest.param(described("terminated", "Server.InternalError"), X, False, False, id="spot-server-error"),
        pytest.param(described("terminated", "Server.InternalError", spot=False), F, False, False, id="server-error"),
        pytest.param(
            described("terminated", "Client.InstanceInitiatedShutdown", transition=USER), S, True, True, id="job-done"
        ),
        pytest.param(
            described("terminated", "Client.UserInitiatedShutdown", transition=USER), T, True, True, id="api-terminate"
        ),
        pytest.param(
            described("terminated", "Client.VolumeLimitExceeded", spot=False), F, False, False, id="volume-limit"
        ),
        pytest.param(described("shutting-down", spot=False), R, True, False, id="ending-without-reason"),
        pytest.param(described("terminated", spot=False), F, True, False, id="ended-without-reason"),
    ],
)
def test_state_mapping(raw: dict[str, Any], state: InstanceState, started: bool, ended: bool) -> None:
    inst = instance_from_description(raw, region=REGION, provider="aws")
    assert inst.state is state
    assert inst.id == UNKNOWN and inst.launch_token == "tok-1"
    assert inst.offering_key == "aws/us-east-1/us-east-1a/g5.xlarge/spot"
    assert inst.launched_at == LAUNCHED
    assert inst.started_at == (LAUNCHED if started else None)
    assert inst.ended_at == (datetime(2026, 11, 2, 9, 30, tzinfo=UTC) if ended else None)
    code = (raw.get("StateReason") or {}).get("Code")
    if code and state.terminal:
        assert code in inst.detail


def test_get_reads_a_real_spot_reclaim() -> None:
    client, stub = _stubbed()
    reclaimed = described(
        "terminated", "Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot instance termination"
    )
    stub.add_response("describe_instances", {"Reservations": [{"ReservationId": "r-1", "Instances": [reclaimed]}]})
    provider = AwsProvider({REGION: client}, broker_id=BROKER_ID, image_id_for="ami-12c6146b")
    with stub:
        inst = provider.get(UNKNOWN)
    assert inst.state is InstanceState.PREEMPTED and "Spot instance termination" in inst.detail


def test_transition_times() -> None:
    assert transition_time("User initiated (2026-11-02 09:30:00 GMT)") == datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
    assert transition_time("User initiated (2026-11-02 09:30:00 UTC)") == datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
    assert transition_time("") is None and transition_time(None) is None and transition_time("garbage") is None
