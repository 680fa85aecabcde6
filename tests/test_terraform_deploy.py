"""The Terraform module with the real tools: `terraform fmt -check` and `validate` (offline through the provider
mirror when the machine has one), checkov with zero failed checks, and the example root planned, applied and
destroyed against a moto server, with boto3 checking that what was declared exists. Also the package builder.

Without terraform (or checkov) these skip saying so; CI (OVERSPILL_REQUIRE_INTEGRATION=1) fails on any skip.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from broker import serverless
from broker.runtime import build_runtime
from tests.moto_server import moto_client
from tests.terraform_cli import (
    EXAMPLE,
    REGION,
    ROOT,
    Deployment,
    Workspace,
    checkov_bin,
    example_deployment,
    example_destroyed,
    terraform_bin,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def terraform() -> str:
    binary = terraform_bin()
    if binary is None:
        pytest.skip("terraform is not installed (https://developer.hashicorp.com/terraform/install)")
    return binary


@pytest.fixture(scope="module")
def workspace(terraform: str, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace.create(tmp_path_factory.mktemp("tf"), terraform)


def test_module_is_formatted_and_valid(workspace: Workspace) -> None:
    workspace.run(".", "fmt", "-check", "-recursive", "-diff")
    for where in (".", EXAMPLE):
        workspace.run(where, "init", "-backend=false", "-input=false", "-no-color")
        result = workspace.run(where, "validate", "-json", "-no-color")
        report = json.loads(result.stdout)
        assert report["valid"] is True and report["error_count"] == 0, report


def test_checkov_finds_no_failed_checks(tmp_path: Path) -> None:
    binary = checkov_bin()
    if binary is None:
        pytest.skip("checkov could not be found or installed (pip install checkov in its own virtualenv)")
    result = subprocess.run(
        [
            binary,
            "--directory",
            str(ROOT / "terraform"),
            "--framework",
            "terraform",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    summary = reports[0]["summary"]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range']})"
        for r in reports
        for c in r["results"]["failed_checks"]
    ]
    assert summary["failed"] == 0, "\n".join(failed)
    assert summary["passed"] > 100  # it really scanned the module
    skipped = [c for r in reports for c in r["results"]["skipped_checks"]]
    assert skipped and all(len(c["check_result"].get("suppress_comment", "").strip()) > 40 for c in skipped), (
        "every skip is justified inline"
    )


def test_package_builder_makes_a_reproducible_zip_with_the_handler(tmp_path: Path) -> None:
    first, second = tmp_path / "a.zip", tmp_path / "b.zip"
    for out in (first, second):
        subprocess.run(
            [sys.executable, str(ROOT / "terraform" / "build_lambda.py"), "--out", str(out), "--no-deps"],
            check=True,
            capture_output=True,
            timeout=120,
        )
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as archive:
        names = set(archive.namelist())
    assert "broker/serverless.py" in names and "providers/aws.py" in names
    assert any(n.startswith("broker/store/migrations/versions/") and n.endswith(".py") for n in names)
    assert not any("__pycache__" in n for n in names)


# -- plan, apply and destroy the example against moto ---------------------------------------------------------------


@pytest.fixture(scope="module")
def deployment(request: pytest.FixtureRequest) -> Deployment:
    """The example applied on moto (shared with tests/attacks/test_terraform_metrics.py: one apply per session)."""
    return example_deployment(request.config)


@pytest.mark.terraform_deployment
def test_example_applies_on_moto_and_everything_declared_exists(deployment: Deployment) -> None:
    planned_types = {r["type"] for r in deployment.planned["resource_changes"] if r["change"]["actions"] == ["create"]}
    assert {
        "aws_lambda_function",
        "aws_apigatewayv2_api",
        "aws_scheduler_schedule",
        "aws_sqs_queue",
        "aws_cloudwatch_event_rule",
        "aws_rds_cluster",
        "aws_s3_bucket",
        "aws_iam_role_policy",
        "aws_cloudwatch_log_group",
        "aws_lambda_event_source_mapping",
        "aws_iam_instance_profile",
        "aws_secretsmanager_secret",
        "aws_secretsmanager_secret_version",
    } <= planned_types
    _check_deployment(deployment.moto_url, deployment.name, deployment.outputs, deployment.subnets)
    _check_instance_identity(deployment)


def _check_deployment(url: str, name: str, outputs: dict[str, Any], subnets: list[str]) -> None:
    lam = moto_client("lambda", REGION, url)
    function = lam.get_function(FunctionName=name)["Configuration"]
    assert function["Handler"] == "broker.serverless.handler"
    assert function["Runtime"].startswith("python3.1")
    assert sorted(function["VpcConfig"]["SubnetIds"]) == sorted(subnets)
    env = function["Environment"]["Variables"]
    assert env[serverless.SECRET_ARN_ENV] == outputs["database_secret_arn"]
    assert {serverless.DB_HOST_ENV, serverless.DB_PORT_ENV, serverless.DB_NAME_ENV} <= set(env)
    assert env["OVERSPILL_ENV"] == "production"

    sqs = moto_client("sqs", REGION, url)
    queue_url = sqs.get_queue_url(QueueName=f"{name}-interruptions")["QueueUrl"]
    assert queue_url == outputs["interruption_queue_url"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    queue_arn = attributes["QueueArn"]
    assert json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"].endswith(f"{name}-interruptions-dlq")
    policy = json.loads(attributes["Policy"])
    assert policy["Statement"][0]["Principal"] == {"Service": "events.amazonaws.com"}

    mappings = [
        m
        for m in lam.list_event_source_mappings()["EventSourceMappings"]
        if m["FunctionArn"] == function["FunctionArn"]
    ]
    assert [m["EventSourceArn"] for m in mappings] == [queue_arn]
    assert mappings[0]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]

    events = moto_client("events", REGION, url)
    rules = events.list_rules(NamePrefix=f"{name}-")["Rules"]
    detail_types = {json.loads(r["EventPattern"])["detail-type"][0] for r in rules}
    assert detail_types == {"EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"}
    for rule in rules:
        assert [t["Arn"] for t in events.list_targets_by_rule(Rule=rule["Name"])["Targets"]] == [queue_arn]

    scheduler = moto_client("scheduler", REGION, url)
    group = outputs["schedule_group"]
    listed = {s["Name"] for s in scheduler.list_schedules(GroupName=group)["Schedules"]}
    assert listed == set(outputs["schedule_names"].values())
    for task, schedule_name in outputs["schedule_names"].items():
        schedule = scheduler.get_schedule(GroupName=group, Name=schedule_name)
        assert json.loads(schedule["Target"]["Input"]) == {serverless.TASK_KEY: task}
        assert schedule["Target"]["Arn"] == function["FunctionArn"]
    assert set(outputs["schedule_names"]) == set(serverless.TASKS) | set(serverless.PENDING_TASKS)

    s3 = moto_client("s3", REGION, url)
    for bucket in (outputs["checkpoint_bucket"], outputs["reports_bucket"]):
        assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
        sse = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"][0]
        assert sse["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
        block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
        assert all(block.values()) and len(block) == 4
        rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
        assert rules and all(r["Status"] == "Enabled" and r["Expiration"]["Days"] > 0 for r in rules)

    logs = moto_client("logs", REGION, url)
    groups = logs.describe_log_groups(logGroupNamePrefix=f"/aws/lambda/{name}")["logGroups"]
    assert [g["retentionInDays"] for g in groups] == [365]

    rds = moto_client("rds", REGION, url)
    cluster = rds.describe_db_clusters(DBClusterIdentifier=name)["DBClusters"][0]
    assert cluster["Engine"] == "aurora-postgresql" and cluster["StorageEncrypted"] is True
    assert cluster["ServerlessV2ScalingConfiguration"]["MinCapacity"] == 0
    assert cluster["MasterUserSecret"]["SecretArn"] == outputs["database_secret_arn"]

    apis = moto_client("apigatewayv2", REGION, url).get_apis()["Items"]
    api = next(a for a in apis if a["Name"] == name)
    assert api["ProtocolType"] == "HTTP" and outputs["api_url"] == api["ApiEndpoint"]

    iam = moto_client("iam", REGION, url)
    document = iam.get_role_policy(RoleName=f"{name}-broker", PolicyName="broker")["PolicyDocument"]
    document = json.loads(document) if isinstance(document, str) else document
    applied = {
        a for s in document["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    from tests.test_terraform_module import policy_actions

    assert applied == policy_actions("broker")


def _check_instance_identity(deployment: Deployment) -> None:
    """The function's environment names the instance profile, security group, checkpoint store, the generated
    secrets and the API's URL, and each exists as declared."""
    outputs, name = deployment.outputs, deployment.name
    env = deployment.function_environment()
    assert env["OVERSPILL_AWS_INSTANCE_PROFILE"] == outputs["instance_profile_arn"]
    assert json.loads(env["OVERSPILL_AWS_SECURITY_GROUP_IDS"]) == [outputs["instance_security_group_id"]]
    assert env["OVERSPILL_AWS_IMDS_V2_REQUIRED"] == "true"
    bucket = outputs["checkpoint_bucket"]
    assert json.loads(env["OVERSPILL_CHECKPOINT_STORES"]) == {f"aws/{REGION}": f"s3://{bucket}/overspill/"}
    assert env["OVERSPILL_PUBLIC_URL"] == outputs["api_url"]
    assert env["OVERSPILL_CALLBACK_SECRET_ARN"] == outputs["callback_secret_arn"]
    assert env["OVERSPILL_METRICS_TOKEN_ARN"] == outputs["metrics_token_secret_arn"]
    assert not {"OVERSPILL_CALLBACK_SECRET", "OVERSPILL_METRICS_TOKEN"} & set(env)  # values never in the environment

    sm = deployment.client("secretsmanager")
    for arn in (outputs["callback_secret_arn"], outputs["metrics_token_secret_arn"]):
        described = sm.describe_secret(SecretId=arn)
        assert described["Name"].startswith(f"{name}/broker/") and described["KmsKeyId"] == outputs["kms_key_arn"]
        value = sm.get_secret_value(SecretId=arn)["SecretString"]
        assert len(value) == 64 and value.isalnum()

    iam = deployment.client("iam")
    profile = iam.get_instance_profile(InstanceProfileName=f"{name}-instances")["InstanceProfile"]
    assert profile["Arn"] == outputs["instance_profile_arn"]
    assert [r["RoleName"] for r in profile["Roles"]] == [f"{name}-instances"]
    trust = profile["Roles"][0]["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    from tests.test_terraform_module import policy_actions

    assert _policy_actions(_role_policy(deployment, f"{name}-instances", "training-instance")) == policy_actions(
        "instances"
    )

    group = deployment.client("ec2").describe_security_groups(GroupIds=[outputs["instance_security_group_id"]])
    group = group["SecurityGroups"][0]
    assert group["VpcId"] == deployment.vpc
    assert group["IpPermissions"] == []  # no inbound access at all
    egress = group["IpPermissionsEgress"]
    assert [(e["IpProtocol"], [r["CidrIp"] for r in e.get("IpRanges", [])]) for e in egress if e.get("IpRanges")] == [
        ("-1", ["0.0.0.0/0"])
    ]


def _role_policy(deployment: Deployment, role: str, policy: str) -> dict[str, Any]:
    document = deployment.client("iam").get_role_policy(RoleName=role, PolicyName=policy)["PolicyDocument"]
    return dict(json.loads(document) if isinstance(document, str) else document)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _policy_actions(document: dict[str, Any]) -> set[str]:
    return {a for s in document["Statement"] for a in _listed(s["Action"])}


@pytest.mark.terraform_deployment
def test_the_example_passes_the_production_start_up_checks(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The environment the module renders, its secrets read from (moto's) Secrets Manager, is one the broker starts
    with in production: Settings' checks pass and the runtime builds. Without the callback secret it would not."""
    env = _broker_environment(deployment, monkeypatch)
    settings = serverless.settings_from_env(env)  # what the function's cold start does, database secret included
    assert settings.env == "production"
    assert len(settings.callback_secret) >= 32 and len(settings.metrics_token) >= 32
    assert settings.public_url == deployment.outputs["api_url"]
    assert settings.checkpoint_stores == {f"aws/{REGION}": f"s3://{deployment.outputs['checkpoint_bucket']}/overspill/"}
    assert settings.database_url.startswith("postgresql+psycopg://")  # from the RDS-managed secret
    local = settings.model_copy(update={"database_url": f"sqlite:///{tmp_path / 'broker.store.db'}"})
    rt = build_runtime(local)  # the rest of start-up: migrations, bootstrap key, feeds and providers from settings
    rt.engine.dispose()

    monkeypatch.delenv("OVERSPILL_CALLBACK_SECRET_ARN")
    with pytest.raises(
        ValidationError, match=r"refusing to start in production: .*OVERSPILL_CALLBACK_SECRET must be set"
    ):
        serverless.settings_from_env(dict(os.environ))


def _broker_environment(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The function's environment in this process, with AWS endpoints pointed at the moto server."""
    for name in list(os.environ):
        if name.startswith("OVERSPILL_"):
            monkeypatch.delenv(name)
    env = deployment.function_environment() | {
        "OVERSPILL_SECRETS_ENDPOINT_URL": deployment.moto_url,
        "OVERSPILL_AWS_ENDPOINT_URL": deployment.moto_url,
    }
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
    for k, v in (env | aws).items():
        monkeypatch.setenv(k, v)
    return env


@pytest.mark.terraform_deployment
def test_generated_secrets_are_in_neither_the_plan_nor_the_state(deployment: Deployment) -> None:
    sm = deployment.client("secretsmanager")
    values = [
        sm.get_secret_value(SecretId=deployment.outputs[k])["SecretString"]
        for k in ("callback_secret_arn", "metrics_token_secret_arn")
    ]
    state = deployment.state.read_text()
    plan = json.dumps(deployment.planned)
    assert '"secret_string_wo"' in state  # the write-only argument is there, without its value
    for value in values:
        assert value not in state and value not in plan


# -- the broker policy as IAM evaluates it, against the requests the AWS adapter really sends ----------------------


def _matches(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern)


def _condition_holds(operator: str, key: str, expected: Any, context: dict[str, Any]) -> bool:
    if key not in context:
        return False  # IAM: a missing key fails every operator used here (none is ...IfExists)
    actual = [str(v) for v in _listed(context[key])]
    wanted = [str(v) for v in _listed(expected)]
    if operator == "StringEquals":
        return any(a in wanted for a in actual)
    if operator in ("StringLike", "ArnLike"):
        return any(_matches(w, a) for a in actual for w in wanted)
    raise AssertionError(f"the evaluator does not implement {operator}: extend it before trusting the test")


def allowed(policy: dict[str, Any], action: str, resource: str, context: dict[str, Any]) -> bool:
    """Whether an identity policy with only Allow statements allows `action` on `resource` in `context` (IAM's rules
    for the subset used: wildcard actions and resources, AND of conditions, OR of values)."""
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow", "the evaluator handles Allow statements only"
        if not any(_matches(a.lower(), action.lower()) for a in _listed(statement["Action"])):
            continue
        if not any(_matches(r, resource) for r in _listed(statement["Resource"])):
            continue
        conditions = statement.get("Condition", {})
        if all(_condition_holds(op, k, v, context) for op, kv in conditions.items() for k, v in kv.items()):
            return True
    return False


def _capture(ec2: Any) -> list[tuple[str, dict[str, Any]]]:
    sent: list[tuple[str, dict[str, Any]]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        sent.append((model.name, dict(params)))

    ec2.meta.events.register("provide-client-params.ec2.*", record)
    return sent


def _tags(params: dict[str, Any], resource_type: str) -> dict[str, str]:
    for spec in params.get("TagSpecifications", []):
        if spec["ResourceType"] == resource_type:
            return {t["Key"]: t["Value"] for t in spec["Tags"]}
    return {}


def _request_context(tags: dict[str, str], region: str = REGION, **more: Any) -> dict[str, Any]:
    return {"aws:RequestedRegion": region, **{f"aws:RequestTag/{k}": v for k, v in tags.items()}, **more}


@pytest.mark.terraform_deployment
def test_the_broker_policy_admits_the_adapters_launches_and_nothing_else(deployment: Deployment) -> None:
    """The applied broker policy, evaluated for each resource of the requests providers/aws.py sends (captured
    against moto, with the launch settings the module renders): the broker's own launches pass, and a launch with
    another broker's tag, in another region, from another AMI or into another security group does not; tags only at
    creation; the instance role only, and only to EC2."""
    from providers.aws import AwsProvider
    from providers.model import BROKER_TAG, CapacityType
    from tests.provider_contract import ContractEnv
    from tests.test_provider_aws import offering

    outputs, env = deployment.outputs, deployment.function_environment()
    policy = _role_policy(deployment, f"{deployment.name}-broker", "broker")
    account = deployment.client("sts").get_caller_identity()["Account"]
    arn = f"arn:aws:ec2:{REGION}:{account}"
    broker_id, ami = env["OVERSPILL_BROKER_ID"], env["OVERSPILL_AWS_IMAGE_ID"]
    profile = {"Arn": env["OVERSPILL_AWS_INSTANCE_PROFILE"]}
    groups = json.loads(env["OVERSPILL_AWS_SECURITY_GROUP_IDS"])
    ec2 = deployment.client("ec2")
    sent = _capture(ec2)

    for use_fleet in (False, True):
        provider = AwsProvider(
            {REGION: ec2},
            broker_id=broker_id,
            image_id_for=ami,
            use_fleet=use_fleet,
            run_params={"IamInstanceProfile": profile, "SecurityGroupIds": groups},
        )
        provider.launch(ContractEnv(provider, offering(CapacityType.SPOT), broker_id=broker_id).request())
    calls = {op: params for op, params in sent if op != "DescribeInstances"}
    assert set(calls) == {"RunInstances", "CreateLaunchTemplate", "CreateFleet", "DeleteLaunchTemplate"}

    run = calls["RunInstances"]
    instance, volume = _tags(run, "instance"), _tags(run, "volume")
    assert instance[BROKER_TAG] == broker_id and volume[BROKER_TAG] == broker_id
    launched = {
        f"{arn}:instance/i-0123456789abcdef0": _request_context(instance),
        f"{arn}:volume/vol-0123456789abcdef0": _request_context(volume),
        f"arn:aws:ec2:{REGION}::image/{run['ImageId']}": _request_context({}),
        f"arn:aws:ec2:{REGION}::snapshot/snap-0123456789abcdef0": _request_context({}),
        f"{arn}:subnet/{deployment.subnets[0]}": _request_context({}),
        f"{arn}:network-interface/eni-0123456789abcdef0": _request_context({}),
        f"{arn}:spot-instances-request/sir-01234567": _request_context({}),
        **{f"{arn}:security-group/{g}": _request_context({}) for g in run["SecurityGroupIds"]},
    }
    for resource, context in launched.items():
        assert allowed(policy, "ec2:RunInstances", resource, context), resource
    for resource, tags in ((f"{arn}:instance/i-0123456789abcdef0", instance), (f"{arn}:volume/vol-0", volume)):
        assert allowed(
            policy, "ec2:CreateTags", resource, _request_context(tags, **{"ec2:CreateAction": "RunInstances"})
        )
    role = deployment.client("iam").get_role(RoleName=f"{deployment.name}-instances")["Role"]["Arn"]
    assert allowed(policy, "iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"})

    template_tags = _tags(calls["CreateLaunchTemplate"], "launch-template")
    template = f"{arn}:launch-template/lt-0123456789abcdef0"
    assert calls["CreateLaunchTemplate"]["LaunchTemplateName"].startswith("overspill-")
    assert allowed(policy, "ec2:CreateLaunchTemplate", template, _request_context(template_tags))
    assert allowed(
        policy,
        "ec2:CreateTags",
        template,
        _request_context(template_tags, **{"ec2:CreateAction": "CreateLaunchTemplate"}),
    )
    owned = {"aws:RequestedRegion": REGION, f"aws:ResourceTag/{BROKER_TAG}": template_tags[BROKER_TAG]}
    for action in ("ec2:CreateFleet", "ec2:DeleteLaunchTemplate", "ec2:RunInstances"):
        assert allowed(policy, action, template, owned), action
    fleet_tags = _tags(calls["CreateFleet"], "fleet")
    assert allowed(policy, "ec2:CreateFleet", f"{arn}:fleet/fleet-0123", _request_context(fleet_tags))
    data = calls["CreateLaunchTemplate"]["LaunchTemplateData"]
    for resource_type in ("instance", "volume"):
        tags = _tags(data, resource_type)
        assert allowed(policy, "ec2:CreateFleet", f"{arn}:{resource_type}/x-0", _request_context(tags)), resource_type

    # ... and what must not pass
    other_broker = {**instance, BROKER_TAG: "someone-else"}
    refused = [
        ("ec2:RunInstances", f"{arn}:instance/i-0", _request_context(other_broker)),
        (
            "ec2:RunInstances",
            f"{arn}:instance/i-0",
            _request_context({k: v for k, v in instance.items() if k != BROKER_TAG}),
        ),
        ("ec2:RunInstances", f"{arn}:volume/vol-0", _request_context(other_broker)),
        ("ec2:RunInstances", f"arn:aws:ec2:eu-west-1:{account}:instance/i-0", _request_context(instance, "eu-west-1")),
        ("ec2:RunInstances", f"arn:aws:ec2:{REGION}::image/ami-0badbadbadbadbad0", _request_context({})),
        ("ec2:RunInstances", f"{arn}:security-group/sg-0123456789abcdef0", _request_context({})),
        ("ec2:CreateTags", f"{arn}:instance/i-0", _request_context(instance)),  # an existing instance: no CreateAction
        (
            "ec2:CreateTags",
            f"{arn}:instance/i-0",
            _request_context(other_broker, **{"ec2:CreateAction": "RunInstances"}),
        ),
        ("ec2:CreateLaunchTemplate", template, _request_context({})),
        ("ec2:DeleteLaunchTemplate", template, {"aws:RequestedRegion": REGION, f"aws:ResourceTag/{BROKER_TAG}": "x"}),
        ("ec2:RunInstances", template, {"aws:RequestedRegion": REGION}),  # someone else's untagged template
        ("ec2:CreateFleet", template, _request_context(fleet_tags)),  # a tagged fleet from someone else's template
        ("ec2:TerminateInstances", f"{arn}:instance/i-0", {f"aws:ResourceTag/{BROKER_TAG}": "someone-else"}),
        ("iam:PassRole", role, {"iam:PassedToService": "lambda.amazonaws.com"}),
        (
            "iam:PassRole",
            f"arn:aws:iam::{account}:role/{deployment.name}-broker",
            {"iam:PassedToService": "ec2.amazonaws.com"},
        ),
    ]
    for action, resource, context in refused:
        assert not allowed(policy, action, resource, context), (action, resource, context)
    assert allowed(
        policy, "ec2:TerminateInstances", f"{arn}:instance/i-0", {f"aws:ResourceTag/{BROKER_TAG}": broker_id}
    )
    assert outputs["instance_security_group_id"] in groups


@pytest.mark.slow(200)  # the group's apply (paid by its first reader) and this destroy
@pytest.mark.terraform_destroy
def test_example_destroys_cleanly(request: pytest.FixtureRequest) -> None:
    deployment = example_destroyed(request.config)
    _check_gone(deployment.moto_url, deployment.name, deployment.outputs)


def _check_gone(url: str, name: str, outputs: dict[str, Any]) -> None:
    lam = moto_client("lambda", REGION, url)
    with pytest.raises(lam.exceptions.ResourceNotFoundException):
        lam.get_function(FunctionName=name)
    sqs = moto_client("sqs", REGION, url)
    assert not [q for q in sqs.list_queues(QueueNamePrefix=name).get("QueueUrls", [])]
    s3 = moto_client("s3", REGION, url)
    remaining = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert outputs["checkpoint_bucket"] not in remaining and outputs["reports_bucket"] not in remaining
