"""The Terraform module with the real tools: `terraform fmt -check` and `validate` (offline through the provider
mirror when the machine has one), checkov with zero failed checks, and the example root planned, applied and
destroyed against a moto server, with boto3 checking that what was declared exists. Also the package builder.

Without terraform (or checkov) these skip saying so; CI (OVERSPILL_REQUIRE_INTEGRATION=1) fails on any skip.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker import serverless
from tests.moto_server import moto_client, running_moto_server
from tests.terraform_cli import ROOT, Workspace, checkov_bin, terraform_bin

REGION = "us-east-1"
EXAMPLE = "examples/basic"

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
    assert any(n.startswith("broker/migrations/versions/") and n.endswith(".py") for n in names)
    assert not any("__pycache__" in n for n in names)


# -- plan, apply and destroy the example against moto ---------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


def _network(moto_url: str) -> tuple[str, list[str]]:
    ec2 = moto_client("ec2", REGION, moto_url)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.42.{n}.0/24", AvailabilityZone=f"{REGION}{zone}")["Subnet"][
            "SubnetId"
        ]
        for n, zone in ((1, "a"), (2, "b"))
    ]
    return vpc, subnets


def _small_package(path: Path) -> Path:
    """moto stores the function's code but never runs it: a small zip with the handler module is enough."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(ROOT / "broker" / "serverless.py", "broker/serverless.py")
    return path


def test_example_applies_on_moto_and_everything_declared_exists(
    workspace: Workspace, moto_url: str, tmp_path: Path
) -> None:
    name = "ovs" + secrets.token_hex(3)
    vpc, subnets = _network(moto_url)
    tfvars = {
        "aws_endpoint_url": moto_url,
        "region": REGION,
        "name": name,
        "lambda_zip_path": str(_small_package(tmp_path / "package.zip")),
        "vpc_id": vpc,
        "subnet_ids": subnets,
        "bootstrap_api_key": f"ovs_{secrets.token_hex(4)}_{secrets.token_urlsafe(24)}",
        "db_deletion_protection": False,
        "db_skip_final_snapshot": True,
        "force_destroy_buckets": True,
    }
    varfile = tmp_path / "moto.tfvars.json"
    varfile.write_text(json.dumps(tfvars))
    workspace.env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION}
    state = str(tmp_path / "terraform.tfstate")
    plan = str(tmp_path / "deploy.tfplan")
    common = ("-input=false", "-no-color", f"-state={state}")

    workspace.run(EXAMPLE, "init", "-input=false", "-no-color")
    workspace.run(EXAMPLE, "plan", *common, f"-var-file={varfile}", f"-out={plan}")
    planned = json.loads(workspace.run(EXAMPLE, "show", "-json", plan).stdout)
    planned_types = {r["type"] for r in planned["resource_changes"] if r["change"]["actions"] == ["create"]}
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
    } <= planned_types

    workspace.run(EXAMPLE, "apply", *common, "-auto-approve", plan, timeout=900)
    try:
        outputs = {
            k: v["value"]
            for k, v in json.loads(workspace.run(EXAMPLE, "output", "-json", f"-state={state}").stdout).items()
        }
        _check_deployment(moto_url, name, outputs, subnets)
    finally:
        workspace.run(EXAMPLE, "destroy", *common, "-auto-approve", f"-var-file={varfile}", timeout=900)
    _check_gone(moto_url, name, outputs)


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


def _check_gone(url: str, name: str, outputs: dict[str, Any]) -> None:
    lam = moto_client("lambda", REGION, url)
    with pytest.raises(lam.exceptions.ResourceNotFoundException):
        lam.get_function(FunctionName=name)
    sqs = moto_client("sqs", REGION, url)
    assert not [q for q in sqs.list_queues(QueueNamePrefix=name).get("QueueUrls", [])]
    s3 = moto_client("s3", REGION, url)
    remaining = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert outputs["checkpoint_bucket"] not in remaining and outputs["reports_bucket"] not in remaining
