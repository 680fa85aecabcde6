"""Azure adapter: launches, watches and deletes the broker's GPU VMs through `azure-mgmt-compute` alone.

Role: the `ComputeProvider` (and `InterruptionSource`) for Azure. The caller injects a `ComputeManagementClient`
(tests point it at a local fake with `base_url`); this module never builds clients or reads credentials. One
provider object serves one resource group and one location.

Contract (see providers/base.py):
- `launch` is idempotent on the launch token: the VM name is derived from it (`vm_name`: "ovs-" + the token's first
  20 name-safe characters + "-" + 8 hex of its SHA-256) and the token is a tag. Launch first GETs that name: a VM
  carrying the same token is returned as it is; one carrying another token is a collision (`InvalidRequest`).
  Otherwise it PUTs the VM (`begin_create_or_update` without polling) and returns as soon as ARM accepted it: the
  VM's view is PENDING (provisioning Creating). It never waits for the long-running operation: a tick must not
  stall on a cloud operation. A VM of the token found Failed (its instance view says
  "ProvisioningState/failed/<code>") raises that code's error when the code is a capacity, quota or policy answer
  (the answer arrived, only late), after deleting the VM (best effort), and is otherwise PUT again (ARM's way to
  retry a create). A 409 on the PUT that is not a capacity or quota error (a create of the same name already in
  flight) is resolved by reading the VM back.
- Following the create: `get`/`get_many` read the VM's provisioning state. A create that failed in its operation
  (AllocationFailed, ZonalAllocationFailed, SkuNotAvailable, OverconstrainedAllocationRequest, QuotaExceeded,
  RequestDisallowedByPolicy...) leaves the VM in provisioning state Failed: its view is FAILED with `launch_error`
  = the typed error of that code, so the broker fails the placement over exactly as for a synchronous refusal and
  deletes the VM.
- Instance ids are VM names (the resource group is the provider's). `get` raises `NotFound` for an absent VM.
- `terminate` issues the delete without waiting; a 404 is success. The OS disk and the NIC go with the VM
  (`deleteOption: Delete`).
- Stopped is not gone: a VM stopped from inside (PowerState/stopped: not deallocated, so it keeps billing full
  compute), deallocated (its disk bills) or left Failed by its create is `lingering` until deleted; a VM in
  provisioning state Deleting is released. The orphan sweep thus deletes each such VM once.
- `list_instances` lists the resource group and keeps VMs whose "overspill:broker" tag is this broker, reading each
  one's instance view for its power state.
- `get_many(ids)` (the `BatchDescriber` the broker's sync step calls every tick) answers for any number of VMs with
  two paged lists instead of one GET each. ARM has no single list call that returns both a VM's model (tags,
  priority, zones, size, timeCreated, provisioningState) and its power state: `$expand=instanceView` on the VM
  lists "can only be specified if a valid $filter option is specified", and the only `$filter` there is
  `virtualMachineScaleSet/id`; `statusOnly=true` on the subscription list returns each VM's `instanceView.statuses`
  (the same "ProvisioningState/..." and "PowerState/..." codes, with times) but only `id`, `name`, `location` and a
  bare `properties` beside them (no tags). So: `virtualMachines.list(resource_group)` (the models; one request per
  page, following `nextLink`), keeping the VMs asked for whose "overspill:broker" tag is this broker, then, when any
  is left, `virtualMachines.list_all(status_only="true")` (the statuses; one request per page of the
  subscription's VMs), joined on the resource id. Each VM then gets exactly the view `get` gives (the same `_view`,
  so the same power-state, eviction and Preempt-event handling). A VM in the first list but missing from the second
  (deleted or created between the two reads) has its instance view read alone (`instance_view`; a 404 there means
  gone). An id absent from the answer is gone, as `get` raising `NotFound`, except that, as in `get`, an evicted
  and deleted VM with a relayed Preempt event answers its last view as PREEMPTED, and a VM launched by this object
  less than `consistency_grace` (60 s) ago that the list does not show is read alone with `get` (ARM documents no
  read-after-write guarantee for lists; `launch` itself reads the VM back by name), its launch-time view answering
  if that read fails too. A VM without this broker's tag is absent (`get` reads any VM by name). A failure of
  either list after the retries raises a `ProviderError` for the whole batch; a 404 on a list (a resource group
  that is not there) is a `ProviderError`, not `NotFound` for every id.

Networking without azure-mgmt-network: the NIC is VM-managed (`networkProfile.networkApiVersion` "2020-11-01" +
`networkInterfaceConfigurations` on `subnet_id`), so only the compute client is needed. The subnet must give the VM
outbound internet (a NAT gateway) for the start-up script to pull the job's image; no public IP is attached.

Identity and disks: `managed_identity_id` (a user-assigned identity's resource id) is attached as the VM's only
identity (what the VM may do is that identity's role assignments); none attaches no identity. The OS disk is
`os_disk_gb` (None: the image's size) of managed disk type `os_disk_type` (None: the default for the size), deleted
with the VM. `extra_tags` are added to every VM (the broker's tags win on a clash).

Spot: `priority "Spot"`, `evictionPolicy` = `eviction_policy` (default "Delete": an evicted VM leaves no disk and
holds no spot-core quota), `billingProfile.maxPrice` = the job's `max_hourly_usd` when it has one (rounded down to
Azure's 5 decimals: Azure itself then evicts the VM rather than bill above the user's cap) else -1 (pay up to the
on-demand price; evicted only for capacity, the broker's own cost ceiling does the rest).

Tags: Azure tag names may hold ":" but not `< > % & \\ ? /` and values are at most 256 characters, so the broker's
tags ("overspill:broker", "overspill:job", "overspill:placement") are stored exactly; other names have forbidden
characters replaced by "_" and values are truncated (documented loss). Two bookkeeping tags ride along and are
hidden from `Instance.tags`: "overspill:launch-token" and "overspill:offering" (the offering key).

States, from `provisioningState` and the instance view's "PowerState/..." code: starting or still creating ->
PENDING; running -> RUNNING; deallocating/deallocated on a Spot VM -> PREEMPTED (the broker never deallocates, it
deletes, so a deallocated spot VM was evicted; Azure exposes no eviction marker on the VM itself, the
"evictSpotVM" record lives in the Activity Log), on a regular VM -> TERMINATED; stopping/stopped -> TERMINATED (a
guest `shutdown` stops without deallocating, which is how the start-up script ends); provisioning Failed (and not
running) -> FAILED; Deleting -> TERMINATED. A relayed Preempt scheduled event for the VM turns any stopped,
deallocated or deleting state into PREEMPTED. With evictionPolicy Delete an evicted VM disappears: if a Preempt
event was relayed for it, `get` answers the last view seen with state PREEMPTED (in memory only: after a restart it
is `NotFound`).

Errors: by ARM error code (top level and details), then HTTP status: SkuNotAvailable / AllocationFailed /
ZonalAllocationFailed / OverconstrainedAllocationRequest / OverconstrainedZonalAllocationRequest ->
InsufficientCapacity; QuotaExceeded, or OperationNotAllowed whose message speaks of quota -> QuotaExceeded; 429 /
TooManyRequests -> Throttled; RequestDisallowedByPolicy (an Azure Policy assignment denied the request; HTTP 403)
and RequestDisallowedByAzure -> PolicyDenied (the pool is refused for that job, not the provider blocked);
401 / 403 / AuthorizationFailed / AuthenticationFailed and credential failures
(`ClientAuthenticationError`) -> AuthError; 404 -> NotFound;
InvalidParameter and other 400s -> InvalidRequest; 5xx and transport failures -> Throttled.

Retries: every ARM request the adapter makes (the GETs, the PUT, the DELETE, the lists) runs under `retry`
(providers.retry.RetryPolicy; default 3 attempts, full-jitter backoff) and is retried only when `transient` says
so: 429 (its `Retry-After` honoured up to the policy's cap, a longer one handed back to the broker), a 5xx that is
not a capacity or quota answer, timeouts and dropped connections. Build the client with azure-core's own retries
off (`retry_total=0`) and connection/read timeouts set, as `broker.config.providers` does, so the layers do not
multiply. A retried PUT is safe: the VM name comes from the launch token and a PUT of an existing VM is an update
of the same VM, never a second one. No long-running operation is polled.

Interruptions: the VM's agent relays its Scheduled Events document (or one event) to the broker, which calls
`relay_scheduled_event`; a Preempt event naming the VM becomes an `InterruptionNotice` (once per EventId) queued for
`poll_interruptions`, which hands the queue over and empties it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import ROUND_DOWN, Decimal
from email.utils import parsedate_to_datetime
from enum import Enum
from typing import Any, ClassVar, Final, TypeVar

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    IncompleteReadError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute import models as m

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
from providers.model import BROKER_TAG, LAUNCH_TOKEN_TAG, OFFERING_TAG, CapacityType, offering_key
from providers.retry import RetryPolicy, retry_after_seconds

T = TypeVar("T")

TOKEN_TAG: Final = LAUNCH_TOKEN_TAG
INTERNAL_TAGS: Final = frozenset({TOKEN_TAG, OFFERING_TAG})
NETWORK_API_VERSION: Final = "2020-11-01"
EVICTION_POLICIES: Final = ("Delete", "Deallocate")

_CAPACITY: Final = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
    }
)
_AUTH: Final = frozenset(
    {"AuthorizationFailed", "AuthenticationFailed", "InvalidAuthenticationToken", "LinkedAuthorizationFailed"}
)
_THROTTLE: Final = frozenset({"TooManyRequests", "SubscriptionRequestsThrottled"})
_POLICY: Final = frozenset({"RequestDisallowedByPolicy", "RequestDisallowedByAzure"})
_TAG_NAME_FORBIDDEN: Final = re.compile(r"[<>%&\\?/]")
_NOT_NAME: Final = re.compile(r"[^a-z0-9-]")
_TAG_MAX: Final = 256
_MAX_PRICE_STEP: Final = Decimal("0.00001")
_FAILED_PREFIX: Final = "provisioningstate/failed/"


def vm_name(launch_token: str) -> str:
    """The VM name (and computer name) for a launch token: deterministic, unique per token, at most 33 characters."""
    slug = _NOT_NAME.sub("-", launch_token.lower())[:20].strip("-")
    digest = hashlib.sha256(launch_token.encode()).hexdigest()[:8]
    return f"ovs-{slug}-{digest}" if slug else f"ovs-{digest}"


def tag_name(name: str) -> str:
    """A tag name Azure accepts: `< > % & \\ ? /` become "_", at most 512 characters."""
    return _TAG_NAME_FORBIDDEN.sub("_", name)[:512]


def azure_tags(
    tags: Mapping[str, str], launch_token: str, offering: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The VM's tags: `extra` (a site's mandatory tags), then the broker's, then the two bookkeeping tags."""
    out = {tag_name(k): v[:_TAG_MAX] for k, v in (extra or {}).items()}
    out.update({tag_name(k): v[:_TAG_MAX] for k, v in tags.items()})
    out[TOKEN_TAG] = launch_token[:_TAG_MAX]
    out[OFFERING_TAG] = offering[:_TAG_MAX]
    return out


def max_price(request: LaunchRequest) -> float:
    """`billingProfile.maxPrice`: the job's hourly cap rounded down to 5 decimals, or -1 (up to on-demand)."""
    cap = request.spec.max_hourly_usd
    if cap is None or cap <= 0:
        return -1.0
    return float(cap.quantize(_MAX_PRICE_STEP, rounding=ROUND_DOWN))


def _codes(exc: HttpResponseError) -> tuple[set[str], str]:
    codes: set[str] = set()
    message = ""
    err = exc.error
    if err is not None:
        if err.code:
            codes.add(str(err.code))
        message = str(err.message or "")
        for detail in err.details or []:
            if detail.code:
                codes.add(str(detail.code))
            message = message or str(detail.message or "")
    return codes, message or str(exc.message or exc)


def _error(provider: str, exc: HttpResponseError, what: str) -> ProviderError:
    """The typed error for an ARM failure: error codes decide first, then the HTTP status."""
    codes, message = _codes(exc)
    return classify(
        provider, codes, message, exc.status_code, what, credential_failed=isinstance(exc, ClientAuthenticationError)
    )


def classify(
    provider: str, codes: set[str], message: str, status: int | None, what: str, *, credential_failed: bool = False
) -> ProviderError:
    """The typed error for ARM error `codes` (top level and details), `message` and HTTP `status`."""
    text = f"{what}: {message}"
    detail = ", ".join(sorted(codes))
    if codes & _CAPACITY:
        return InsufficientCapacity(text, provider=provider, detail=detail)
    if "QuotaExceeded" in codes or ("OperationNotAllowed" in codes and "quota" in message.lower()):
        return QuotaExceeded(text, provider=provider, detail=detail)
    if codes & _THROTTLE or status == 429:
        return Throttled(text, provider=provider, detail=detail)
    if codes & _POLICY:
        return PolicyDenied(text, provider=provider, detail=detail)
    if codes & _AUTH or status in (401, 403) or credential_failed:
        return AuthError(text, provider=provider, detail=detail)
    if status == 404 or "ResourceNotFound" in codes:
        return NotFound(text, provider=provider, detail=detail)
    if status is not None and status >= 500:
        return Throttled(text, provider=provider, detail=detail or f"HTTP {status}")
    if status == 400 or codes & {"InvalidParameter", "BadRequest", "InvalidRequestContent"}:
        return InvalidRequest(text, provider=provider, detail=detail)
    return ProviderError(text, provider=provider, detail=detail or f"HTTP {status}")


def transient(exc: BaseException) -> bool:
    """Worth retrying the same request after a pause: throttling, a 5xx that is not a capacity or quota answer,
    a timeout or a dropped connection. A credential failure or any other ARM answer is not."""
    if isinstance(exc, ClientAuthenticationError):
        return False
    if isinstance(exc, IncompleteReadError | ServiceRequestError | ServiceResponseError):
        return True
    if isinstance(exc, HttpResponseError):
        return isinstance(_error("", exc, ""), Throttled)
    return False


def _retry_after(exc: BaseException) -> float | None:
    """The `Retry-After` of an ARM error answer (ARM sends one with every 429)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return retry_after_seconds(headers.get("Retry-After")) if headers is not None else None


def failure_of(vm: m.VirtualMachine) -> tuple[str, str] | None:
    """(code, message) of a VM whose instance view says "ProvisioningState/failed/<code>", else None."""
    iv = vm.instance_view
    for status in (iv.statuses or []) if iv is not None else []:
        code = _text(status.code)
        if code.lower().startswith(_FAILED_PREFIX):
            return code[len(_FAILED_PREFIX) :], str(status.message or status.display_status or "provisioning failed")
    return None


def _text(value: object) -> str:
    """A model field as its wire string: the SDK's str-enums print as "ClassName.MEMBER" under `str()`."""
    if value is None:
        return ""
    return str(value.value) if isinstance(value, Enum) else str(value)


def _event_time(text: object) -> datetime | None:
    """A Scheduled Events `NotBefore` ("Mon, 19 Sep 2016 18:29:47 GMT") as aware UTC."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return parsedate_to_datetime(text).astimezone(UTC)
    except (TypeError, ValueError):
        return None


class AzureProvider:
    """`ComputeProvider` + `InterruptionSource` for Azure VMs. See the module docstring."""

    boots_agent: ClassVar[bool] = True  # its instances run the instance agent (broker.agent_side.attempt_spec)
    notice_source: ClassVar[str] = "azure"  # the interruption notice the agent watches there

    def __init__(
        self,
        compute: ComputeManagementClient,
        *,
        resource_group: str,
        location: str,
        broker_id: str,
        subnet_id: str,
        image_reference: dict[str, Any],
        admin_username: str = "overspill",
        ssh_public_key: str,
        name: str = "azure",
        eviction_policy: str = "Delete",
        os_disk_gb: int | None = None,
        os_disk_type: str | None = None,
        managed_identity_id: str = "",
        extra_tags: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        consistency_grace: timedelta = timedelta(seconds=60),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction_policy must be one of {EVICTION_POLICIES}, not {eviction_policy!r}")
        self.name = name
        self.resource_group = resource_group
        self.location = location
        self.broker_id = broker_id
        self.subnet_id = subnet_id
        self.image_reference = dict(image_reference)
        self.admin_username = admin_username
        self.ssh_public_key = ssh_public_key
        self.eviction_policy = eviction_policy
        self.os_disk_gb = os_disk_gb
        self.os_disk_type = os_disk_type
        self.managed_identity_id = managed_identity_id
        self.extra_tags = dict(extra_tags or {})
        self.retry = retry or RetryPolicy()
        self._vms = compute.virtual_machines
        self._clock = clock
        self._lock = threading.Lock()
        self._queue: list[InterruptionNotice] = []
        self._event_ids: set[str] = set()
        self._preempt_notices: dict[str, InterruptionNotice] = {}  # VM name -> relayed Preempt notice
        self._last_seen: dict[str, Instance] = {}
        self._grace = consistency_grace
        self._recent: dict[str, tuple[datetime, Instance]] = {}  # VM name -> (launched at, launch-time view)

    # ----------------------------------------------------------------------------------------------- contract

    def launch(self, request: LaunchRequest) -> Instance:
        name = vm_name(request.launch_token)
        existing = self._read(name)
        if existing is not None:
            view = self._adopt(existing, request.launch_token)
            if view.state is not InstanceState.FAILED:
                return view
            failed = self._failure(existing, name)
            if isinstance(failed, InsufficientCapacity | QuotaExceeded | PolicyDenied):
                self._delete_quietly(name)  # the answer of an earlier attempt, learnt late
                raise failed
            # Any other provisioning failure: PUT again, which is how ARM retries a create.
        body = self.vm_body(request)
        try:
            poller = self._retried(
                lambda: self._vms.begin_create_or_update(self.resource_group, name, body, polling=False)
            )
        except HttpResponseError as exc:
            err = _error(self.name, exc, f"create {name}")
            if exc.status_code != 409 or isinstance(err, InsufficientCapacity | QuotaExceeded):
                raise err from exc
            vm = self._read(name)  # a create of this name is already in flight: adopt it
            if vm is None:
                raise Throttled(f"create {name}: conflict, retry later", provider=self.name, detail=err.detail) from exc
            return self._adopt(vm, request.launch_token)
        except AzureError as exc:
            raise Throttled(f"create {name}: {exc}", provider=self.name) from exc
        accepted = poller.result()  # no polling: the PUT's own answer, the VM as ARM accepted it (Creating)
        if isinstance(accepted, m.VirtualMachine) and accepted.name:
            view = self._adopt(accepted, request.launch_token)
        else:
            view = Instance(
                id=name,
                provider=self.name,
                offering_key=request.offering.key,
                launch_token=request.launch_token,
                state=InstanceState.PENDING,
                tags=request.tags.as_dict(),
                launched_at=self._clock(),
                detail="create accepted",
            )
        with self._lock:
            self._recent[view.id] = (self._clock(), view)
        return view

    def terminate(self, instance_id: str) -> None:
        with self._lock:
            self._preempt_notices.pop(instance_id, None)
            self._last_seen.pop(instance_id, None)
            self._recent.pop(instance_id, None)
        try:
            self._retried(lambda: self._vms.begin_delete(self.resource_group, instance_id, polling=False))
        except ResourceNotFoundError:
            return
        except HttpResponseError as exc:
            err = _error(self.name, exc, f"delete {instance_id}")
            if isinstance(err, NotFound):
                return
            raise err from exc
        except AzureError as exc:
            raise Throttled(f"delete {instance_id}: {exc}", provider=self.name) from exc

    def get(self, instance_id: str) -> Instance:
        vm = self._read(instance_id)
        if vm is not None:
            return self._view(vm, vm.instance_view)
        evicted = self._evicted(instance_id)
        if evicted is not None:
            return evicted
        raise NotFound(f"VM {instance_id} not found in {self.resource_group}", provider=self.name)

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, Instance]:
        """The view `get` gives of each VM asked for that exists and is this broker's, keyed by the id asked for,
        from the resource group's VM list joined with the subscription's status-only list (see the module
        docstring); ids absent are gone. Raises a `ProviderError` when a list fails after the retries."""
        wanted: dict[str, list[str]] = {}
        for iid in dict.fromkeys(instance_ids):
            if iid:
                wanted.setdefault(iid.lower(), []).append(iid)
        models: list[m.VirtualMachine] = []
        if wanted:
            models = [
                vm
                for vm in self._listing(f"list {self.resource_group}", lambda: self._vms.list(self.resource_group))
                if vm.name and vm.name.lower() in wanted and (vm.tags or {}).get(BROKER_TAG) == self.broker_id
            ]
        statuses: dict[str, m.VirtualMachineInstanceView | None] = {}
        if models:
            for vm in self._listing(
                "list statuses of the subscription's VMs", lambda: self._vms.list_all(status_only="true")
            ):
                statuses[_text(vm.id).lower()] = vm.instance_view
        out: dict[str, Instance] = {}
        for vm in models:
            name = str(vm.name)
            iv = statuses.get(_text(vm.id).lower())
            if iv is None:  # deleted or created between the two lists: ask this one VM
                try:
                    iv = self._instance_view(name)
                except ResourceNotFoundError:
                    continue
                except HttpResponseError as exc:
                    err = _error(self.name, exc, f"instance view of {name}")
                    if isinstance(err, NotFound):
                        continue
                    raise err from exc
                except AzureError as exc:
                    raise Throttled(f"instance view of {name}: {exc}", provider=self.name) from exc
            out.update(dict.fromkeys(wanted[name.lower()], self._view(vm, iv)))
        now = self._clock()
        with self._lock:
            self._recent = {k: v for k, v in self._recent.items() if now - v[0] < self._grace}
            recent = dict(self._recent)
        for iid in dict.fromkeys(instance_ids):
            if iid in out:
                continue
            if iid in recent:  # launched moments ago and not listed (yet?): ask for this one VM, as `get` does
                try:
                    out[iid] = self.get(iid)
                except NotFound:
                    pass
                except ProviderError:
                    out[iid] = recent[iid][1]
                continue
            evicted = self._evicted(iid)
            if evicted is not None:
                out[iid] = evicted
        return out

    def list_instances(self) -> list[Instance]:
        out: list[Instance] = []
        try:
            vms = self._retried(lambda: list(self._vms.list(self.resource_group)))
        except HttpResponseError as exc:
            raise _error(self.name, exc, f"list {self.resource_group}") from exc
        except AzureError as exc:
            raise Throttled(f"list {self.resource_group}: {exc}", provider=self.name) from exc
        for vm in vms:
            if (vm.tags or {}).get(BROKER_TAG) != self.broker_id or not vm.name:
                continue
            try:
                view = self._instance_view(vm.name)
            except ResourceNotFoundError:
                continue  # deleted between the list and now
            except HttpResponseError as exc:
                raise _error(self.name, exc, f"instance view of {vm.name}") from exc
            except AzureError as exc:
                raise Throttled(f"instance view of {vm.name}: {exc}", provider=self.name) from exc
            out.append(self._view(vm, view))
        listed = {i.id for i in out}
        with self._lock:  # keep the last views only of VMs still listed or with a relayed Preempt (tombstones)
            self._last_seen = {k: v for k, v in self._last_seen.items() if k in listed or k in self._preempt_notices}
        return out

    # ----------------------------------------------------------------------------------------- interruptions

    def relay_scheduled_event(self, instance_id: str, event: Mapping[str, Any]) -> InterruptionNotice | None:
        """Take a Scheduled Events document (or one of its events) relayed by VM `instance_id`.

        Returns the notice when it holds a Preempt event naming the VM (or naming no resource), else None. Each
        EventId is queued once, however often the VM relays it.
        """
        events = event.get("Events") if "Events" in event else [event]
        for ev in events if isinstance(events, list) else []:
            if not isinstance(ev, Mapping) or ev.get("EventType") != "Preempt":
                continue
            resources = [str(r).lower() for r in ev.get("Resources") or []]
            if resources and instance_id.lower() not in resources:
                continue
            now = self._clock()
            event_id = str(ev.get("EventId") or f"{instance_id}/{ev.get('NotBefore')}")
            notice = InterruptionNotice(
                instance_id=instance_id,
                provider=self.name,
                kind="interruption",
                at=now,
                action_at=_event_time(ev.get("NotBefore")) or now,
                raw=dict(ev),
            )
            with self._lock:
                self._preempt_notices.setdefault(instance_id, notice)
                if event_id not in self._event_ids:
                    self._event_ids.add(event_id)
                    self._queue.append(notice)
            return notice
        return None

    def poll_interruptions(self) -> list[InterruptionNotice]:
        with self._lock:
            out, self._queue = self._queue, []
        return out

    # --------------------------------------------------------------------------------------------- internals

    def vm_body(self, request: LaunchRequest) -> m.VirtualMachine:
        """The VirtualMachine `launch` PUTs for a request."""
        offering = request.offering
        name = vm_name(request.launch_token)
        custom_data = base64.b64encode(request.user_data.encode()).decode() if request.user_data else None
        nic_ip = m.VirtualMachineNetworkInterfaceIPConfiguration(
            name="ipconfig1",
            properties=m.VirtualMachineNetworkInterfaceIPConfigurationProperties(
                subnet=m.SubResource(id=self.subnet_id), primary=True
            ),
        )
        nic = m.VirtualMachineNetworkInterfaceConfiguration(
            name=f"{name}-nic",
            properties=m.VirtualMachineNetworkInterfaceConfigurationProperties(
                primary=True, delete_option="Delete", ip_configurations=[nic_ip]
            ),
        )
        os_disk = m.OSDisk(create_option="FromImage", delete_option="Delete", disk_size_gb=self.os_disk_gb)
        if self.os_disk_type:
            os_disk.managed_disk = m.ManagedDiskParameters(storage_account_type=self.os_disk_type)
        properties = m.VirtualMachineProperties(
            hardware_profile=m.HardwareProfile(vm_size=offering.instance_type),
            storage_profile=m.StorageProfile(image_reference=m.ImageReference(self.image_reference), os_disk=os_disk),
            os_profile=m.OSProfile(
                computer_name=name,
                admin_username=self.admin_username,
                custom_data=custom_data,
                linux_configuration=m.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=m.SshConfiguration(
                        public_keys=[
                            m.SshPublicKey(
                                path=f"/home/{self.admin_username}/.ssh/authorized_keys", key_data=self.ssh_public_key
                            )
                        ]
                    ),
                ),
            ),
            network_profile=m.NetworkProfile(
                network_api_version=NETWORK_API_VERSION, network_interface_configurations=[nic]
            ),
        )
        if offering.capacity_type is CapacityType.SPOT:
            properties.priority = "Spot"
            properties.eviction_policy = self.eviction_policy
            properties.billing_profile = m.BillingProfile(max_price=max_price(request))
        zones = [offering.zone] if offering.zone != offering.region and offering.zone.isdigit() else None
        vm = m.VirtualMachine(
            location=self.location,
            tags=azure_tags(request.tags.as_dict(), request.launch_token, offering.key, self.extra_tags),
            zones=zones,
            properties=properties,
        )
        if self.managed_identity_id:
            vm.identity = m.VirtualMachineIdentity(
                type="UserAssigned",
                user_assigned_identities={self.managed_identity_id: m.UserAssignedIdentitiesValue()},
            )
        return vm

    def _retried(self, fn: Callable[[], T]) -> T:
        """`fn()` under the retry policy (transient failures only); raw SDK errors, for the callers to type."""
        return self.retry.call(fn, transient, _retry_after)

    def _listing(self, what: str, pages: Callable[[], Iterable[m.VirtualMachine]]) -> list[m.VirtualMachine]:
        """Every item of a paged VM list (each page one request; the whole list retried on a transient failure),
        its failure typed. A 404 is the container's (resource group, subscription), not the VMs': a
        `ProviderError`, so that it never reads as every VM gone."""
        try:
            return self._retried(lambda: list(pages()))
        except HttpResponseError as exc:
            err = _error(self.name, exc, what)
            if isinstance(err, NotFound):
                raise ProviderError(str(err), provider=self.name, detail=err.detail or "HTTP 404") from exc
            raise err from exc
        except AzureError as exc:
            raise Throttled(f"{what}: {exc}", provider=self.name) from exc

    def _evicted(self, instance_id: str) -> Instance | None:
        """The last view of a VM gone after a relayed Preempt event (evictionPolicy Delete), as PREEMPTED."""
        with self._lock:
            notice = self._preempt_notices.get(instance_id)
            last = self._last_seen.get(instance_id)
        if notice is None or last is None:
            return None
        return dataclasses.replace(
            last,
            state=InstanceState.PREEMPTED,
            ended_at=notice.action_at or notice.at,
            detail="evicted (Preempt scheduled event relayed) and deleted by evictionPolicy Delete",
            lingering=False,
        )

    def _instance_view(self, name: str) -> m.VirtualMachineInstanceView:
        return self._retried(lambda: self._vms.instance_view(self.resource_group, name))

    def _failure(self, vm: m.VirtualMachine, name: str) -> ProviderError:
        """The typed error of a VM in provisioning state Failed, from the code its instance view gives."""
        found = failure_of(vm)
        if found is None:
            return ProviderError(f"create {name}: provisioning failed", provider=self.name, detail="Failed")
        code, message = found
        return classify(self.name, {code}, message, None, f"create {name}")

    def _delete_quietly(self, name: str) -> None:
        with contextlib.suppress(AzureError):  # best effort: the caller is already failing with the real error
            self._retried(lambda: self._vms.begin_delete(self.resource_group, name, polling=False))

    def _read(self, name: str) -> m.VirtualMachine | None:
        try:
            return self._retried(lambda: self._vms.get(self.resource_group, name, expand="instanceView"))
        except ResourceNotFoundError:
            return None
        except HttpResponseError as exc:
            err = _error(self.name, exc, f"get {name}")
            if isinstance(err, NotFound):
                return None
            raise err from exc
        except AzureError as exc:
            raise Throttled(f"get {name}: {exc}", provider=self.name) from exc

    def _adopt(self, vm: m.VirtualMachine, launch_token: str) -> Instance:
        view = self._view(vm, vm.instance_view)
        if view.launch_token != launch_token:
            raise InvalidRequest(
                f"VM {vm.name} exists for another launch token", provider=self.name, detail=view.launch_token
            )
        return view

    def _view(self, vm: m.VirtualMachine, iv: m.VirtualMachineInstanceView | None) -> Instance:
        name = str(vm.name)
        tags = dict(vm.tags or {})
        spot = _text(vm.priority).lower() == "spot"
        provisioning = _text(vm.provisioning_state).lower()
        statuses = list(iv.statuses or []) if iv is not None else []
        codes = [(_text(s.code), s) for s in statuses]
        power = next((c.split("/", 1)[1] for c, _ in codes if c.startswith("PowerState/")), "")
        provisioned = next((s for c, s in codes if c.lower() == "provisioningstate/succeeded"), None)
        failed = next((s for c, s in codes if c.lower().startswith("provisioningstate/failed")), None)
        with self._lock:
            notice = self._preempt_notices.get(name)
        stopped = power in ("stopping", "stopped", "deallocating", "deallocated") or provisioning == "deleting"
        detail = f"provisioning {provisioning or '?'}, power {power or '?'}"
        if stopped and notice is not None:
            state, detail = InstanceState.PREEMPTED, f"evicted (Preempt scheduled event); {detail}"
        elif provisioning == "deleting":
            state = InstanceState.TERMINATED
        elif power in ("deallocating", "deallocated"):
            state = InstanceState.PREEMPTED if spot else InstanceState.TERMINATED
            if spot:
                detail = f"spot VM deallocated by Azure (evicted); {detail}"
        elif power in ("stopping", "stopped"):
            state = InstanceState.TERMINATED
        elif power == "running":  # even if provisioning later failed (an extension, an update): the job runs
            state = InstanceState.RUNNING
        elif provisioning == "failed" or failed is not None:
            state = InstanceState.FAILED
            if failed is not None:
                detail = f"{failed.code}: {failed.message or failed.display_status or ''}".rstrip(": ")
        else:
            state = InstanceState.PENDING
        launch_error = None
        if state is InstanceState.FAILED:  # never ran: the create's operation refused it
            code = _text(failed.code)[len(_FAILED_PREFIX) :] if failed is not None else ""
            message = str((failed.message or failed.display_status) if failed is not None else "") or detail
            launch_error = (
                classify(self.name, {code}, message, None, f"create {name}")
                if code
                else ProviderError(f"create {name}: provisioning failed", provider=self.name, detail="Failed")
            )
        launched = vm.time_created or self._clock()
        started = None
        if state is not InstanceState.PENDING and power:
            started = (provisioned.time if provisioned is not None else None) or launched
        instance = Instance(
            id=name,
            provider=self.name,
            offering_key=tags.get(OFFERING_TAG) or self._offering_key(vm, spot),
            launch_token=tags.get(TOKEN_TAG, ""),
            state=state,
            tags={k: v for k, v in tags.items() if k not in INTERNAL_TAGS},
            launched_at=launched,
            started_at=started,
            ended_at=(notice.action_at if notice is not None and state is InstanceState.PREEMPTED else None),
            detail=detail,
            lingering=state.terminal and provisioning != "deleting",  # stopped, deallocated or failed: still billed
            launch_error=launch_error,
        )
        with self._lock:
            self._last_seen[name] = instance
        return instance

    def _offering_key(self, vm: m.VirtualMachine, spot: bool) -> str:
        location = _text(vm.location) or self.location
        zone = (vm.zones or [location])[0]
        size = _text(vm.hardware_profile.vm_size if vm.hardware_profile else None)
        capacity = CapacityType.SPOT if spot else CapacityType.ON_DEMAND
        return offering_key(self.name, location, zone, size, capacity)
