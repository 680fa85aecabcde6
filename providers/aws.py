"""AWS EC2 compute provider: one instance per job attempt (spot or on-demand), read back, stopped, and spot
interruption warnings turned into notices.

Role: a `ComputeProvider` and `InterruptionSource` (providers.base), named "aws" by default. Clients are injected:
one boto3 EC2 client per region (`ec2_clients`, keyed by region name) and, for interruption notices, an SQS client
with the URL of the queue an EventBridge rule feeds (`ensure_interruption_queue` builds both for self-hosted setups;
Terraform does it in the serverless deployment). Tests hand it clients pointed at a moto server or a Stubber.

Instance ids are "<region>:<EC2 id>" (`"us-east-1:i-0123456789abcdef0"`, see `instance_ref`): an EC2 id is only
addressable through its regional endpoint, so the region travels with the id. `get` and `terminate` also accept a
bare "i-..." id and then search every configured region (what they return is always the namespaced id).

Contract (providers/base.py):
- `launch` is idempotent on `launch_token`, in two layers. (1) It first looks for an instance tagged
  `overspill:launch-token` = token in the offering's region, in any state (a terminated one included: AWS itself
  answers a repeated ClientToken with the original instance for at least 24 h after its termination, so the
  attempt is over and the broker sees how it ended) and returns it; a live one wins over terminated duplicates.
  (2) Otherwise RunInstances is sent with `ClientToken` = the token (its SHA-256 hex when longer than 64 ASCII
  characters), which covers a crash between launch and the tag becoming visible (DescribeInstances is eventually
  consistent). The instance and its volumes are tagged at creation with `Tags.as_dict()` plus
  `overspill:launch-token` and `overspill:offering` (the offering key), boot with `request.user_data` (the
  start-up script that starts the instance agent, providers.startup) as user data and
  `InstanceInitiatedShutdownBehavior=terminate` (the instance powers off when the attempt ends). SPOT offerings
  use InstanceMarketOptions (one-time, interruption behaviour terminate); ON_DEMAND and RESERVED launch on-demand
  (an open capacity reservation is used by AWS when one matches); ON_PREM is an `InvalidRequest`. `options`
  (`AwsLaunchOptions`) gives every launch its identity and hardening: the instance profile (ARN or name), the
  region's security groups, IMDSv2 required with a hop limit of 1 (the agent on the host reaches the instance's
  credentials, containers behind Docker's bridge do not), extra tags (the broker's own always win), and the root
  EBS volume (size, type, encrypted, deleted on termination; its device name is the AMI's `RootDeviceName`, read
  once per AMI with DescribeImages). `image_id_for` gives the AMI per offering: a fixed id, a callable, or an
  `AmiResolver` (an id per region, where `resolve:ssm:/name` is read from SSM Parameter Store, cached).
  `run_params` adds further account settings verbatim (KeyName, Placement...; with `use_fleet` everything goes
  into the launch template, so use keys valid in both).
- With `use_fleet=True` the launch goes through a per-launch launch template and CreateFleet `Type=instant`
  (price-capacity-optimized for spot, lowest-price on-demand, same ClientToken); the template is deleted afterwards.
  The template and the fleet carry the instance's tags too, so IAM can scope CreateLaunchTemplate, CreateFleet and
  DeleteLaunchTemplate to this broker's tag (terraform/iam.tf does).
  There is one override (the offering's type and zone), so it behaves like RunInstances today: it is the hook for
  diversifying over several pools. Fleet errors (`Errors[].ErrorCode`) map like RunInstances errors.
- `get` maps DescribeInstances (see `instance_state`): pending → PENDING; running → RUNNING; shutting-down, stopping,
  stopped and terminated by StateReason code: spot reclaim, scheduled retirement or capacity loss (Server.Spot*,
  Server.ScheduledStop, Server.InsufficientInstanceCapacity, any Server.* code on a spot instance) → PREEMPTED;
  Client.InstanceInitiatedShutdown → SUCCEEDED (EC2 cannot report the exit code, but the start-up script runs under
  `set -e` and only reaches `shutdown -h now` when the container exited 0); Client.UserInitiatedShutdown (an API
  terminate or stop: the broker's own), Client.UserInitiatedHibernate and Client.InstanceTerminated → TERMINATED;
  anything else (Server.InternalError, Client.VolumeLimitExceeded...) → FAILED with the reason as `detail`. A
  shutting-down or stopping instance without a reason yet stays RUNNING until the reason is known. `launched_at` is
  LaunchTime; `started_at` is LaunchTime once running or ended (None when the reason says it never booted);
  `ended_at` is the time in StateTransitionReason ("User initiated (2026-11-02 08:00:00 GMT)") when present. A
  stopping or stopped instance still holds its EBS volumes: it is `lingering` (terminate it); a shutting-down or
  terminated one holds nothing. An id
  AWS does not know (InvalidInstanceID.NotFound/Malformed) raises `NotFound`, except that an id this process
  launched less than `consistency_grace` ago is reported as launched (RunInstances → DescribeInstances lag).
- `terminate` calls TerminateInstances; unknown, malformed or already-terminated ids are success.
- `list_instances` returns every instance tagged `overspill:broker` = broker_id in every configured region, in any
  state: terminated ones are included for as long as EC2 still shows them (about an hour).
- `poll_interruptions` reads the queue (up to `max_poll_batches` batches of 10) for EventBridge events "EC2 Spot
  Instance Interruption Warning" (kind "interruption", `action_at` = event time + 2 min) and "EC2 Instance Rebalance
  Recommendation" (kind "rebalance", no deadline), raw or wrapped in an SNS envelope. A notice's message is deleted
  only when the broker calls `ack_interruptions` after acting on it, so a crash in between loses nothing: SQS
  delivers it again after `redeliver_after` (the receive's VisibilityTimeout) and acting twice is a no-op. Other
  event types are deleted at once silently, malformed ones logged and deleted, never raised.
  Notices for instances of other brokers are returned too: the broker matches ids (and acknowledges them).
  EventBridge rules are regional: events from other regions reach the queue only through a cross-region bus rule.
  Bodies are parsed by `notice_from_message_body`, which the Lambda entry point (`broker.serverless`) shares for the
  messages its SQS event source mapping delivers.
- Errors (ClientError codes): capacity (InsufficientInstanceCapacity, InsufficientCapacity, SpotMaxPriceTooLow...)
  → `InsufficientCapacity` (zone); InstanceLimitExceeded, VcpuLimitExceeded, MaxSpotInstanceCountExceeded →
  `QuotaExceeded` (region); RequestLimitExceeded, Throttling and 5xx-type codes → `Throttled`; UnauthorizedOperation
  and AccessDenied (an IAM, permission-boundary or service control policy refused this request: "... with an
  explicit deny in a service control policy", a tag or instance-type condition not met) → `PolicyDenied`, scoped to
  the request, with AWS's message; AuthFailure and the other credential failures → `AuthError`; InvalidParameter*,
  Invalid*, Unsupported, IdempotentParameterMismatch, ParameterNotFound (an SSM image parameter) →
  `InvalidRequest`; anything else (and connection errors) → `ProviderError`.
- Retries: every EC2 call runs under `retry` (providers.retry.RetryPolicy; default 3 attempts, full-jitter
  exponential backoff). Only transient failures are retried (throttling, 5xx that are not capacity or quota answers,
  timeouts and dropped connections: `transient`); a capacity error is raised at once (EC2 sends it as HTTP 500, and
  botocore would retry it in the same zone) so the broker blocklists the zone and fails over. Build the boto3
  clients with botocore retries off (`Config(retries={"total_max_attempts": 1})`) and connect/read timeouts set,
  as `broker.config.providers` does. A retried RunInstances resends the same ClientToken, so a request that reached
  EC2 before its response was lost does not launch twice.

moto 5.2 (what the tests can and cannot show): RunInstances ignores ClientToken (a repeat makes a second instance,
so only layer 1 is exercised there) and accepts any ImageId; the `client-token` and `instance-lifecycle` filters are
not implemented (HTTP 500), so neither is used here; TerminateInstances always records Client.UserInitiatedShutdown
(moto cannot reclaim a spot instance, so the spot and self-shutdown mappings are tested on hand-written responses);
CreateFleet honours only the first override; EventBridge → SQS delivery works.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError

from providers.base import (
    AuthError,
    Instance,
    InstanceState,
    InsufficientCapacity,
    InterruptionNotice,
    InvalidRequest,
    LaunchRequest,
    NotFound,
    PolicyDenied,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from providers.model import BROKER_TAG, LAUNCH_TOKEN_TAG, OFFERING_TAG, CapacityType, Offering
from providers.retry import RetryPolicy

log = logging.getLogger(__name__)

TAG_BROKER = BROKER_TAG
TAG_LAUNCH_TOKEN = LAUNCH_TOKEN_TAG
TAG_OFFERING = OFFERING_TAG
INTERRUPTION_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
INTERRUPTION_EVENT_PATTERN: dict[str, list[str]] = {
    "source": ["aws.ec2"],
    "detail-type": [INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION],
}
INTERRUPTION_LEAD = timedelta(minutes=2)
MAX_CLIENT_TOKEN = 64
MAX_TAG_VALUE = 256

_CAPACITY = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientFreeAddressesInSubnet",
        "SpotMaxPriceTooLow",
        "UnfulfillableCapacity",
    }
)
_QUOTA = frozenset(
    {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "VolumeLimitExceeded"}
)
_THROTTLED = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "RequestThrottled",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
    }
)
_POLICY = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"})
_AUTH = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "ExpiredToken",
        "SignatureDoesNotMatch",
        "OptInRequired",
        "Blocked",
    }
)
_NOT_FOUND = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})
_DESCRIBE_BATCH = 200  # instance ids per DescribeInstances call (a filter's value list is bounded)
_INVALID = frozenset(
    {
        "Unsupported",
        "UnsupportedOperation",
        "MissingParameter",
        "IdempotentParameterMismatch",
        "ValidationError",
        "ParameterNotFound",
        "ParameterVersionNotFound",
    }
)
_TEMPLATE_EXISTS = "InvalidLaunchTemplateName.AlreadyExistsException"

_PREEMPTION_REASONS = frozenset(
    {
        "Server.SpotInstanceTermination",
        "Server.SpotInstanceShutdown",
        "Server.ScheduledStop",
        "Server.InsufficientInstanceCapacity",
    }
)
_SELF_SHUTDOWN = "Client.InstanceInitiatedShutdown"
_USER_REASONS = frozenset(
    {"Client.UserInitiatedShutdown", "Client.UserInitiatedHibernate", "Client.InstanceTerminated"}
)
_NEVER_STARTED = frozenset(
    {
        "Server.InsufficientInstanceCapacity",
        "Server.InternalError",
        "Client.InternalError",
        "Client.VolumeLimitExceeded",
        "Client.InvalidSnapshot.NotFound",
    }
)
_ENDING = frozenset({"shutting-down", "stopping"})
_ENDED = frozenset({"terminated", "stopped"})
_HOLDS_VOLUMES = frozenset({"stopping", "stopped"})  # ended, but the EBS volumes stay (and bill) until terminated
SSM_PREFIX = "resolve:ssm:"
_EC2_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
_TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


class EC2Client(Protocol):
    """What the provider uses of a boto3 EC2 client."""

    def run_instances(self, **kwargs: Any) -> dict[str, Any]: ...

    def describe_instances(self, **kwargs: Any) -> dict[str, Any]: ...

    def terminate_instances(self, **kwargs: Any) -> dict[str, Any]: ...

    def create_launch_template(self, **kwargs: Any) -> dict[str, Any]: ...

    def delete_launch_template(self, **kwargs: Any) -> dict[str, Any]: ...

    def create_fleet(self, **kwargs: Any) -> dict[str, Any]: ...

    def describe_images(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_paginator(self, operation_name: str) -> Any: ...


class SSMClient(Protocol):
    """What `AmiResolver` uses of a boto3 SSM client."""

    def get_parameter(self, **kwargs: Any) -> dict[str, Any]: ...


class SQSClient(Protocol):
    """What the provider and `ensure_interruption_queue` use of a boto3 SQS client."""

    def receive_message(self, **kwargs: Any) -> dict[str, Any]: ...

    def delete_message_batch(self, **kwargs: Any) -> dict[str, Any]: ...

    def create_queue(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_queue_attributes(self, **kwargs: Any) -> dict[str, Any]: ...

    def set_queue_attributes(self, **kwargs: Any) -> dict[str, Any]: ...


class EventsClient(Protocol):
    """What `ensure_interruption_queue` uses of a boto3 EventBridge client."""

    def put_rule(self, **kwargs: Any) -> dict[str, Any]: ...

    def put_targets(self, **kwargs: Any) -> dict[str, Any]: ...


# -- ids, tokens, errors -------------------------------------------------------------------------------------------


def instance_ref(region: str, ec2_id: str) -> str:
    """The provider's instance id: the region, a colon, the EC2 id."""
    return f"{region}:{ec2_id}"


def parse_instance_ref(instance_id: str) -> tuple[str | None, str]:
    """(region, EC2 id) of a provider id; region None for a bare EC2 id."""
    region, sep, ec2_id = instance_id.rpartition(":")
    return (region or None, ec2_id) if sep else (None, instance_id)


def client_token(launch_token: str) -> str:
    """The RunInstances/CreateFleet ClientToken for a launch token: itself when ≤ 64 ASCII chars, else its SHA-256."""
    if len(launch_token) <= MAX_CLIENT_TOKEN and launch_token.isascii():
        return launch_token
    return hashlib.sha256(launch_token.encode()).hexdigest()


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def error_class(code: str) -> type[ProviderError]:
    """The typed provider error for an AWS error code."""
    if code in _CAPACITY:
        return InsufficientCapacity
    if code in _QUOTA:
        return QuotaExceeded
    if code in _THROTTLED:
        return Throttled
    if code in _POLICY:
        return PolicyDenied
    if code in _AUTH:
        return AuthError
    if code in _NOT_FOUND:
        return NotFound
    if code in _INVALID or code.startswith("Invalid"):
        return InvalidRequest
    return ProviderError


def transient(exc: BaseException) -> bool:
    """Worth retrying the same call after a pause: throttling, a 5xx that is not a capacity or quota answer,
    a timeout or a dropped connection. A capacity error (HTTP 500 on EC2) is an answer: fail over instead."""
    if isinstance(exc, HTTPClientError):  # connect/read timeouts, refused or closed connections
        return True
    if not isinstance(exc, ClientError):
        return False
    code = error_code(exc)
    if code in _THROTTLED:
        return True
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return status >= 500 and error_class(code) is ProviderError


def provider_error(exc: ClientError | BotoCoreError, *, provider: str, action: str) -> ProviderError:
    """A botocore failure as the typed provider error; `detail` holds the AWS error code."""
    if isinstance(exc, BotoCoreError):
        return ProviderError(f"{action} failed: {exc}", provider=provider, detail=type(exc).__name__)
    code = error_code(exc)
    message = str(exc.response.get("Error", {}).get("Message", ""))
    return error_class(code)(f"{action} failed: {code}: {message}", provider=provider, detail=code)


# -- describe → Instance ---------------------------------------------------------------------------------------------


def _utc(value: datetime | str) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _reason(raw: Mapping[str, Any]) -> tuple[str, str]:
    reason = raw.get("StateReason") or {}
    code = str(reason.get("Code") or "")
    return code, str(reason.get("Message") or code)


def instance_state(raw: Mapping[str, Any]) -> tuple[InstanceState, str]:
    """The state of one DescribeInstances instance and a human-readable detail (see the module docstring)."""
    name = str((raw.get("State") or {}).get("Name") or "")
    code, message = _reason(raw)
    if name == "running":
        return InstanceState.RUNNING, name
    if name not in _ENDING and name not in _ENDED:
        return InstanceState.PENDING, name
    detail = f"{name}: {message}" if code else name
    spot = raw.get("InstanceLifecycle") == "spot"
    if code in _PREEMPTION_REASONS or (spot and code.startswith("Server.")):
        return InstanceState.PREEMPTED, detail
    if code == _SELF_SHUTDOWN:
        return InstanceState.SUCCEEDED, detail
    if code in _USER_REASONS:
        return InstanceState.TERMINATED, detail
    if not code:
        if name in _ENDING:
            return InstanceState.RUNNING, detail  # the reason follows; don't decide on a guess
        if spot:
            return InstanceState.PREEMPTED, f"{name} without a state reason (spot)"
        return InstanceState.FAILED, f"{name} without a state reason"
    return InstanceState.FAILED, detail


def transition_time(reason: str | None) -> datetime | None:
    """The UTC time in a StateTransitionReason like "User initiated (2026-11-02 08:00:00 GMT)", if any."""
    match = _TRANSITION_TIME.search(reason or "")
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def tag_dict(raw: Mapping[str, Any]) -> dict[str, str]:
    return {str(t["Key"]): str(t.get("Value", "")) for t in raw.get("Tags") or ()}


def instance_from_description(raw: Mapping[str, Any], *, region: str, provider: str) -> Instance:
    """The provider's view of one DescribeInstances (or RunInstances) instance."""
    tags = tag_dict(raw)
    state, detail = instance_state(raw)
    code, _ = _reason(raw)
    launched_at = _utc(raw["LaunchTime"])
    started = state is InstanceState.RUNNING or (state.terminal and code not in _NEVER_STARTED)
    return Instance(
        id=instance_ref(region, str(raw["InstanceId"])),
        provider=provider,
        offering_key=tags.get(TAG_OFFERING, ""),
        launch_token=tags.get(TAG_LAUNCH_TOKEN, ""),
        state=state,
        tags=tags,
        launched_at=launched_at,
        started_at=launched_at if started else None,
        ended_at=transition_time(raw.get("StateTransitionReason")) if state.terminal else None,
        detail=detail,
        lingering=state.terminal and str((raw.get("State") or {}).get("Name") or "") in _HOLDS_VOLUMES,
    )


# -- interruption events ---------------------------------------------------------------------------------------------


def _event_of(body: str) -> Mapping[str, Any]:
    event = json.loads(body)
    if isinstance(event, dict) and event.get("Type") == "Notification" and isinstance(event.get("Message"), str):
        event = json.loads(event["Message"])  # delivered through SNS
    if not isinstance(event, dict):
        raise ValueError("not a JSON object")
    return event


def _event_region(event: Mapping[str, Any]) -> str:
    region = event.get("region")
    if isinstance(region, str) and region:
        return region
    for arn in event.get("resources") or ():
        parts = str(arn).split(":")
        if len(parts) > 3 and parts[3]:
            return re.sub(r"(\d)[a-z]$", r"\1", parts[3])  # the warning's ARN carries the zone, not the region
    raise ValueError("no region in the event")


def notice_from_event(event: Mapping[str, Any], *, provider: str) -> InterruptionNotice | None:
    """The notice an EventBridge EC2 event carries; None for other event types; ValueError when malformed."""
    kind = {INTERRUPTION_WARNING: "interruption", REBALANCE_RECOMMENDATION: "rebalance"}.get(
        str(event.get("detail-type"))
    )
    if kind is None:
        return None
    detail = event.get("detail")
    ec2_id = detail.get("instance-id") if isinstance(detail, dict) else None
    if not isinstance(ec2_id, str) or not _EC2_ID.match(ec2_id):
        raise ValueError(f"no valid instance-id in {kind} event")
    at = _utc(str(event["time"]))
    return InterruptionNotice(
        instance_id=instance_ref(_event_region(event), ec2_id),
        provider=provider,
        kind=kind,
        at=at,
        action_at=at + INTERRUPTION_LEAD if kind == "interruption" else None,
        raw=dict(event),
    )


def notice_from_message_body(body: str, *, provider: str) -> InterruptionNotice | None:
    """The notice one SQS message body carries: an EventBridge event, raw or wrapped in an SNS envelope.

    Shared by `AwsProvider.poll_interruptions` (the broker polls the queue) and the Lambda entry point
    (`broker.serverless`, where the SQS event source mapping delivers the same bodies). None for other event
    types; ValueError (json.JSONDecodeError included), KeyError or TypeError when the body is malformed.
    """
    return notice_from_event(_event_of(body), provider=provider)


def ensure_interruption_queue(
    events_client: EventsClient,
    sqs_client: SQSClient,
    queue_name: str,
    *,
    rule_name: str = "overspill-ec2-interruptions",
) -> str:
    """Create (or keep) the SQS queue, the EventBridge rule on aws.ec2 interruption and rebalance events, the
    queue policy letting that rule send, and the rule's target; return the queue URL. Idempotent; the queue's
    policy is replaced. Regional: call it in the region whose events the queue should receive."""
    try:
        url = str(sqs_client.create_queue(QueueName=queue_name)["QueueUrl"])
        queue_arn = sqs_client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        rule_arn = events_client.put_rule(
            Name=rule_name,
            EventPattern=json.dumps(INTERRUPTION_EVENT_PATTERN),
            State="ENABLED",
            Description="Overspill: EC2 spot interruption warnings and rebalance recommendations to SQS",
        )["RuleArn"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "overspill-eventbridge",
                    "Effect": "Allow",
                    "Principal": {"Service": "events.amazonaws.com"},
                    "Action": "sqs:SendMessage",
                    "Resource": queue_arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}},
                }
            ],
        }
        sqs_client.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(policy)})
        result = events_client.put_targets(Rule=rule_name, Targets=[{"Id": "overspill-sqs", "Arn": queue_arn}])
    except (ClientError, BotoCoreError) as exc:
        raise provider_error(exc, provider="aws", action="setting up the interruption queue") from exc
    if result.get("FailedEntryCount"):
        raise ProviderError(f"put_targets failed: {result.get('FailedEntries')}", provider="aws")
    return url


# -- the provider ----------------------------------------------------------------------------------------------------


def _escape_filter(value: str) -> str:
    """A DescribeInstances filter value matched literally (`*` and `?` are wildcards there)."""
    return re.sub(r"([*?\\])", r"\\\1", value)


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _notice_key(notice: InterruptionNotice) -> tuple[str, str, datetime]:
    return notice.instance_id, notice.kind, notice.at


@dataclass(frozen=True, slots=True)
class AwsLaunchOptions:
    """The account settings every launch carries (see the module docstring).

    `instance_profile`: an instance profile ARN ("arn:aws:iam::...:instance-profile/...") or name; "" for none.
    `security_group_ids`: by region, "*" for any region without its own entry; none: the subnet's default.
    `imds_v2_required`: HttpTokens required and a PUT hop limit of 1 (False leaves the account's default).
    `extra_tags`: added to the instance and its volumes; the broker's own tags win on a clash.
    `root_volume_gb`: size of the root EBS volume (None: the AMI's), of `root_volume_type`, encrypted with the
    account's default key, deleted on termination."""

    instance_profile: str = ""
    security_group_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    imds_v2_required: bool = True
    extra_tags: Mapping[str, str] = field(default_factory=dict)
    root_volume_gb: int | None = None
    root_volume_type: str = "gp3"

    def security_groups(self, region: str) -> tuple[str, ...]:
        return tuple(self.security_group_ids.get(region, self.security_group_ids.get("*", ())))


class AmiResolver:
    """The AMI for an offering's region: `images[region]`, else `default`. A value `resolve:ssm:<name>` is the
    value of that SSM parameter in the region (e.g. "resolve:ssm:/aws/service/deeplearning/ami/x86_64/
    base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"), read with GetParameter and cached for `ttl`, so a
    launch costs no SSM call while the cache holds. AMIs are regional: one id cannot serve every region.

    Raises `InvalidRequest` for a region without an image or a parameter SSM does not have, and the typed error of
    any other SSM failure (throttling is retried under `retry`)."""

    def __init__(
        self,
        images: Mapping[str, str],
        *,
        default: str = "",
        ssm_clients: Mapping[str, SSMClient] | Callable[[str], SSMClient] | None = None,
        ttl: timedelta = timedelta(hours=1),
        clock: Callable[[], datetime] | None = None,
        retry: RetryPolicy | None = None,
        provider: str = "aws",
    ) -> None:
        self.images = dict(images)
        self.default = default
        self._ssm = ssm_clients
        self._ttl = ttl
        self._clock = clock or (lambda: datetime.now(UTC))
        self.retry = retry or RetryPolicy()
        self._provider = provider
        self._cache: dict[tuple[str, str], tuple[datetime, str]] = {}
        self._lock = threading.Lock()

    def image_for(self, region: str) -> str:
        """The configured value for `region` (an AMI id or a `resolve:ssm:` reference), "" when none."""
        return self.images.get(region, self.default)

    def __call__(self, offering: Offering) -> str:
        region = offering.region
        value = self.image_for(region)
        if not value:
            raise InvalidRequest(f"no AMI configured for region {region}", provider=self._provider, detail=region)
        if not value.startswith(SSM_PREFIX):
            return value
        name = value.removeprefix(SSM_PREFIX)
        now = self._clock()
        with self._lock:
            cached = self._cache.get((region, name))
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        ami = self._resolve(region, name)
        with self._lock:
            self._cache[(region, name)] = (now, ami)
        return ami

    def _client(self, region: str) -> SSMClient:
        if self._ssm is None:
            raise InvalidRequest(f"no SSM client to resolve images in {region}", provider=self._provider)
        if callable(self._ssm) and not isinstance(self._ssm, Mapping):
            return self._ssm(region)
        client = self._ssm.get(region)
        if client is None:
            raise InvalidRequest(f"no SSM client for region {region}", provider=self._provider)
        return client

    def _resolve(self, region: str, name: str) -> str:
        ssm = self._client(region)
        action = f"resolving the image parameter {name} in {region}"
        try:
            response = self.retry.call(lambda: ssm.get_parameter(Name=name), transient)
        except (ClientError, BotoCoreError) as exc:
            raise provider_error(exc, provider=self._provider, action=action) from exc
        value = str((response.get("Parameter") or {}).get("Value") or "")
        if not value.startswith("ami-"):
            raise InvalidRequest(f"{action}: {value!r} is not an AMI id", provider=self._provider, detail=name)
        return value


class AwsProvider:
    """EC2 instances for the broker (see the module docstring for the contract and the state mapping)."""

    boots_agent: ClassVar[bool] = True  # its instances run the instance agent (broker.agent_side.attempt_spec)
    notice_source: ClassVar[str] = "aws"  # the interruption notice the agent watches there

    def __init__(
        self,
        ec2_clients: Mapping[str, EC2Client],
        *,
        broker_id: str,
        sqs_client: SQSClient | None = None,
        queue_url: str | None = None,
        image_id_for: Callable[[Offering], str] | str,
        subnet_for: Callable[[Offering], str | None] | None = None,
        use_fleet: bool = False,
        name: str = "aws",
        options: AwsLaunchOptions | None = None,
        run_params: Mapping[str, Any] | None = None,
        max_poll_batches: int = 10,
        consistency_grace: timedelta = timedelta(seconds=60),
        clock: Callable[[], datetime] | None = None,
        retry: RetryPolicy | None = None,
        redeliver_after: timedelta = timedelta(seconds=60),
    ) -> None:
        if not ec2_clients:
            raise ValueError("AwsProvider needs at least one regional EC2 client")
        self.name = name
        self.broker_id = broker_id
        self._clients = dict(ec2_clients)
        self._sqs = sqs_client
        self._queue_url = queue_url
        self._image_id_for = image_id_for
        self._subnet_for = subnet_for
        self._use_fleet = use_fleet
        self.options = options or AwsLaunchOptions()
        self._run_params = dict(run_params or {})
        self._root_devices: dict[tuple[str, str], str] = {}  # (region, AMI) -> its RootDeviceName
        self._max_poll_batches = max_poll_batches
        self._grace = consistency_grace
        self._clock = clock or (lambda: datetime.now(UTC))
        self._recent: dict[str, tuple[datetime, Instance]] = {}
        self.retry = retry or RetryPolicy()
        self._redeliver_after = max(0, int(redeliver_after.total_seconds()))
        self._unacked: dict[tuple[str, str, datetime], list[str]] = {}

    def _ec2(self, fn: Callable[..., dict[str, Any]], **params: Any) -> dict[str, Any]:
        """One EC2 call under the retry policy (transient failures only; see `transient`)."""
        return self.retry.call(lambda: fn(**params), transient)

    @property
    def regions(self) -> list[str]:
        return list(self._clients)

    # -- launch --------------------------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Instance:
        offering = request.offering
        ec2 = self._client_for(offering)
        if len(request.launch_token) > MAX_TAG_VALUE or not request.launch_token:
            raise InvalidRequest("a launch token must be 1-256 characters", provider=self.name)
        existing = self._find_by_token(ec2, offering.region, request.launch_token)
        if existing is not None:
            return existing
        tags = {
            **self.options.extra_tags,
            **request.tags.as_dict(),
            TAG_LAUNCH_TOKEN: request.launch_token,
            TAG_OFFERING: offering.key,
        }
        image_id = self._image_id_for if isinstance(self._image_id_for, str) else self._image_id_for(offering)
        subnet_id = self._subnet_for(offering) if self._subnet_for else None
        base = self._base_params(ec2, offering.region, tags, image_id)
        if self._use_fleet:
            raw = self._launch_fleet(ec2, request, tags, base, subnet_id)
        else:
            raw = self._run_instance(ec2, request, base, subnet_id)
        instance = instance_from_description(
            {**raw, "Tags": _tag_list({**tags, **tag_dict(raw)})}, region=offering.region, provider=self.name
        )
        self._recent[instance.id] = (self._clock(), instance)
        return instance

    def _client_for(self, offering: Offering) -> EC2Client:
        if offering.provider != self.name:
            raise InvalidRequest(f"offering {offering.key} is not for provider {self.name}", provider=self.name)
        if offering.capacity_type is CapacityType.ON_PREM:
            raise InvalidRequest(f"offering {offering.key} is on-prem capacity", provider=self.name)
        ec2 = self._clients.get(offering.region)
        if ec2 is None:
            raise InvalidRequest(f"no EC2 client for region {offering.region}", provider=self.name)
        return ec2

    def _find_by_token(self, ec2: EC2Client, region: str, token: str) -> Instance | None:
        filters = [
            {"Name": f"tag:{TAG_LAUNCH_TOKEN}", "Values": [_escape_filter(token)]},
        ]
        found = [
            raw
            for raw in self._describe(ec2, "looking up the launch token", Filters=filters)
            if tag_dict(raw).get(TAG_LAUNCH_TOKEN) == token
        ]
        if not found:
            return None
        if len(found) > 1:
            log.warning("launch token %s matches %d instances in %s", token, len(found), region)
        best = max(found, key=lambda r: ((r.get("State") or {}).get("Name") != "terminated", _utc(r["LaunchTime"])))
        return instance_from_description(best, region=region, provider=self.name)

    def _base_params(self, ec2: EC2Client, region: str, tags: Mapping[str, str], image_id: str) -> dict[str, Any]:
        """The parameters RunInstances and a launch template share: image, tags, identity, hardening, root disk."""
        opts = self.options
        params: dict[str, Any] = {
            **self._run_params,
            "ImageId": image_id,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tag_list(tags)},
                {"ResourceType": "volume", "Tags": _tag_list(tags)},
            ],
        }
        if opts.instance_profile:
            key = "Arn" if opts.instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: opts.instance_profile}
        groups = opts.security_groups(region)
        if groups:
            params["SecurityGroupIds"] = list(groups)
        if opts.imds_v2_required:
            params["MetadataOptions"] = {
                "HttpTokens": "required",
                "HttpPutResponseHopLimit": 1,
                "HttpEndpoint": "enabled",
            }
        if opts.root_volume_gb:
            params["BlockDeviceMappings"] = [
                {
                    "DeviceName": self._root_device(ec2, region, image_id),
                    "Ebs": {
                        "VolumeSize": opts.root_volume_gb,
                        "VolumeType": opts.root_volume_type,
                        "DeleteOnTermination": True,
                        "Encrypted": True,
                    },
                }
            ]
        return params

    def _root_device(self, ec2: EC2Client, region: str, image_id: str) -> str:
        """The AMI's root device name ("/dev/xvda", "/dev/sda1"...), asked once per AMI and region."""
        known = self._root_devices.get((region, image_id))
        if known is not None:
            return known
        action = f"describing image {image_id} in {region}"
        try:
            response = self._ec2(ec2.describe_images, ImageIds=[image_id])
        except (ClientError, BotoCoreError) as exc:
            raise provider_error(exc, provider=self.name, action=action) from exc
        images = response.get("Images") or []
        if not images:
            raise InvalidRequest(f"{action}: no such image", provider=self.name, detail="InvalidAMIID.NotFound")
        device = str(images[0].get("RootDeviceName") or "/dev/xvda")
        self._root_devices[(region, image_id)] = device
        return device

    def _run_instance(
        self, ec2: EC2Client, request: LaunchRequest, base: Mapping[str, Any], subnet_id: str | None
    ) -> Mapping[str, Any]:
        offering = request.offering
        params: dict[str, Any] = {
            **base,
            "ClientToken": client_token(request.launch_token),
            "InstanceType": offering.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "Placement": {**self._run_params.get("Placement", {}), "AvailabilityZone": offering.zone},
        }
        if request.user_data is not None:
            params["UserData"] = request.user_data  # boto3 base64-encodes RunInstances user data itself
        if subnet_id:
            params["SubnetId"] = subnet_id
        if offering.capacity_type is CapacityType.SPOT:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        try:
            response = self._ec2(ec2.run_instances, **params)
        except (ClientError, BotoCoreError) as exc:
            raise provider_error(exc, provider=self.name, action=f"launching {offering.key}") from exc
        return dict(response["Instances"][0])

    def _launch_fleet(
        self,
        ec2: EC2Client,
        request: LaunchRequest,
        tags: Mapping[str, str],
        base: Mapping[str, Any],
        subnet_id: str | None,
    ) -> Mapping[str, Any]:
        offering = request.offering
        spot = offering.capacity_type is CapacityType.SPOT
        template = "overspill-" + hashlib.sha256(request.launch_token.encode()).hexdigest()[:40]
        data = dict(base)
        if request.user_data is not None:
            data["UserData"] = base64.b64encode(request.user_data.encode()).decode()
        action = f"launching {offering.key} (fleet)"
        try:
            self._ec2(
                ec2.create_launch_template,
                LaunchTemplateName=template,
                LaunchTemplateData=data,
                TagSpecifications=[{"ResourceType": "launch-template", "Tags": _tag_list(tags)}],
            )
        except ClientError as exc:
            if error_code(exc) != _TEMPLATE_EXISTS:  # left over by a crashed attempt with this token: reuse it
                raise provider_error(exc, provider=self.name, action=action) from exc
        except BotoCoreError as exc:
            raise provider_error(exc, provider=self.name, action=action) from exc
        override = {"InstanceType": offering.instance_type, "AvailabilityZone": offering.zone}
        if subnet_id:
            override["SubnetId"] = subnet_id
        params: dict[str, Any] = {
            "Type": "instant",
            "ClientToken": client_token(request.launch_token),
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": {"LaunchTemplateName": template, "Version": "$Latest"},
                    "Overrides": [override],
                }
            ],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": 1,
                "DefaultTargetCapacityType": "spot" if spot else "on-demand",
            },
            "TagSpecifications": [{"ResourceType": "fleet", "Tags": _tag_list(tags)}],
        }
        if spot:
            params["SpotOptions"] = {
                "AllocationStrategy": "price-capacity-optimized",
                "InstanceInterruptionBehavior": "terminate",
            }
        else:
            params["OnDemandOptions"] = {"AllocationStrategy": "lowest-price"}
        try:
            response = self._ec2(ec2.create_fleet, **params)
        except (ClientError, BotoCoreError) as exc:
            raise provider_error(exc, provider=self.name, action=action) from exc
        finally:
            try:
                self._ec2(ec2.delete_launch_template, LaunchTemplateName=template)
            except (ClientError, BotoCoreError) as exc:
                log.warning("could not delete launch template %s: %s", template, exc)
        ids = [i for group in response.get("Instances") or () for i in group.get("InstanceIds") or ()]
        if not ids:
            errors = response.get("Errors") or [{}]
            code = str(errors[0].get("ErrorCode") or "UnfulfillableCapacity")
            message = str(errors[0].get("ErrorMessage") or "the fleet launched nothing")
            raise error_class(code)(f"{action} failed: {code}: {message}", provider=self.name, detail=code)
        described = self._describe_one(ec2, ids[0])
        if described is not None:
            return described
        return {  # not visible yet (eventual consistency): what we know
            "InstanceId": ids[0],
            "State": {"Name": "pending"},
            "LaunchTime": self._clock(),
            "InstanceLifecycle": "spot" if spot else "",
        }

    # -- read and stop -------------------------------------------------------------------------------------------

    def _describe(self, ec2: EC2Client, action: str, **params: Any) -> list[dict[str, Any]]:
        try:
            pages = self.retry.call(lambda: list(ec2.get_paginator("describe_instances").paginate(**params)), transient)
        except (ClientError, BotoCoreError) as exc:
            raise provider_error(exc, provider=self.name, action=action) from exc
        return [inst for page in pages for res in page.get("Reservations") or () for inst in res.get("Instances") or ()]

    def _describe_one(self, ec2: EC2Client, ec2_id: str) -> dict[str, Any] | None:
        try:
            response = self._ec2(ec2.describe_instances, InstanceIds=[ec2_id])
        except ClientError as exc:
            if error_code(exc) in _NOT_FOUND:
                return None
            raise provider_error(exc, provider=self.name, action=f"describing {ec2_id}") from exc
        except BotoCoreError as exc:
            raise provider_error(exc, provider=self.name, action=f"describing {ec2_id}") from exc
        found = [i for res in response.get("Reservations") or () for i in res.get("Instances") or ()]
        return dict(found[0]) if found else None

    def _regions_of(self, instance_id: str) -> tuple[list[str], str]:
        region, ec2_id = parse_instance_ref(instance_id)
        if not _EC2_ID.match(ec2_id):
            return [], ec2_id
        if region is None:
            return list(self._clients), ec2_id
        return ([region] if region in self._clients else []), ec2_id

    def get(self, instance_id: str) -> Instance:
        regions, ec2_id = self._regions_of(instance_id)
        for region in regions:
            raw = self._describe_one(self._clients[region], ec2_id)
            if raw is not None:
                return instance_from_description(raw, region=region, provider=self.name)
        recent = self._recent.get(instance_id)
        if recent is not None and self._clock() - recent[0] < self._grace:
            return recent[1]
        raise NotFound(f"no instance {instance_id}", provider=self.name)

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, Instance]:
        """One paginated DescribeInstances per region and 200 ids, filtered on `instance-id` (unlike `InstanceIds`,
        a filter does not fail the whole call when one id is unknown). Ids not found fall back on the launch-time
        view for the eventual-consistency grace, as in `get`."""
        wanted: dict[str, dict[str, str]] = {}  # region -> EC2 id -> the id asked for
        for iid in instance_ids:
            regions, ec2_id = self._regions_of(iid)
            for region in regions:
                wanted.setdefault(region, {})[ec2_id] = iid
        out: dict[str, Instance] = {}
        for region, by_ec2_id in wanted.items():
            ids = list(by_ec2_id)
            for start in range(0, len(ids), _DESCRIBE_BATCH):
                chunk = ids[start : start + _DESCRIBE_BATCH]
                filters = [{"Name": "instance-id", "Values": chunk}]
                action = f"describing {len(chunk)} instances in {region}"
                for raw in self._describe(self._clients[region], action, Filters=filters):
                    iid = by_ec2_id.get(str(raw.get("InstanceId")))
                    if iid is not None:
                        out[iid] = instance_from_description(raw, region=region, provider=self.name)
        now = self._clock()
        for iid in instance_ids:
            recent = self._recent.get(iid)
            if iid not in out and recent is not None and now - recent[0] < self._grace:
                out[iid] = recent[1]
        return out

    def terminate(self, instance_id: str) -> None:
        self._recent.pop(instance_id, None)
        regions, ec2_id = self._regions_of(instance_id)
        for region in regions:
            try:
                self._ec2(self._clients[region].terminate_instances, InstanceIds=[ec2_id])
            except ClientError as exc:
                if error_code(exc) in _NOT_FOUND:
                    continue
                raise provider_error(exc, provider=self.name, action=f"terminating {instance_id}") from exc
            except BotoCoreError as exc:
                raise provider_error(exc, provider=self.name, action=f"terminating {instance_id}") from exc
            return

    def list_instances(self) -> list[Instance]:
        filters = [{"Name": f"tag:{TAG_BROKER}", "Values": [_escape_filter(self.broker_id)]}]
        out = []
        for region, ec2 in self._clients.items():
            for raw in self._describe(ec2, f"listing instances in {region}", Filters=filters):
                if tag_dict(raw).get(TAG_BROKER) == self.broker_id:
                    out.append(instance_from_description(raw, region=region, provider=self.name))
        return out

    # -- interruptions -------------------------------------------------------------------------------------------

    def poll_interruptions(self) -> list[InterruptionNotice]:
        if self._sqs is None or not self._queue_url:
            return []
        notices: list[InterruptionNotice] = []
        for _ in range(self._max_poll_batches):
            try:
                response = self._sqs.receive_message(
                    QueueUrl=self._queue_url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=0,
                    VisibilityTimeout=self._redeliver_after,
                )
            except (ClientError, BotoCoreError) as exc:
                raise provider_error(exc, provider=self.name, action="receiving interruption events") from exc
            messages = response.get("Messages") or []
            if not messages:
                break
            dropped = []
            for message in messages:
                notice = self._parse_message(message)
                if notice is None:
                    dropped.append(message)
                    continue
                notices.append(notice)
                self._unacked.setdefault(_notice_key(notice), []).append(str(message["ReceiptHandle"]))
            if dropped:
                self._delete(dropped)
        return notices

    def ack_interruptions(self, notices: Iterable[InterruptionNotice]) -> None:
        """Delete the messages of notices the broker has acted on. Notices never acknowledged (the broker
        crashed first) are delivered again after `redeliver_after`; acting on one twice is harmless."""
        handles = [h for n in notices for h in self._unacked.pop(_notice_key(n), [])]
        for i in range(0, len(handles), 10):
            self._delete([{"ReceiptHandle": h} for h in handles[i : i + 10]])

    def _parse_message(self, message: Mapping[str, Any]) -> InterruptionNotice | None:
        try:
            return notice_from_message_body(str(message.get("Body", "")), provider=self.name)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("dropping malformed interruption message %s: %s", message.get("MessageId"), exc)
            return None

    def _delete(self, messages: Iterable[Mapping[str, Any]]) -> None:
        entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)]
        assert self._sqs is not None
        try:
            result = self._sqs.delete_message_batch(QueueUrl=self._queue_url, Entries=entries)
        except (ClientError, BotoCoreError) as exc:
            log.warning("could not delete %d interruption messages (they will come back): %s", len(entries), exc)
            return
        for failed in result.get("Failed") or ():
            log.warning("could not delete interruption message %s: %s", failed.get("Id"), failed.get("Message"))
