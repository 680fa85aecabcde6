"""Google Compute Engine adapter: launches, watches and deletes the broker's GPU VMs through `google-cloud-compute`.

Role: the `ComputeProvider` (and `InterruptionSource`) for GCP. The caller injects a `compute_v1.InstancesClient`
and a `compute_v1.ZoneOperationsClient` (tests point both at a local fake with `transport="rest"`); this module
never builds clients or reads credentials.

Contract (see providers/base.py):
- `launch` is idempotent on the launch token twice over. The instance name is derived from the token
  (`instance_name`: "ovs-" + the token's first 20 RFC 1035-safe characters + "-" + 8 hex of its SHA-256), so a
  second insert of the same token answers 409 `alreadyExists` and the existing VM is returned; and every insert
  carries a `request_id` (a UUID5 of the token), so a retried insert within Google's idempotency window returns
  the original operation instead of failing. Launch returns as soon as Google accepted the insert: the VM's view is
  PENDING (the insert operation's outcome is not waited for: a tick must never stall on a cloud operation). An
  insert refused at once (a synchronous error, or an operation already DONE with an error) raises the typed error.
  A VM of that name made for another token is a collision (`InvalidRequest`).
- Following the insert: while the VM is not there, `get`/`get_many` read its insert operation (the one this object
  started, with `zoneOperations.get`; after a restart, the zone's insert operation targeting that VM, with one
  filtered `zoneOperations.list`). Still running: the VM is PENDING. DONE with an error (ZONE_RESOURCE_POOL_EXHAUSTED
  and the other stockout codes, QUOTA_EXCEEDED, an organisation policy constraint): the VM is FAILED, with
  `launch_error` = the typed error a synchronous answer would have raised, so the broker fails the placement over
  and blocklists the right scope. DONE without error (the VM was made, then deleted) or no operation: gone.
- Instance ids are "{zone}/{name}". `get` raises `NotFound` for a deleted VM or a malformed id.
- `terminate` issues the delete and does not wait for it; a 404 (or a malformed id) is success.
- Stopped is not gone: a VM in status TERMINATED (stopped by its guest, or preempted with termination action
  STOP) still holds its boot disk and bills for it, so its view is `lingering` until it is deleted; a VM this
  object has issued a delete for is reported released (STOPPING while Google deletes it), so the orphan sweep
  deletes each stopped VM once.
- `list_instances` runs one aggregated list filtered on `labels.overspill-broker`, then keeps only VMs whose exact
  tags (from metadata, below) name this broker.
- `get_many(ids)` (the `BatchDescriber` the broker's sync step calls every tick) answers for any number of VMs with
  that same aggregated list (all its pages: 500 VMs a page by default), keeping the ids asked for: one request per
  page, however many VMs, instead of one `instances.get` each. Each VM found gets exactly the view `get` gives (same
  state mapping, tags, timestamps); the preemption check of a stopped spot VM reads its zone's preemption operations
  once for all the zone's stopped spot VMs (one `zoneOperations.list` per zone that has one, none when every VM
  runs). An id absent from the answer is gone, as `get` raising `NotFound`; so is a malformed id, and a VM that does
  not carry this broker's tags (the list is this broker's VMs; `get` reads any VM by name). The list is not asked
  for partial success, and a zone it reports it could not reach (an UNREACHABLE warning on the zone's scope, or
  the zone in `unreachables`) while an id asked for lives there fails the whole call (`Throttled`) rather than
  making that zone's VMs look gone; a 404 on the list itself (a project that is not there) is a `ProviderError`,
  not `NotFound` for every id. An id asked for that the list does not show has its insert operation read (above):
  a launch still running or refused is answered as such, not as gone.
  Consistency: Compute Engine documents no read-after-write guarantee for `instances.list`/`aggregatedList` (its API
  best practices cover paging and list filters, not freshness; Cloud Storage is the Google service that documents
  strongly consistent listing), while `instances.get` finds a VM whose insert was accepted. So a VM launched by
  this object less than `consistency_grace` (60 s) ago that the list does not show is read alone with `get` (one
  request for each such VM, none when the list is up to date): its answer is the answer (a 404 then reads the
  insert operation: still running, refused, or the VM is gone, e.g. a spot VM reclaimed at once with termination
  action DELETE), and a failed read gives its launch-time view (as the AWS adapter answers for DescribeInstances'
  lag). After the grace, or once `terminate` is called for it, absent from the list means gone unless its insert
  operation says otherwise.

Identity and disks: `service_account` (an email) is attached with the cloud-platform scope (what the VM may do
is then the account's IAM roles); none attaches no account. The boot disk is `boot_disk_gb` of `boot_disk_type`
(pd-balanced), auto-deleted with the VM, from `images[region]` or `image`. `extra_labels` are added to every VM
(the broker's own labels win on a clash).

Spot: `scheduling.provisioningModel = "SPOT"`, `instanceTerminationAction = termination_action` (default "STOP"),
`automaticRestart = False`, `onHostMaintenance = "TERMINATE"` (GPUs cannot live-migrate; on-demand VMs get the same
two settings so a host event surfaces to the broker instead of silently re-running the job from scratch). STOP is
the default because a stopped VM keeps the evidence of its preemption: `get` can tell PREEMPTED from TERMINATED at
any later time, across broker restarts. The price is that a preempted VM keeps its boot disk (billed) until
`terminate` deletes it. With "DELETE" the VM vanishes ~30 s after the reclaim and `get` raises `NotFound`; the
preemption is then only seen through `poll_interruptions` (while the zone's operation history holds it).

GPUs: pool names from pricing/feeds/gcp.py are either a machine type whose GPUs come with it (a2-*, a3-*, g2-*:
no `guestAccelerators`) or "n1-standard-8+2xnvidia-tesla-t4" (N1 + attached cards: `guestAccelerators` with
`zones/{zone}/acceleratorTypes/nvidia-tesla-t4`, count 2). `split_instance_type` reads both.

Labels and tags: GCP label keys and values must match [a-z0-9_-]{0,63} (keys start with a letter). `label_key` maps
":" to "-" ("overspill:broker" -> "overspill-broker") and anything else outside the set to "_"; `label_value`
lower-cases and maps the rest to "_"; both truncate to 63. That is lossy, so labels serve filtering and billing
only: the exact tags travel as JSON in the metadata item "overspill-tags", with the launch token
("overspill-launch-token") and the offering key ("overspill-offering"), and `get`/`list_instances` read them back
from there. A VM without that metadata (not ours) gets its labels mapped back (the three broker keys exactly,
others as they are).

States: PROVISIONING/STAGING -> PENDING; RUNNING/REPAIRING -> RUNNING; STOPPING/TERMINATED/SUSPENDING/SUSPENDED ->
PREEMPTED when the VM is spot and its zone holds a "compute.instances.preempted" operation targeting it, inserted
after the VM's last start (queried with filter operationType + targetLink), otherwise TERMINATED (stopped by the
guest, e.g. the start-up script's final `shutdown`, or by someone else).

Errors: reasons first (from `errors[].reason` of a synchronous error, `error.errors[].code` of a failed operation,
and ErrorInfo details), then the HTTP status: ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS] / resourcePoolExhausted
-> InsufficientCapacity; QUOTA_EXCEEDED / quotaExceeded -> QuotaExceeded; rateLimitExceeded / 429 -> Throttled;
an organisation policy (a reason naming a constraint or the org policy service, e.g. conditionNotMet /
CONDITION_NOT_MET with "Constraint constraints/compute.vmExternalIpAccess violated for project ...", whatever
the status: Google sends 412, 400 or 403) -> PolicyDenied; 401 / 403 -> AuthError; 404 -> NotFound; 400 ->
InvalidRequest; 5xx and transport failures -> Throttled (transient).
A 401 usually surfaces as a google-auth error instead (the session refreshes the credential and retries, and the
refresh fails): a `GoogleAuthError` -> AuthError, except a token endpoint that could not be reached (google-auth's
`TransportError`, or a refresh it marks retryable) -> Throttled.

Retries: every Compute Engine call runs under `retry` (providers.retry.RetryPolicy; default 3 attempts, full-jitter
backoff) and is retried only when `transient` says so: 429 / rateLimitExceeded, a 5xx that is not a capacity or
quota answer (Google reports a stockout as HTTP 503 ZONE_RESOURCE_POOL_EXHAUSTED: that is an answer, not a
hiccup), timeouts and dropped connections. The client library's own retries are off on every call (`retry=None`:
the generated `get`, `aggregated_list` and `zoneOperations.get/list` would otherwise retry a 503 for up to 600 s)
and each call carries `timeout` seconds. Nothing waits on an operation (no `zoneOperations.wait`). A retried insert
is safe: it resends the same `request_id` (Google answers with the first operation) for the same instance name (a
second VM of that name cannot exist).

Interruptions: `poll_interruptions` lists the "compute.instances.preempted" operations of every zone holding (or
launched by this process into) one of our VMs, and returns each one not returned before by this object; at-least-once
across restarts. `preempted_since(zone, since)` is the same query for one zone without the bookkeeping.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final, TypeVar

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as gauth_exceptions
from google.cloud import compute_v1

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
from providers.model import BROKER_TAG, JOB_TAG, PLACEMENT_TAG, CapacityType, offering_key
from providers.retry import RetryPolicy, retry_after_seconds

T = TypeVar("T")

BROKER_LABEL: Final = "overspill-broker"
TOKEN_LABEL: Final = "overspill-token"
META_TAGS: Final = "overspill-tags"
META_TOKEN: Final = "overspill-launch-token"
META_OFFERING: Final = "overspill-offering"
META_STARTUP: Final = "startup-script"
PREEMPTED_OP: Final = "compute.instances.preempted"
INSERT_OP: Final = "insert"
TERMINATION_ACTIONS: Final = ("STOP", "DELETE")
CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
API_BASE: Final = "https://www.googleapis.com/compute/v1"  # resource links in answers use it whatever the endpoint
DELETE_MEMORY: Final = timedelta(minutes=15)  # how long a delete this object issued marks the VM as going away

_NAMESPACE: Final = uuid.UUID("6f0d4c1e-2b8a-5e9f-9c3d-7a1b2c3d4e5f")
_LABEL_MAX: Final = 63
_NOT_LABEL: Final = re.compile(r"[^a-z0-9_-]")
_NOT_NAME: Final = re.compile(r"[^a-z0-9-]")

_CAPACITY: Final = frozenset(
    {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "resourcePoolExhausted"}
)
_QUOTA: Final = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
_THROTTLE: Final = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
_EXISTS: Final = frozenset({"alreadyExists", "RESOURCE_ALREADY_EXISTS"})
_POLICY_WORDS: Final = ("constraint", "orgpolicy", "org_policy")
_CONSTRAINT_VIOLATED: Final = re.compile(r"constraints/[\w.]+ violated", re.IGNORECASE)
_PENDING: Final = frozenset({"PROVISIONING", "STAGING"})
_RUNNING: Final = frozenset({"RUNNING", "REPAIRING"})
_STOPPED: Final = frozenset({"STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED"})


def instance_name(launch_token: str) -> str:
    """The VM name for a launch token: deterministic, unique per token, RFC 1035 (at most 33 characters)."""
    slug = _NOT_NAME.sub("-", launch_token.lower())[:20].strip("-")
    digest = hashlib.sha256(launch_token.encode()).hexdigest()[:8]
    return f"ovs-{slug}-{digest}" if slug else f"ovs-{digest}"


def request_id(launch_token: str, action: str = "insert") -> str:
    """The `request_id` Compute Engine deduplicates retried mutations on (a UUID derived from the token)."""
    return str(uuid.uuid5(_NAMESPACE, f"{action}:{launch_token}"))


def label_key(key: str) -> str:
    """A tag name as a GCP label key: "overspill:broker" -> "overspill-broker"."""
    out = _NOT_LABEL.sub("_", key.lower().replace(":", "-"))
    if not out or not out[0].isalpha() or not out[0].isascii():
        out = f"k-{out}"
    return out[:_LABEL_MAX]


def label_value(value: str) -> str:
    """A tag value as a GCP label value (lower-cased, [a-z0-9_-], at most 63 characters)."""
    return _NOT_LABEL.sub("_", value.lower())[:_LABEL_MAX]


def labels_for(tags: dict[str, str], launch_token: str) -> dict[str, str]:
    labels = {label_key(k): label_value(v) for k, v in tags.items()}
    labels[TOKEN_LABEL] = label_value(launch_token)
    return labels


def tags_from_labels(labels: dict[str, str]) -> dict[str, str]:
    """Best-effort inverse of `labels_for` for VMs without the exact tags in metadata."""
    known = {label_key(k): k for k in (BROKER_TAG, JOB_TAG, PLACEMENT_TAG)}
    return {known.get(k, k): v for k, v in labels.items() if k != TOKEN_LABEL}


def split_instance_type(instance_type: str) -> tuple[str, str | None, int]:
    """`(machine type, attached accelerator type or None, count)` of a GCP pool name (the price feed's naming)."""
    machine, plus, attached = instance_type.partition("+")
    if not plus:
        return machine, None, 0
    count, _, accelerator_type = attached.partition("x")
    return machine, accelerator_type, int(count)


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 timestamp from the Compute API (e.g. "2013-12-13T10:45:23.351-08:00") as aware UTC."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _error(provider: str, reasons: Iterable[str], status: int | None, message: str) -> ProviderError:
    """The typed error for a Compute Engine failure: reasons decide first, then the HTTP status."""
    found = {r for r in reasons if r}
    detail = ", ".join(sorted(found))
    if found & _CAPACITY or any(r.startswith("ZONE_RESOURCE_POOL_EXHAUSTED") for r in found):
        return InsufficientCapacity(message, provider=provider, detail=detail)
    if found & _QUOTA:
        return QuotaExceeded(message, provider=provider, detail=detail)
    if found & _THROTTLE or status == 429:
        return Throttled(message, provider=provider, detail=detail)
    if _policy_denied(found, message):
        return PolicyDenied(message, provider=provider, detail=detail)
    if status in (401, 403):
        return AuthError(message, provider=provider, detail=detail)
    if status == 404:
        return NotFound(message, provider=provider, detail=detail)
    if status is not None and status >= 500:
        return Throttled(message, provider=provider, detail=detail or f"HTTP {status}")
    if status == 400 or status is None:
        return InvalidRequest(message, provider=provider, detail=detail)
    return ProviderError(message, provider=provider, detail=detail or f"HTTP {status}")


def _policy_denied(reasons: set[str], message: str) -> bool:
    """An organisation policy refused the request: a reason naming a constraint or the org policy service, or
    Google's "Constraint constraints/... violated" message (sent as 412 conditionNotMet, 400 or 403)."""
    lowered = {r.lower() for r in reasons}
    if any(word in r for r in lowered for word in _POLICY_WORDS):
        return True
    return bool(_CONSTRAINT_VIOLATED.search(message))


def _reasons(exc: gexc.GoogleAPICallError) -> set[str]:
    out = {str(e.get("reason", "")) for e in exc.errors if isinstance(e, dict)}
    if exc.reason:
        out.add(exc.reason)
    return out


def transient(exc: BaseException) -> bool:
    """Worth retrying the same call after a pause: throttling, a 5xx that is not a capacity or quota answer, a
    timeout or a dropped connection, a token endpoint out of reach. Anything else is an answer to act on."""
    if isinstance(exc, requests.RequestException | gauth_exceptions.TransportError):
        return True
    if isinstance(exc, gauth_exceptions.GoogleAuthError):
        return bool(getattr(exc, "retryable", False))
    if isinstance(exc, gexc.GoogleAPICallError):
        status = int(exc.code) if exc.code is not None else None
        return isinstance(_error("", _reasons(exc), status, ""), Throttled)
    return False


def _retry_after(exc: BaseException) -> float | None:
    """The `Retry-After` hint of an HTTP error answer, if it carried one."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return retry_after_seconds(headers.get("Retry-After")) if headers is not None else None


def _op_reasons(op: compute_v1.Operation) -> set[str]:
    out: set[str] = set()
    for err in op.error.errors:
        out.add(err.code)
        out.update(d.error_info.reason for d in err.error_details if d.error_info.reason)
    return out


def _op_message(op: compute_v1.Operation) -> str:
    messages = [e.message for e in op.error.errors if e.message]
    return "; ".join(messages) or op.http_error_message or "operation failed"


def _is_done(op: compute_v1.Operation) -> bool:
    return op.status == compute_v1.Operation.Status.DONE


class GcpProvider:
    """`ComputeProvider` + `InterruptionSource` for Compute Engine. See the module docstring."""

    boots_agent: ClassVar[bool] = True  # its instances run the instance agent (broker.agent_side.attempt_spec)
    notice_source: ClassVar[str] = "gcp"  # the interruption notice the agent watches there

    def __init__(
        self,
        instances: compute_v1.InstancesClient,
        zone_operations: compute_v1.ZoneOperationsClient,
        *,
        project: str,
        broker_id: str,
        image: str,
        images: Mapping[str, str] | None = None,
        network: str = "global/networks/default",
        name: str = "gcp",
        termination_action: str = "STOP",
        boot_disk_gb: int = 200,
        boot_disk_type: str = "pd-balanced",
        service_account: str = "",
        extra_labels: Mapping[str, str] | None = None,
        external_ip: bool = True,
        timeout: float | None = 60.0,
        retry: RetryPolicy | None = None,
        consistency_grace: timedelta = timedelta(seconds=60),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if termination_action not in TERMINATION_ACTIONS:
            raise ValueError(f"termination_action must be one of {TERMINATION_ACTIONS}, not {termination_action!r}")
        self.name = name
        self.project = project
        self.broker_id = broker_id
        self.image = image
        self.images = dict(images or {})
        self.network = network
        self.termination_action = termination_action
        self.boot_disk_gb = boot_disk_gb
        self.boot_disk_type = boot_disk_type
        self.service_account = service_account
        self.extra_labels = dict(extra_labels or {})
        self.external_ip = external_ip
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._instances = instances
        self._operations = zone_operations
        self._clock = clock
        self._zones: set[str] = set()  # zones this object launched into (poll_interruptions looks there too)
        self._delivered: set[str] = set()  # preemption operation ids already returned by poll_interruptions
        self._grace = consistency_grace
        self._recent: dict[str, tuple[datetime, Instance]] = {}  # id -> (launched at, launch-time view)
        self._inserts: dict[str, tuple[str, str]] = {}  # id -> (zone, insert operation) of launches not seen yet
        self._deleting: dict[str, datetime] = {}  # id -> when this object issued its delete

    # ----------------------------------------------------------------------------------------------- contract

    def launch(self, request: LaunchRequest) -> Instance:
        zone = request.offering.zone
        name = instance_name(request.launch_token)
        instance_id = f"{zone}/{name}"
        self._zones.add(zone)
        insert = compute_v1.InsertInstanceRequest(
            project=self.project,
            zone=zone,
            instance_resource=self.instance_resource(request),
            request_id=request_id(request.launch_token),
        )
        with self._translated(f"insert {instance_id}"):
            try:
                op = self._retried(lambda: self._instances.insert_unary(request=insert, **self._per_call()))
            except gexc.GoogleAPICallError as exc:
                reasons = _reasons(exc)
                if not reasons & _EXISTS and not (exc.code == 409 and not reasons):
                    raise
                return self._adopt(zone, name, request.launch_token)  # the name is taken: by this token?
        if _is_done(op) and op.error.errors:  # refused already (a replayed requestId of a failed insert, too)
            if _op_reasons(op) & _EXISTS:
                return self._adopt(zone, name, request.launch_token)
            raise self._insert_error(instance_id, op)
        now = self._clock()
        view = Instance(
            id=instance_id,
            provider=self.name,
            offering_key=request.offering.key,
            launch_token=request.launch_token,
            state=InstanceState.PENDING,
            tags=request.tags.as_dict(),
            launched_at=parse_time(op.insert_time) or now,
            detail=f"insert accepted ({op.name})",
        )
        self._recent[instance_id] = (now, view)
        self._inserts[instance_id] = (zone, op.name)
        return view

    def terminate(self, instance_id: str) -> None:
        self._recent.pop(instance_id, None)
        self._inserts.pop(instance_id, None)
        parsed = _parse_id(instance_id)
        if parsed is None:
            return
        zone, name = parsed
        delete = compute_v1.DeleteInstanceRequest(
            project=self.project, zone=zone, instance=name, request_id=request_id(instance_id, "delete")
        )
        with self._translated(f"delete {instance_id}"):
            try:
                op = self._retried(lambda: self._instances.delete_unary(request=delete, **self._per_call()))
            except gexc.NotFound:
                return
        if _is_done(op) and op.error.errors and op.http_error_status_code != 404:
            raise _error(self.name, _op_reasons(op), op.http_error_status_code or None, _op_message(op))
        now = self._clock()
        self._deleting = {k: at for k, at in self._deleting.items() if now - at < DELETE_MEMORY}
        self._deleting[instance_id] = now

    def get(self, instance_id: str) -> Instance:
        parsed = _parse_id(instance_id)
        if parsed is None:
            raise NotFound(f"{instance_id!r} is not a GCP instance id (zone/name)", provider=self.name)
        zone, name = parsed
        try:
            vm = self._call(
                f"get {instance_id}",
                lambda: self._instances.get(project=self.project, zone=zone, instance=name, **self._per_call()),
            )
        except NotFound:
            launching = self._launch_outcome(instance_id)
            if launching is None:
                raise
            return launching
        return self._view(zone, vm, lambda: self._preemptions(zone, vm.self_link))

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, Instance | ProviderError]:
        """The view `get` gives of each VM asked for that exists and is this broker's, keyed by the id asked for,
        from one paged aggregated list (see the module docstring); ids absent are gone. A VM launched by this
        object within `consistency_grace` that the list does not show is read alone (`get`); any other id the list
        does not show has its insert operation read (a launch running or refused), and answers that read's
        `ProviderError` when it fails. Raises a `ProviderError` when the list (or a zone's preemption query) fails
        after the retries."""
        wanted: dict[tuple[str, str], list[str]] = {}
        for iid in dict.fromkeys(instance_ids):
            parsed = _parse_id(iid)
            if parsed is not None:
                wanted.setdefault(parsed, []).append(iid)
        out: dict[str, Instance] = {}
        if wanted:
            by_zone: dict[str, list[compute_v1.Operation]] = {}
            unreachable: set[str] = set()
            listed = self._listed(unreachable)
            blind = sorted(unreachable & {zone for zone, _ in wanted})
            if blind:  # their VMs are missing from the answer, not gone
                raise Throttled(
                    f"aggregated list of instances could not reach {', '.join(blind)}",
                    provider=self.name,
                    detail="UNREACHABLE",
                )
            for zone, vm in listed:
                asked = wanted.get((zone, vm.name))
                if not asked:
                    continue
                view = self._view(zone, vm, functools.partial(self._zone_preemptions, by_zone, zone, vm.self_link))
                if view.tags.get(BROKER_TAG) == self.broker_id:
                    out.update(dict.fromkeys(asked, view))
        now = self._clock()
        self._recent = {k: v for k, v in self._recent.items() if now - v[0] < self._grace}
        failed: dict[str, ProviderError] = {}
        for iid in dict.fromkeys(instance_ids):
            if iid in out or _parse_id(iid) is None:
                continue
            recent = self._recent.get(iid)
            if recent is None:  # not listed: gone, unless its insert is still running or was refused
                try:
                    launching = self._launch_outcome(iid)
                except ProviderError as exc:
                    failed[iid] = exc  # unknown this tick, not gone
                    continue
                if launching is not None:
                    out[iid] = launching
                continue
            try:  # launched moments ago and not listed (yet?): `get` finds a VM whose insert was accepted
                out[iid] = self.get(iid)
            except NotFound:
                continue
            except ProviderError:
                out[iid] = recent[1]
        return {**out, **failed}

    def list_instances(self) -> list[Instance]:
        return [view for _, _, view in self._ours()]

    # ----------------------------------------------------------------------------------------- interruptions

    def poll_interruptions(self) -> list[InterruptionNotice]:
        """Preemption operations on our VMs not returned before by this object (see the module docstring)."""
        by_zone: dict[str, list[compute_v1.Operation]] = {}
        ours = self._ours(by_zone)
        zones = self._zones | {zone for zone, _, _ in ours}
        links = {vm.self_link: f"{zone}/{vm.name}" for zone, vm, _ in ours}
        notices: list[InterruptionNotice] = []
        seen: set[str] = set()
        fresh: set[str] = set()
        for zone in sorted(zones):
            if zone not in by_zone:
                by_zone[zone] = self._preemptions(zone, None)
            for op in by_zone[zone]:
                key = _op_key(op)
                seen.add(key)
                name = _last_segment(op.target_link)
                instance_id = links.get(op.target_link)
                if instance_id is None and name.startswith("ovs-"):
                    instance_id = f"{zone}/{name}"  # one of ours already deleted (termination_action DELETE)
                if instance_id is None or key in self._delivered or key in fresh:
                    continue
                fresh.add(key)
                notices.append(self._notice(instance_id, op))
        # Acknowledge only once every zone answered; forget operations the zones no longer retain.
        self._delivered = (self._delivered & seen) | fresh
        return notices

    def preempted_since(self, zone: str, since: datetime | None = None) -> list[InterruptionNotice]:
        """Every preemption in `zone` whose operation was inserted at or after `since` (all retained ones if None)."""
        out = []
        for op in self._preemptions(zone, None):
            at = parse_time(op.insert_time)
            if since is None or (at is not None and at >= since):
                out.append(self._notice(f"{zone}/{_last_segment(op.target_link)}", op))
        return out

    # --------------------------------------------------------------------------------------------- internals

    def instance_resource(self, request: LaunchRequest) -> compute_v1.Instance:
        """The Compute Engine Instance body `launch` inserts for a request."""
        offering = request.offering
        zone = offering.zone
        machine, accelerator, count = split_instance_type(offering.instance_type)
        spot = offering.capacity_type is CapacityType.SPOT
        tags = request.tags.as_dict()
        image = self.images.get(offering.region) or self.image
        if not image:
            raise InvalidRequest(f"no boot image configured for {offering.region}", provider=self.name)
        scheduling = compute_v1.Scheduling(automatic_restart=False, on_host_maintenance="TERMINATE")
        if spot:
            scheduling.provisioning_model = "SPOT"
            scheduling.instance_termination_action = self.termination_action
        else:
            scheduling.provisioning_model = "STANDARD"
        nic = compute_v1.NetworkInterface(network=self.network)
        if self.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        vm = compute_v1.Instance(
            name=instance_name(request.launch_token),
            machine_type=f"zones/{zone}/machineTypes/{machine}",
            labels={**self.extra_labels, **labels_for(tags, request.launch_token)},
            scheduling=scheduling,
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=image,
                        disk_size_gb=self.boot_disk_gb,
                        disk_type=f"zones/{zone}/diskTypes/{self.boot_disk_type}",
                    ),
                )
            ],
            network_interfaces=[nic],
            metadata=compute_v1.Metadata(
                items=[
                    *([compute_v1.Items(key=META_STARTUP, value=request.user_data)] if request.user_data else []),
                    compute_v1.Items(key=META_TOKEN, value=request.launch_token),
                    compute_v1.Items(key=META_TAGS, value=json.dumps(tags, sort_keys=True)),
                    compute_v1.Items(key=META_OFFERING, value=offering.key),
                ]
            ),
        )
        if self.service_account:
            vm.service_accounts = [compute_v1.ServiceAccount(email=self.service_account, scopes=[CLOUD_PLATFORM_SCOPE])]
        if accelerator:
            vm.guest_accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{accelerator}", accelerator_count=count
                )
            ]
        return vm

    @contextlib.contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        """Turn SDK failures into the typed errors of providers.base."""
        try:
            yield
        except gexc.GoogleAPICallError as exc:
            status = int(exc.code) if exc.code is not None else None
            raise _error(self.name, _reasons(exc), status, f"{what}: {exc.message}") from exc
        except gauth_exceptions.GoogleAuthError as exc:  # e.g. a 401 whose credential refresh then fails
            if transient(exc):  # the token endpoint was out of reach: not a verdict on the credentials
                raise Throttled(f"{what}: {exc}", provider=self.name, detail=type(exc).__name__) from exc
            raise AuthError(f"{what}: {exc}", provider=self.name, detail=type(exc).__name__) from exc
        except requests.RequestException as exc:
            raise Throttled(f"{what}: {exc}", provider=self.name, detail=type(exc).__name__) from exc

    def _per_call(self) -> dict[str, Any]:
        """Keyword arguments of every client call: the library's own retries off, this adapter's timeout."""
        return {"retry": None, "timeout": self.timeout}

    def _retried(self, fn: Callable[[], T]) -> T:
        """`fn()` under the retry policy (transient failures only); raw SDK errors, for callers that inspect them."""
        return self.retry.call(fn, transient, _retry_after)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """`fn()` under the retry policy, its failure typed (see `_translated`)."""
        with self._translated(what):
            return self._retried(fn)

    def _insert_error(self, instance_id: str, op: compute_v1.Operation) -> ProviderError:
        """The typed error of an insert operation that ended with an error."""
        status = op.http_error_status_code or None
        return _error(self.name, _op_reasons(op), status, f"insert {instance_id}: {_op_message(op)}")

    def _insert_operation(self, instance_id: str) -> compute_v1.Operation | None:
        """The insert operation of a VM: the one this object started (`zoneOperations.get`), else the zone's
        insert operation targeting it (one filtered `zoneOperations.list`), else None (none retained)."""
        parsed = _parse_id(instance_id)
        if parsed is None:
            return None
        zone, name = parsed
        known = self._inserts.get(instance_id)
        if known is not None:
            return self._call(
                f"operation {known[1]}",
                lambda: self._operations.get(project=self.project, zone=zone, operation=known[1], **self._per_call()),
            )
        link = f"{API_BASE}/projects/{self.project}/zones/{zone}/instances/{name}"
        query = f'(operationType = "{INSERT_OP}") AND (targetLink = "{link}")'
        listing = compute_v1.ListZoneOperationsRequest(project=self.project, zone=zone, filter=query)
        ops = self._call(
            f"insert operations of {instance_id}",
            lambda: list(self._operations.list(request=listing, **self._per_call())),
        )
        ours = [op for op in ops if op.operation_type == INSERT_OP and _last_segment(op.target_link) == name]
        return max(ours, key=lambda op: op.insert_time, default=None)

    def _launch_outcome(self, instance_id: str) -> Instance | None:
        """The view of a VM that is not there, from its insert operation: PENDING while it runs, FAILED with
        `launch_error` when it was refused; None when the VM is simply gone (or was never made)."""
        op = self._insert_operation(instance_id)
        if op is None:
            return None
        recent = self._recent.get(instance_id)
        base = (
            recent[1]
            if recent is not None
            else Instance(
                id=instance_id,
                provider=self.name,
                offering_key="",
                launch_token="",
                state=InstanceState.PENDING,
                tags={},
                launched_at=parse_time(op.insert_time) or self._clock(),
            )
        )
        if not _is_done(op):
            return dataclasses.replace(base, state=InstanceState.PENDING, detail=f"insert running ({op.name})")
        self._inserts.pop(instance_id, None)
        if not op.error.errors or _op_reasons(op) & _EXISTS:
            return None  # the insert made the VM, and it is gone now
        error = self._insert_error(instance_id, op)
        return dataclasses.replace(
            base,
            state=InstanceState.FAILED,
            ended_at=parse_time(op.end_time) or self._clock(),
            detail=str(error),
            launch_error=error,
        )

    def _adopt(self, zone: str, name: str, launch_token: str) -> Instance:
        """The existing VM for a token; a VM of that name made for another token is a collision."""
        view = self.get(f"{zone}/{name}")
        if view.launch_token != launch_token:
            raise InvalidRequest(
                f"instance {zone}/{name} exists for another launch token", provider=self.name, detail=view.launch_token
            )
        return view

    def _ours(
        self, by_zone: dict[str, list[compute_v1.Operation]] | None = None
    ) -> list[tuple[str, compute_v1.Instance, Instance]]:
        """(zone, VM, view) of this broker's VMs; `by_zone` caches each zone's preemption operations."""
        out: list[tuple[str, compute_v1.Instance, Instance]] = []
        by_zone = {} if by_zone is None else by_zone
        for zone, vm in self._listed():
            view = self._view(zone, vm, functools.partial(self._zone_preemptions, by_zone, zone, vm.self_link))
            if view.tags.get(BROKER_TAG) == self.broker_id:
                out.append((zone, vm, view))
        return out

    def _listed(self, unreachable: set[str] | None = None) -> list[tuple[str, compute_v1.Instance]]:
        """(zone, VM) of every VM labelled as this broker's, from one aggregated list (every page, one request each,
        under the retry policy). A 404 on the list is the project's, not the VMs': a `ProviderError`. Zones the
        list says it could not reach (a scope's UNREACHABLE warning, or `unreachables`) are added to `unreachable`.
        """
        listing = compute_v1.AggregatedListInstancesRequest(
            project=self.project, filter=f'labels.{BROKER_LABEL} = "{label_value(self.broker_id)}"'
        )
        try:
            pages = self._call(
                "aggregated list of instances",
                lambda: list(self._instances.aggregated_list(request=listing, **self._per_call()).pages),
            )
        except NotFound as exc:
            raise ProviderError(str(exc), provider=self.name, detail=exc.detail or "HTTP 404") from exc
        out: list[tuple[str, compute_v1.Instance]] = []
        for page in pages:
            if unreachable is not None:
                unreachable.update(u.rsplit("/", 1)[-1] for u in page.unreachables)
            for scope, scoped in page.items.items():
                if not scope.startswith("zones/"):
                    continue
                zone = scope.removeprefix("zones/")
                if unreachable is not None and scoped.warning.code == "UNREACHABLE":
                    unreachable.add(zone)
                out.extend((zone, vm) for vm in scoped.instances)
        return out

    def _zone_preemptions(
        self, by_zone: dict[str, list[compute_v1.Operation]], zone: str, link: str
    ) -> list[compute_v1.Operation]:
        """The preemption operations targeting `link`, from one query of `zone` cached in `by_zone` (made only when a
        stopped spot VM needs it)."""
        if zone not in by_zone:
            by_zone[zone] = self._preemptions(zone, None)
        return [op for op in by_zone[zone] if op.target_link == link]

    def _preemptions(self, zone: str, target_link: str | None) -> list[compute_v1.Operation]:
        """The zone's retained preemption operations, for one VM (`target_link`) or all."""
        clauses = [f'(operationType = "{PREEMPTED_OP}")']
        if target_link:
            clauses.append(f'(targetLink = "{target_link}")')
        listing = compute_v1.ListZoneOperationsRequest(project=self.project, zone=zone, filter=" AND ".join(clauses))
        ops = self._call(
            f"list operations in {zone}", lambda: list(self._operations.list(request=listing, **self._per_call()))
        )
        # The filter is the server's job; check again so a server that ignores it cannot mislead us.
        return [
            op
            for op in ops
            if op.operation_type == PREEMPTED_OP and (target_link is None or op.target_link == target_link)
        ]

    def _view(
        self, zone: str, vm: compute_v1.Instance, preemptions: Callable[[], list[compute_v1.Operation]]
    ) -> Instance:
        meta = {item.key: item.value for item in vm.metadata.items}
        labels = dict(vm.labels)
        try:
            tags = json.loads(meta[META_TAGS])
        except (KeyError, ValueError):
            tags = tags_from_labels(labels)
        spot = vm.scheduling.provisioning_model == "SPOT" or vm.scheduling.preemptible
        status = vm.status
        started = parse_time(vm.last_start_timestamp)
        stopped = parse_time(vm.last_stop_timestamp)
        detail = f"GCE status {status}" + (f": {vm.status_message}" if vm.status_message else "")
        if status in _PENDING:
            state = InstanceState.PENDING
        elif status in _RUNNING:
            state = InstanceState.RUNNING
        elif status in _STOPPED:
            state = InstanceState.TERMINATED
            if spot and self._preempted_after(preemptions(), started):
                state = InstanceState.PREEMPTED
                detail = f"preempted (GCE status {status})"
        else:
            state = InstanceState.PENDING
        instance_id = f"{zone}/{vm.name}"
        if instance_id in self._inserts and status not in _PENDING:
            del self._inserts[instance_id]  # the insert made the VM: nothing more to follow
        deleting = instance_id in self._deleting
        if deleting:
            detail += " (being deleted)"
        return Instance(
            id=instance_id,
            provider=self.name,
            offering_key=meta.get(META_OFFERING) or self._offering_key(zone, vm, spot),
            launch_token=meta.get(META_TOKEN, ""),
            state=state,
            tags={str(k): str(v) for k, v in tags.items()},
            launched_at=parse_time(vm.creation_timestamp) or self._clock(),
            started_at=started,
            ended_at=stopped if state.terminal else None,
            detail=detail,
            lingering=state.terminal and not deleting,  # stopped, not deleted: its disk bills until deleted
        )

    @staticmethod
    def _preempted_after(ops: list[compute_v1.Operation], started: datetime | None) -> bool:
        for op in ops:
            at = parse_time(op.insert_time)
            if started is None or at is None or at >= started:
                return True
        return False

    def _offering_key(self, zone: str, vm: compute_v1.Instance, spot: bool) -> str:
        instance_type = _last_segment(vm.machine_type)
        if instance_type.startswith("n1-") and vm.guest_accelerators:
            card = vm.guest_accelerators[0]
            instance_type += f"+{card.accelerator_count}x{_last_segment(card.accelerator_type)}"
        capacity = CapacityType.SPOT if spot else CapacityType.ON_DEMAND
        return offering_key(self.name, region_of(zone), zone, instance_type, capacity)

    def _notice(self, instance_id: str, op: compute_v1.Operation) -> InterruptionNotice:
        at = parse_time(op.insert_time) or self._clock()
        return InterruptionNotice(
            instance_id=instance_id,
            provider=self.name,
            kind="interruption",
            at=at,
            action_at=parse_time(op.end_time) or at,
            raw={
                "operation_id": _op_key(op),
                "operation": op.name,
                "operationType": op.operation_type,
                "targetLink": op.target_link,
                "insertTime": op.insert_time,
                "statusMessage": op.status_message,
            },
        )


def _op_key(op: compute_v1.Operation) -> str:
    return str(op.id) if op.id else op.name


def _parse_id(instance_id: str) -> tuple[str, str] | None:
    zone, slash, name = instance_id.partition("/")
    if not slash or not zone or not name or "/" in name:
        return None
    return zone, name
