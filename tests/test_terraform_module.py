"""The Terraform module (terraform/) parsed with python-hcl2 and checked against the code it deploys:

- IAM: the broker policy grants exactly the AWS actions the code calls. The code is scanned (ast) for boto3 client
  calls in every module that imports boto3/botocore; each call maps to its IAM action(s) (the operation's own name
  by default, `IAM_ACTIONS` for the exceptions), and the policy's actions must equal them per service. So a new
  AWS call without its action here fails, and so does an action nothing calls any more.
- Schedules: one per task of broker/serverless.py (TASKS plus the scheduled-but-pending ones), each passing
  {"overspill_task": NAME}.
- Interruption rules: the EC2 detail-types providers/aws.py parses, delivered to the queue the function consumes
  with ReportBatchItemFailures.
- Environment: every variable the function gets is a Settings field or one broker/serverless.py reads.
- Variables have descriptions and types, outputs descriptions; the provider version is pinned.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest

hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 is in the dev extra: pip install -e '.[dev]'")

from broker import serverless  # noqa: E402
from broker.settings import Settings  # noqa: E402
from providers.aws import INTERRUPTION_EVENT_PATTERN, INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODULE = ROOT / "terraform"
CODE_DIRS = ("broker", "providers", "pricing", "federation")
SERVICES = ("ec2", "pricing", "s3", "sqs", "secretsmanager", "events", "kms", "sts", "iam", "rds", "lambda")

# Functions whose AWS calls are not made by the deployed broker, with the reason.
NOT_DEPLOYED = {
    # Self-hosted setups create the queue, rule and target with it; terraform/ declares them instead.
    ("providers/aws.py", "ensure_interruption_queue"),
}

# IAM actions for operations whose action is not "<service>:<OperationName>", or that need more than one.
IAM_ACTIONS: dict[tuple[str, str], frozenset[str]] = {
    # TagSpecifications at launch need ec2:CreateTags; CreateFleet launches through RunInstances.
    ("ec2", "run_instances"): frozenset({"ec2:RunInstances", "ec2:CreateTags"}),
    ("ec2", "create_fleet"): frozenset({"ec2:CreateFleet", "ec2:RunInstances", "ec2:CreateTags"}),
    ("sqs", "delete_message_batch"): frozenset({"sqs:DeleteMessage"}),
    # Objects are SSE-KMS encrypted with the module's key: reads decrypt, writes generate data keys.
    ("s3", "head_object"): frozenset({"s3:GetObject", "kms:Decrypt"}),
    ("s3", "get_object"): frozenset({"s3:GetObject", "kms:Decrypt"}),
    ("s3", "put_object"): frozenset({"s3:PutObject", "kms:GenerateDataKey"}),
    ("s3", "create_multipart_upload"): frozenset({"s3:PutObject", "kms:GenerateDataKey"}),
    ("s3", "upload_part"): frozenset({"s3:PutObject", "kms:GenerateDataKey"}),
    ("s3", "complete_multipart_upload"): frozenset({"s3:PutObject", "kms:Decrypt"}),
    ("s3", "list_parts"): frozenset({"s3:ListMultipartUploadParts"}),
    ("s3", "list_objects_v2"): frozenset({"s3:ListBucket"}),
    ("secretsmanager", "get_secret_value"): frozenset({"secretsmanager:GetSecretValue", "kms:Decrypt"}),
}

# What Lambda itself needs on the function's behalf (aws_iam_role_policy.platform), not the broker's code.
PLATFORM_ACTIONS = frozenset(
    {
        "logs:CreateLogStream",  # the function's log group
        "logs:PutLogEvents",
        "ec2:CreateNetworkInterface",  # a function in a VPC
        "ec2:DeleteNetworkInterface",
        "ec2:DescribeNetworkInterfaces",
        "ec2:AssignPrivateIpAddresses",
        "ec2:UnassignPrivateIpAddresses",
        "xray:PutTraceSegments",  # active tracing
        "xray:PutTelemetryRecords",
        "sqs:ReceiveMessage",  # the SQS event source mapping
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
        "sqs:SendMessage",  # the dead-letter queue of failed asynchronous invocations
    }
)


# -- parsing ----------------------------------------------------------------------------------------------------------


@cache
def module_blocks() -> dict[str, list[Any]]:
    """Every top-level block of the module's .tf files, by block type (resource, data, locals, variable...)."""
    options = hcl2.SerializationOptions(strip_string_quotes=True)
    blocks: dict[str, list[Any]] = defaultdict(list)
    for path in sorted(MODULE.glob("*.tf")):
        with path.open() as f:
            for kind, items in hcl2.load(f, serialization_options=options).items():
                blocks[kind].extend(items)
    return dict(blocks)


def named(kind: str, type_: str, name: str) -> dict[str, Any]:
    for item in module_blocks().get(kind, []):
        if type_ in item and name in item[type_]:
            return dict(item[type_][name])
    raise AssertionError(f"no {kind} {type_}.{name} in terraform/")


def local(name: str) -> Any:
    for block in module_blocks()["locals"]:
        if name in block:
            return block[name]
    raise AssertionError(f"no local.{name} in terraform/")


def policy_actions(name: str) -> set[str]:
    document = named("data", "aws_iam_policy_document", name)
    return {action for statement in document["statement"] for action in statement["actions"]}


def by_service(actions: Iterable[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for action in actions:
        out[action.split(":", 1)[0]].add(action)
    return dict(out)


# -- the code's AWS calls ---------------------------------------------------------------------------------------------


@cache
def operations() -> dict[str, dict[str, str]]:
    """service -> {snake_case operation: OperationName}, from botocore's service models."""
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    return {
        service: {xform_name(op): op for op in session.get_service_model(service).operation_names}
        for service in SERVICES
    }


def _uses_boto(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in ("boto3", "botocore") for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("boto3", "botocore"):
            return True
    return False


def _called_names(tree: ast.AST, skip: set[str]) -> set[str]:
    """Attribute-call names (`client.run_instances(...)`), bound methods passed to a call
    (`retry(client.run_instances, ...)`) and string constants (paginator names such as
    get_paginator("describe_instances")) outside the functions named in `skip`."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in skip:
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            names.add(node.func.attr)
        if isinstance(node, ast.Call):  # a bound method handed to a retry wrapper: self._ec2(ec2.run_instances, ...)
            names.update(arg.attr for arg in node.args if isinstance(arg, ast.Attribute))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def aws_calls(sources: Mapping[str, str]) -> dict[str, set[tuple[str, str]]]:
    """file -> {(service, operation)} the boto3-using files among `sources` (relative path -> text) call."""
    ops = operations()
    found: dict[str, set[tuple[str, str]]] = {}
    for rel, text in sources.items():
        tree = ast.parse(text)
        if not _uses_boto(tree):
            continue
        skip = {func for path, func in NOT_DEPLOYED if path == rel}
        calls = set()
        for name in _called_names(tree, skip):
            services = [s for s in SERVICES if name in ops[s]]
            if len(services) > 1:
                raise AssertionError(f"{rel}: {name} is an operation of {services}: say which in the scan")
            if services:
                calls.add((services[0], name))
        found[rel] = calls
    return found


def iam_actions(calls: Iterable[tuple[str, str]]) -> set[str]:
    ops = operations()
    actions: set[str] = set()
    for service, op in calls:
        actions |= IAM_ACTIONS.get((service, op), {f"{service}:{ops[service][op]}"})
    return actions


@cache
def code_sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for directory in CODE_DIRS
        for path in sorted((ROOT / directory).rglob("*.py"))
    }


# -- IAM --------------------------------------------------------------------------------------------------------------


def test_broker_policy_grants_exactly_the_actions_the_code_calls() -> None:
    calls = set().union(*aws_calls(code_sources()).values())
    needed = by_service(iam_actions(calls))
    granted = by_service(policy_actions("broker"))
    # the scan sees the calls it must (guards against a scan that silently finds nothing)
    assert {("ec2", "run_instances"), ("pricing", "get_products"), ("sqs", "receive_message")} <= calls
    assert ("s3", "complete_multipart_upload") in calls and ("secretsmanager", "get_secret_value") in calls
    assert ("events", "put_rule") not in calls  # self-hosted setup only
    for service in sorted(set(needed) | set(granted)):
        missing = needed.get(service, set()) - granted.get(service, set())
        extra = granted.get(service, set()) - needed.get(service, set())
        assert not missing, f"the code calls AWS without these actions in terraform/iam.tf: {sorted(missing)}"
        assert not extra, f"terraform/iam.tf grants actions no code calls: {sorted(extra)}"


def test_a_new_aws_call_without_its_action_is_caught() -> None:
    sources = dict(code_sources())
    sources["providers/aws.py"] += "\n\ndef volumes(ec2):\n    return ec2.describe_volumes()\n"
    calls = set().union(*aws_calls(sources).values())
    assert ("ec2", "describe_volumes") in calls
    assert "ec2:DescribeVolumes" in iam_actions(calls) - policy_actions("broker")


def test_platform_policy_is_what_lambda_needs_and_nothing_else() -> None:
    assert policy_actions("platform") == PLATFORM_ACTIONS


def test_terminate_is_limited_to_this_brokers_instances() -> None:
    from providers.model import BROKER_TAG

    statements = named("data", "aws_iam_policy_document", "broker")["statement"]
    terminate = next(s for s in statements if "ec2:TerminateInstances" in s["actions"])
    assert terminate["actions"] == ["ec2:TerminateInstances"]
    condition = terminate["condition"][0]
    assert condition["variable"] == f"aws:ResourceTag/{BROKER_TAG}"
    assert condition["values"] == ["${var.broker_id}"]
    env = local("broker_environment")
    assert env["OVERSPILL_BROKER_ID"] == "${var.broker_id}"  # the tag the broker writes is the one IAM checks


def test_scheduler_may_only_invoke_the_function() -> None:
    assert policy_actions("scheduler") == {"lambda:InvokeFunction", "sqs:SendMessage", "kms:Decrypt"}


# -- schedules, queue, rules ------------------------------------------------------------------------------------------


def test_one_schedule_per_task_passing_the_task_name() -> None:
    schedules = local("schedules")
    assert set(schedules) == set(serverless.TASKS) | set(serverless.PENDING_TASKS)
    schedule = named("resource", "aws_scheduler_schedule", "task")
    assert schedule["for_each"] == "${local.schedules}"
    target = schedule["target"][0]
    assert target["input"] == f"${{jsonencode({{{serverless.TASK_KEY} = each.key}})}}"
    assert target["arn"] == "${aws_lambda_function.broker.arn}"


def test_interruption_rules_feed_the_queue_the_function_consumes() -> None:
    assert set(local("interruption_events").values()) == {INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION}
    rule = named("resource", "aws_cloudwatch_event_rule", "interruption")
    assert rule["for_each"] == "${local.interruption_events}"
    assert INTERRUPTION_EVENT_PATTERN["source"] == ["aws.ec2"] and '["aws.ec2"]' in rule["event_pattern"]
    target = named("resource", "aws_cloudwatch_event_target", "interruption")
    assert target["arn"] == "${aws_sqs_queue.interruptions.arn}"
    mapping = named("resource", "aws_lambda_event_source_mapping", "interruptions")
    assert mapping["event_source_arn"] == "${aws_sqs_queue.interruptions.arn}"
    assert mapping["function_response_types"] == ["ReportBatchItemFailures"]
    assert mapping["batch_size"] <= 10
    queue = named("resource", "aws_sqs_queue", "interruptions")
    assert "deadLetterTargetArn" in queue["redrive_policy"]


def test_function_handler_is_the_serverless_entry_point() -> None:
    function = named("resource", "aws_lambda_function", "broker")
    module_name, _, attr = function["handler"].rpartition(".")
    assert callable(getattr(importlib.import_module(module_name), attr))
    assert module_name == "broker.serverless"
    assert function["environment"][0]["variables"] == "${local.environment}"


def test_function_environment_is_what_the_broker_reads() -> None:
    prefix = str(Settings.model_config.get("env_prefix", ""))
    settings_env = {prefix + name.upper() for name in Settings.model_fields}
    env = local("broker_environment")
    unknown = set(env) - settings_env - serverless.OWN_ENV
    assert not unknown, f"the function gets variables nothing reads: {sorted(unknown)}"
    assert {
        serverless.SECRET_ARN_ENV,
        serverless.DB_HOST_ENV,
        serverless.DB_PORT_ENV,
        serverless.DB_NAME_ENV,
    } <= set(env)
    assert "OVERSPILL_DATABASE_URL" not in env  # credentials come from Secrets Manager, never the environment
    assert "OVERSPILL_AWS_INTERRUPTION_QUEUE_URL" not in env  # the event source mapping delivers the queue
    assert env["OVERSPILL_ENV"] == "production"


# -- module hygiene ---------------------------------------------------------------------------------------------------


def test_variables_and_outputs_are_documented_and_inputs_validated() -> None:
    variables = {name: spec for block in module_blocks()["variable"] for name, spec in block.items()}
    for name, spec in variables.items():
        assert spec.get("description"), f"variable {name} has no description"
        assert spec.get("type"), f"variable {name} has no type"
    unvalidated = {
        name
        for name, spec in variables.items()
        if not spec.get("validation") and spec["type"] not in ("${bool}", "bool") and name != "tags"
    }
    assert not unvalidated, f"variables without validation: {sorted(unvalidated)}"
    outputs = {name: spec for block in module_blocks()["output"] for name, spec in block.items()}
    for name, spec in outputs.items():
        assert spec.get("description"), f"output {name} has no description"
    assert {"api_url", "interruption_queue_url", "checkpoint_bucket", "reports_bucket"} <= set(outputs)


def test_provider_versions_are_pinned() -> None:
    terraform = module_blocks()["terraform"][0]
    aws = terraform["required_providers"][0]["aws"]
    assert aws["source"] == "hashicorp/aws" and aws["version"].startswith("~> 5.")
    options = hcl2.SerializationOptions(strip_string_quotes=True)
    with (MODULE / "examples" / "basic" / "main.tf").open() as f:
        example = hcl2.load(f, serialization_options=options)
    pinned = example["terraform"][0]["required_providers"][0]["aws"]["version"]
    assert pinned.count(".") == 2 and pinned[0].isdigit(), f"the example pins an exact version, not {pinned!r}"


def test_buckets_are_private_encrypted_versioned_and_expire() -> None:
    for bucket in ("checkpoints", "reports"):
        access = named("resource", "aws_s3_bucket_public_access_block", bucket)
        assert all(access[k] is True for k in ("block_public_acls", "block_public_policy", "ignore_public_acls"))
        assert access["restrict_public_buckets"] is True
        assert named("resource", "aws_s3_bucket_versioning", bucket)["versioning_configuration"][0]["status"] == (
            "Enabled"
        )
        sse = named("resource", "aws_s3_bucket_server_side_encryption_configuration", bucket)["rule"][0]
        assert sse["apply_server_side_encryption_by_default"][0]["sse_algorithm"] == "aws:kms"
        rules = named("resource", "aws_s3_bucket_lifecycle_configuration", bucket)["rule"]
        assert all(
            r["status"] == "Enabled" and r["expiration"] and r["abort_incomplete_multipart_upload"] for r in rules
        )


def test_log_groups_have_retention() -> None:
    groups = [
        spec
        for block in module_blocks()["resource"]
        for name, spec in block.get("aws_cloudwatch_log_group", {}).items()
    ]
    assert len(groups) == 3
    assert all(g["retention_in_days"] == "${var.log_retention_days}" and g.get("kms_key_id") for g in groups)
