"""The Terraform module (terraform/) parsed with python-hcl2 and checked against the code it deploys:

- IAM: the broker policy grants exactly the AWS actions the code calls. The code is scanned (ast) for boto3 client
  calls in every module that imports boto3/botocore; each call maps to its IAM action(s) (the operation's own name
  by default, `IAM_ACTIONS` for the exceptions), and the policy's actions must equal them per service. So a new
  AWS call without its action here fails, and so does an action nothing calls any more.
- Schedules: one per task of broker/serverless.py (TASKS plus the scheduled-but-pending ones), each passing
  {"overspill_task": NAME}.
- Interruption rules: the EC2 detail-types providers/aws.py parses, delivered to the queue the function consumes
  with ReportBatchItemFailures.
- Launch scoping: every EC2 launch statement is limited to the configured regions; what a launch creates must carry
  this broker's tag; images, launch templates, security groups are this deployment's; PassRole is the instance
  role's, to EC2 only. (tests/test_terraform_deploy.py evaluates the applied policy against the adapter's requests.)
- The training instances' role: exactly the broker's checkpoint-store layout (P tenants/*, P _agent/* read-only),
  the jobs' secrets, ECR pulls when configured, the key through S3/Secrets Manager; their security group has no
  ingress.
- Secrets: the callback secret and metrics token are generated write-only and reach the function as ARNs.
- Environment: every variable the function gets is a Settings field or one broker/serverless.py reads (or one the
  workload plane is adding, `WORKLOAD_PLANE_SETTINGS`).
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
from broker.config.settings import Settings  # noqa: E402
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
    # TagSpecifications at launch need ec2:CreateTags; CreateFleet launches through RunInstances; an instance
    # profile (the training instances' role) needs iam:PassRole.
    ("ec2", "run_instances"): frozenset({"ec2:RunInstances", "ec2:CreateTags", "iam:PassRole"}),
    ("ec2", "create_fleet"): frozenset({"ec2:CreateFleet", "ec2:RunInstances", "ec2:CreateTags", "iam:PassRole"}),
    ("ec2", "create_launch_template"): frozenset({"ec2:CreateLaunchTemplate", "ec2:CreateTags"}),
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

# Settings the workload-plane branch adds (instance profile, security groups, IMDSv2 at launch); the module already
# passes them. Once that branch is merged they are Settings fields and this set is redundant.
WORKLOAD_PLANE_SETTINGS = frozenset(
    {"OVERSPILL_AWS_INSTANCE_PROFILE", "OVERSPILL_AWS_SECURITY_GROUP_IDS", "OVERSPILL_AWS_IMDS_V2_REQUIRED"}
)

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
    assert condition["variable"] == "aws:ResourceTag/${local.broker_tag}" and local("broker_tag") == BROKER_TAG
    assert condition["values"] == ["${var.broker_id}"]
    env = local("broker_environment")
    assert env["OVERSPILL_BROKER_ID"] == "${var.broker_id}"  # the tag the broker writes is the one IAM checks


LAUNCH_ACTIONS = frozenset(
    {"ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate", "ec2:DeleteLaunchTemplate", "ec2:CreateTags"}
)


def statements(document: str) -> list[dict[str, Any]]:
    """The statements of a policy document, those in `dynamic "statement"` blocks included (with `dynamic`)."""
    spec = named("data", "aws_iam_policy_document", document)
    found = [dict(s) for s in spec.get("statement", [])]
    for block in spec.get("dynamic", []):
        for content in block["statement"]["content"]:
            found.append({**content, "dynamic": block["statement"]["for_each"]})
    return found


def conditions(statement: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    return {c["variable"]: (c["test"], c["values"]) for c in statement.get("condition", [])}


def test_launch_statements_are_limited_to_the_configured_regions_and_this_brokers_tag() -> None:
    from providers.model import BROKER_TAG

    assert local("broker_tag") == BROKER_TAG
    launch = [s for s in statements("broker") if set(s["actions"]) & LAUNCH_ACTIONS]
    assert len(launch) >= 6
    for statement in launch:
        assert conditions(statement)["aws:RequestedRegion"] == ("StringEquals", "${local.regions}"), statement["sid"]
        resources = statement["resources"]
        text = resources if isinstance(resources, str) else " ".join(resources)
        assert "*:${local.account}:*" not in text and text != "*", statement["sid"]  # no "any EC2 resource"
    tag = "aws:RequestTag/${local.broker_tag}"
    created = {s["sid"]: s for s in launch if "instance/*" in str(s["resources"]) or "fleet/*" in str(s["resources"])}
    created_by_launch = {sid: s for sid, s in created.items() if not set(s["actions"]) <= {"ec2:TerminateInstances"}}
    for sid, statement in created_by_launch.items():
        assert conditions(statement)[tag] == ("StringEquals", ["${var.broker_id}"]), sid
    tagging = next(s for s in launch if s["actions"] == ["ec2:CreateTags"])
    assert conditions(tagging)["ec2:CreateAction"][1] == ["CreateFleet", "CreateLaunchTemplate", "RunInstances"]
    assert conditions(tagging)[tag] == ("StringEquals", ["${var.broker_id}"])
    own_templates = next(s for s in launch if "ec2:DeleteLaunchTemplate" in s["actions"])
    assert conditions(own_templates)["aws:ResourceTag/${local.broker_tag}"] == ("StringEquals", ["${var.broker_id}"])
    assert "launch-template/*" in str(own_templates["resources"]) and "instance/" not in str(own_templates["resources"])


def test_launches_use_only_the_allowed_images_and_the_instances_security_group() -> None:
    launch = [s for s in statements("broker") if {"ec2:RunInstances", "ec2:CreateFleet"} & set(s["actions"])]
    image_statements = [s for s in launch if "image/" in str(s["resources"])]
    assert {s["sid"] for s in image_statements} == {"Ec2LaunchAllowedImages", "Ec2LaunchImagesOfAllowedOwners"}
    by_id = next(s for s in image_statements if s["sid"] == "Ec2LaunchAllowedImages")
    assert "image/${i}" in by_id["resources"] and "local.image_ids" in by_id["resources"]
    assert "local.image_ids" in by_id["dynamic"]  # no images configured: no image statement, no launch
    by_owner = next(s for s in image_statements if s["sid"] == "Ec2LaunchImagesOfAllowedOwners")
    assert conditions(by_owner)["ec2:Owner"] == ("StringEquals", "${var.aws_allowed_image_owners}")
    assert local("image_ids") == (
        "${length(var.aws_allowed_image_ids) > 0 ? var.aws_allowed_image_ids : compact([var.aws_image_id])}"
    )
    network = next(s for s in launch if s["sid"] == "Ec2LaunchNetwork")
    assert "security-group/${aws_security_group.instances.id}" in network["resources"]
    assert "security-group/*" not in network["resources"]


def test_pass_role_is_the_instance_roles_and_only_to_ec2() -> None:
    passing = [s for s in statements("broker") if "iam:PassRole" in s["actions"]]
    assert len(passing) == 1
    assert passing[0]["actions"] == ["iam:PassRole"]
    assert passing[0]["resources"] == ["${aws_iam_role.instances.arn}"]
    assert conditions(passing[0]) == {"iam:PassedToService": ("StringEquals", ["ec2.amazonaws.com"])}
    for document in ("platform", "scheduler", "instances"):
        assert not any("iam:" in a for s in statements(document) for a in s["actions"]), document
    profile = named("resource", "aws_iam_instance_profile", "instances")
    assert profile["role"] == "${aws_iam_role.instances.name}"
    env = local("broker_environment")
    assert env["OVERSPILL_AWS_INSTANCE_PROFILE"] == "${aws_iam_instance_profile.instances.arn}"


def test_instance_role_may_touch_the_tenant_areas_and_read_the_agent_wheel_only() -> None:
    by_sid = {s["sid"]: s for s in statements("instances")}
    bucket = "${aws_s3_bucket.checkpoints.arn}"
    prefix = "${local.checkpoint_prefix}"
    assert local("checkpoint_prefix") == "overspill/"
    objects = by_sid["TenantObjects"]
    assert set(objects["actions"]) == {
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "s3:ListMultipartUploadParts",
    }
    assert objects["resources"] == [f"{bucket}/{prefix}tenants/*"]
    listing = by_sid["TenantListing"]
    assert listing["actions"] == ["s3:ListBucket"] and listing["resources"] == [bucket]
    assert conditions(listing) == {"s3:prefix": ("StringLike", [f"{prefix}tenants/*"])}
    wheel = by_sid["AgentWheel"]
    assert wheel["actions"] == ["s3:GetObject"] and wheel["resources"] == [f"{bucket}/{prefix}_agent/*"]
    s3_resources = [
        r for s in by_sid.values() if any(a.startswith("s3:") for a in s["actions"]) for r in s["resources"]
    ]
    assert not any("reports" in r for r in s3_resources)  # the reports bucket not at all
    secrets = by_sid["JobSecrets"]
    assert secrets["actions"] == ["secretsmanager:GetSecretValue"]
    assert ":secret:${local.instance_secret_prefix}*" in secrets["resources"]
    assert local("instance_secret_prefix") == '${coalesce(var.instance_secret_prefix, "${var.name}/jobs/")}'
    key = by_sid["DataKeyThroughS3AndSecrets"]
    assert set(key["actions"]) == {"kms:Decrypt", "kms:GenerateDataKey"} and key["resources"] == [
        "${aws_kms_key.this.arn}"
    ]
    assert "kms:ViaService" in conditions(key)
    assert by_sid["ImagePull"]["resources"] == "${var.instance_ecr_repository_arns}"
    assert set(by_sid["ImagePull"]["actions"]) == {
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
        "ecr:BatchCheckLayerAvailability",
    }
    assert by_sid["RegistryLogin"]["actions"] == ["ecr:GetAuthorizationToken"]
    assert "instance_ecr_repository_arns" in by_sid["ImagePull"]["dynamic"]  # none given: no ECR access
    assert set(by_sid) == {
        "TenantObjects",
        "TenantListing",
        "AgentWheel",
        "JobSecrets",
        "DataKeyThroughS3AndSecrets",
        "RegistryLogin",
        "ImagePull",
    }


def test_instance_security_group_has_no_ingress() -> None:
    group = named("resource", "aws_security_group", "instances")
    assert "ingress" not in group and group["vpc_id"] == "${var.vpc_id}"
    resources = module_blocks()["resource"]
    ingress = [
        spec
        for block in resources
        for kind in ("aws_vpc_security_group_ingress_rule", "aws_security_group_rule")
        for spec in block.get(kind, {}).values()
    ]
    assert not any("instances" in str(spec.get("security_group_id")) for spec in ingress)
    egress = [spec for block in resources for spec in block.get("aws_vpc_security_group_egress_rule", {}).values()]
    own = [e for e in egress if e["security_group_id"] == "${aws_security_group.instances.id}"]
    assert {(e["ip_protocol"], e.get("cidr_ipv4") or e.get("cidr_ipv6")) for e in own} == {
        ("-1", "0.0.0.0/0"),
        ("-1", "::/0"),
    }
    env = local("broker_environment")
    assert env["OVERSPILL_AWS_SECURITY_GROUP_IDS"] == "${jsonencode([aws_security_group.instances.id])}"
    assert env["OVERSPILL_AWS_IMDS_V2_REQUIRED"] == "true"


def test_metrics_token_and_callback_secret_are_generated_write_only_and_passed_as_arns() -> None:
    generated = local("generated_secrets")
    assert set(generated) == {"callback_secret", "metrics_token"}
    version = named("resource", "aws_secretsmanager_secret_version", "generated")
    assert "secret_string" not in version  # the value never enters the plan or the state
    assert version["secret_string_wo"] == (
        "${ephemeral.aws_secretsmanager_random_password.generated[each.key].random_password}"
    )
    assert version["secret_string_wo_version"] == "${var.generated_secrets_version}"
    secret = named("resource", "aws_secretsmanager_secret", "generated")
    assert secret["kms_key_id"] == "${aws_kms_key.this.arn}"
    assert secret["name_prefix"].startswith("${var.name}/broker/")  # outside the instances' secret prefix
    env = local("broker_environment")
    assert env["OVERSPILL_METRICS_TOKEN_ARN"] == '${aws_secretsmanager_secret.generated["metrics_token"].arn}'
    assert env["OVERSPILL_CALLBACK_SECRET_ARN"] == '${aws_secretsmanager_secret.generated["callback_secret"].arn}'
    assert "OVERSPILL_METRICS_TOKEN" not in env and "OVERSPILL_CALLBACK_SECRET" not in env
    reads = next(s for s in statements("broker") if s["sid"] == "BrokerSecrets")
    assert "aws_secretsmanager_secret.generated" in str(reads["resources"])
    function = named("resource", "aws_lambda_function", "broker")
    assert "${aws_secretsmanager_secret_version.generated}" in function["depends_on"]
    from broker.config.secrets import SECRET_FIELDS

    assert {"callback_secret", "metrics_token"} <= set(SECRET_FIELDS)  # both can come from an ARN


def test_checkpoint_store_is_the_checkpoint_bucket_under_the_stores_prefix() -> None:
    env = local("broker_environment")
    assert env["OVERSPILL_CHECKPOINT_STORES"] == (
        '${jsonencode({"aws/${local.region}" = "s3://${aws_s3_bucket.checkpoints.id}/${local.checkpoint_prefix}"})}'
    )
    assert env["OVERSPILL_PUBLIC_URL"] == "${aws_apigatewayv2_api.this.api_endpoint}"


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
    unknown = set(env) - settings_env - serverless.OWN_ENV - WORKLOAD_PLANE_SETTINGS
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
