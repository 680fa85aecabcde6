"""A local stand-in for the ARM virtual-machine API, for `providers.azure` tests through the real
`azure.mgmt.compute.ComputeManagementClient` (`base_url` = `AzureComputeFake.url`, a bearer-token credential,
`retry_total=0`).

Role: keep VMs in memory and answer in the real ARM shapes (the libcloud azure_arm fixtures
`..._virtualMachines_test_node_1.json` and `..._InstanceView.json`: `properties.hardwareProfile`, `storageProfile`,
`osProfile` without `customData`, `provisioningState`, instance view `statuses` with "ProvisioningState/..." and
"PowerState/..." codes), with long-running operations.

Contract:
- Every call needs `api-version` and an `Authorization: Bearer` header (else 400 / 401 AuthenticationFailed).
- `PUT .../virtualMachines/{name}` validates tag names (no `< > % & \\ ? /`), tag values (<= 256), base64
  `customData`, `networkInterfaceConfigurations` only with `networkApiVersion`, eviction settings only on Spot, then
  answers 201 (200 for an existing VM) with the VM as "Creating" and an `Azure-AsyncOperation` header. The operation
  is InProgress for `op_seconds`, then Succeeded (the VM: provisioning Succeeded, PowerState/running) or, when a
  `fail_async` fault is armed, Failed with that ARM error, leaving the VM in provisioning state Failed with a
  "ProvisioningState/failed/{code}" status, as Azure does.
- `GET .../{name}[?$expand=instanceView]`, `GET .../{name}/instanceView`, 404 ResourceNotFound for an unknown VM.
- Lists, paged as ARM pages them: `{"value": [...]}` of at most `page_size` VMs (200 by default: ARM does not
  document the VM lists' page size; clients follow `nextLink` whatever it is) and, while more remain, an absolute
  `nextLink` (built from the request's Host, carrying `api-version` and a `$skiptoken`, as ARM's do).
  `GET /subscriptions/{s}/resourceGroups/{g}/providers/Microsoft.Compute/virtualMachines` (call "list") is the
  group's VM models without instance views; `GET /subscriptions/{s}/providers/Microsoft.Compute/virtualMachines`
  (call "list_all") the subscription's, and with `statusOnly=true` each VM in the status-only shape ARM answers:
  `name`, `id`, `type`, `location` and `properties` holding only `vmId`, `provisioningState`, an empty
  `hardwareProfile` and `instanceView.statuses` (no tags: those come only from the model lists). On either list
  `$expand=instanceView` is refused (400 InvalidParameter) without a `$filter`, as documented ("can only be
  specified if a valid $filter option is specified"); the one `$filter` accepted is
  `'virtualMachineScaleSet/id' eq '<id>'` (no VM here belongs to a scale set). `list_lag` plays list reads lagging
  behind writes: a VM created less than `list_lag` seconds ago is missing from both lists, while a GET finds it.
- `DELETE .../{name}` answers 204 for an unknown VM, else 202 with `Location` (+ `Azure-AsyncOperation`); the VM is
  "Deleting" until the operation ends, then gone. The Location monitor answers 202 while running, then 204.
- Faults: `fail(call, status, code, message)` for "put", "get", "delete", "list", "list_all", "instance_view" and
  "operation" (a status poll of a long-running operation), each page of a list being one request;
  `then(call, action)` runs `action()` right after the next "list" or "list_all" request is answered (a change
  racing between two reads);
  `fail_async(code, message)` for the next PUT's operation; `drop_response("put")` carries out the next PUT but hangs
  up without answering.
- A PUT carrying the header `X-Fake-Fault: <code>` (sent by tests/fault_proxy.py, which decides the faults of a
  seeded run) is accepted like any other and its operation ends Failed with that ARM code and Azure's own message
  (`allocation_error`: AllocationFailed for a regional VM, ZonalAllocationFailed for a zonal one), exactly as
  `fail_async` arms it.
- Bookkeeping: `created[name]` counts the VMs made under each name (a PUT answered 201; a PUT of an existing VM is
  an update, answered 200, counted in `updated`), so a test can check a launch token never made two VMs.
- `evict(name)` plays a spot eviction (evictionPolicy Deallocate: PowerState/deallocated; Delete: the VM is
  deleted); `guest_shutdown(name)` plays `shutdown -h now` inside the VM (PowerState/stopped); `add_vm` makes a VM
  the broker did not launch. Every request is appended to `requests` (method, path, query, headers, JSON body).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.local_server import LocalServer

_VM = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/virtualMachines"
    r"(?:/(?P<name>[^/]+)(?P<iv>/instanceView)?)?$",
    re.IGNORECASE,
)
_SUB_VMS = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Compute/virtualMachines$", re.IGNORECASE)
_SCALE_SET_FILTER = re.compile(r"^\s*'?virtualMachineScaleSet/id'?\s+eq\s+'(?P<id>[^']+)'\s*$", re.IGNORECASE)
_EXPAND_NEEDS_FILTER = (
    "The expand expression 'instanceView' can only be specified if a valid $filter option is specified."
)
_OP = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)/operations/(?P<id>[^/]+)$",
    re.IGNORECASE,
)
_TAG_FORBIDDEN = re.compile(r"[<>%&\\?/]")
FAULT_HEADER = "X-Fake-Fault"
_ALLOCATION_GUIDANCE = "Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance"
_POWER_DISPLAY = {
    "starting": "VM starting",
    "running": "VM running",
    "stopping": "VM stopping",
    "stopped": "VM stopped",
    "deallocating": "VM deallocating",
    "deallocated": "VM deallocated",
}


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds")


def allocation_error(code: str) -> str:
    """Azure's message for an allocation failure code (what the failed operation's `error.message` says)."""
    where = "zone" if code == "ZonalAllocationFailed" else "region"
    return f"Allocation failed. We do not have sufficient capacity for the requested VM size in this {where}. " + (
        _ALLOCATION_GUIDANCE
    )


def _created_at(vm: dict[str, Any]) -> float:
    created = vm["properties"].get("timeCreated")
    return datetime.fromisoformat(created).timestamp() if created else 0.0


def arm_error(status: int, code: str, message: str) -> tuple[int, dict[str, str], Any]:
    return status, {}, {"error": {"code": code, "message": message}}


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class Fault:
    call: str
    status: int
    code: str
    message: str
    count: int


@dataclass
class Operation:
    id: str
    kind: str  # "put" | "delete"
    vm_key: tuple[str, str]
    done_at: float
    started: float
    status: str = "InProgress"
    error: dict[str, str] | None = None


class AzureComputeFake(LocalServer):
    """In-memory ARM virtual machines behind a stdlib HTTP server (see the module docstring)."""

    def __init__(
        self,
        subscription: str,
        *,
        op_seconds: float = 0.0,
        api_version_required: bool = True,
        page_size: int = 200,
        list_lag: float = 0.0,
    ) -> None:
        self.subscription = subscription
        self.op_seconds = op_seconds
        self.api_version_required = api_version_required
        self.page_size = page_size
        self.list_lag = list_lag
        self.hooks: dict[str, list[Callable[[], None]]] = {}
        self.vms: dict[tuple[str, str], dict[str, Any]] = {}  # (resource group lower, name lower) -> VM
        self.power: dict[tuple[str, str], str] = {}
        self.operations: dict[str, Operation] = {}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.async_faults: list[Fault] = []
        self.drops: dict[str, int] = {}
        self.created: Counter[str] = Counter()
        self.updated: Counter[str] = Counter()
        self._lock = threading.RLock()
        self._serve(_Handler)

    # ------------------------------------------------------------------------------------------------ lifecycle

    # ------------------------------------------------------------------------------------------- test helpers

    def fail(self, call: str, status: int, code: str, message: str = "", count: int = 1) -> None:
        with self._lock:
            self.faults.append(Fault(call, status, code, message or f"injected {code}", count))

    def fail_async(self, code: str, message: str = "", count: int = 1) -> None:
        with self._lock:
            self.async_faults.append(Fault("put", 200, code, message or f"injected {code}", count))

    def drop_response(self, call: str, count: int = 1) -> None:
        with self._lock:
            self.drops[call] = self.drops.get(call, 0) + count

    def then(self, call: str, action: Callable[[], None]) -> None:
        """Run `action()` (under the fake's lock) right after the next `call` ("list" or "list_all") is answered."""
        with self._lock:
            self.hooks.setdefault(call, []).append(action)

    def finish_operations(self) -> None:
        """End every operation still in progress now, as if its `op_seconds` had passed (tests that must not race
        the clock give operations a long `op_seconds` and end them here)."""
        with self._lock:
            now = time.time()
            for op in self.operations.values():
                op.done_at = min(op.done_at, now)

    def recorded(self, method: str, suffix: str = "") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.lower().endswith(suffix.lower())]

    def vm(self, resource_group: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            self._advance()
            found = self.vms.get((resource_group.lower(), name.lower()))
            return copy.deepcopy(found) if found else None

    def add_vm(self, resource_group: str, name: str, location: str, tags: dict[str, str] | None = None) -> str:
        with self._lock:
            props = {"hardwareProfile": {"vmSize": "Standard_A1"}}
            body = {"location": location, "tags": tags or {}, "properties": props}
            key = (resource_group.lower(), name.lower())
            self.vms[key] = self._new_vm(resource_group, name, body, time.time())
            self.vms[key]["properties"]["provisioningState"] = "Succeeded"
            self.power[key] = "running"
        return name

    def evict(self, resource_group: str, name: str) -> None:
        with self._lock:
            self._advance()
            key = (resource_group.lower(), name.lower())
            vm = self.vms[key]
            assert vm["properties"].get("priority") == "Spot", "only Spot VMs are evicted"
            if vm["properties"].get("evictionPolicy") == "Delete":
                del self.vms[key]
                self.power.pop(key, None)
            else:
                self.power[key] = "deallocated"

    def guest_shutdown(self, resource_group: str, name: str) -> None:
        with self._lock:
            self._advance()
            self.power[(resource_group.lower(), name.lower())] = "stopped"

    # -------------------------------------------------------------------------------------------- the model

    def _vm_id(self, resource_group: str, name: str) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{resource_group}"
            f"/providers/Microsoft.Compute/virtualMachines/{name}"
        )

    def _new_vm(self, resource_group: str, name: str, body: dict[str, Any], now: float) -> dict[str, Any]:
        props = copy.deepcopy(body.get("properties") or {})
        os_profile = props.get("osProfile")
        if os_profile is not None:
            os_profile.pop("customData", None)  # write-only: ARM never returns it
            os_profile.setdefault("secrets", [])
            os_profile.setdefault("allowExtensionOperations", True)
        storage = props.setdefault("storageProfile", {})
        os_disk = storage.setdefault("osDisk", {})
        disk_name = f"{name}_OsDisk_1_{uuid.uuid4().hex}"
        os_disk.update(
            {
                "osType": "Linux",
                "name": disk_name,
                "caching": "ReadWrite",
                "managedDisk": {
                    "storageAccountType": "Premium_LRS",
                    "id": f"/subscriptions/{self.subscription}/resourceGroups/{resource_group}"
                    f"/providers/Microsoft.Compute/disks/{disk_name}",
                },
            }
        )
        storage.setdefault("dataDisks", [])
        props.update({"vmId": str(uuid.uuid4()), "provisioningState": "Creating", "timeCreated": iso(now)})
        vm: dict[str, Any] = {
            "name": name,
            "id": self._vm_id(resource_group, name),
            "type": "Microsoft.Compute/virtualMachines",
            "location": body.get("location"),
            "tags": dict(body.get("tags") or {}),
            "properties": props,
        }
        if body.get("zones"):
            vm["zones"] = list(body["zones"])
        return vm

    def _instance_view(self, key: tuple[str, str]) -> dict[str, Any]:
        vm = self.vms[key]
        state = str(vm["properties"].get("provisioningState", "Succeeded"))
        code = f"ProvisioningState/{state.lower()}"
        failure = vm.get("_failure")
        status: dict[str, Any] = {"code": code, "level": "Info", "displayStatus": f"Provisioning {state.lower()}"}
        if failure is not None:
            status = {
                "code": f"ProvisioningState/failed/{failure['code']}",
                "level": "Error",
                "displayStatus": "Provisioning failed",
                "message": failure["message"],
            }
        status["time"] = vm["properties"].get("timeCreated")
        statuses = [status]
        power = self.power.get(key)
        if power is not None:
            statuses.append({"code": f"PowerState/{power}", "level": "Info", "displayStatus": _POWER_DISPLAY[power]})
        view: dict[str, Any] = {"computerName": vm["name"], "osName": "ubuntu", "osVersion": "22.04"}
        view["statuses"] = statuses
        if power == "running":
            view["vmAgent"] = {
                "vmAgentVersion": "2.2.5",
                "statuses": [
                    {
                        "code": "ProvisioningState/succeeded",
                        "level": "Info",
                        "displayStatus": "Ready",
                        "message": "Guest Agent is running",
                        "time": vm["properties"].get("timeCreated"),
                    }
                ],
                "extensionHandlers": [],
            }
        return view

    def _public(self, key: tuple[str, str], expand: bool) -> dict[str, Any]:
        vm = {k: v for k, v in copy.deepcopy(self.vms[key]).items() if not k.startswith("_")}
        if expand:
            vm["properties"]["instanceView"] = self._instance_view(key)
        return vm

    def _advance(self) -> None:
        now = time.time()
        for op in self.operations.values():
            if op.status != "InProgress" or now < op.done_at:
                continue
            vm = self.vms.get(op.vm_key)
            if op.kind == "delete":
                op.status = "Succeeded"
                self.vms.pop(op.vm_key, None)
                self.power.pop(op.vm_key, None)
            elif op.error is not None:
                op.status = "Failed"
                if vm is not None:
                    vm["properties"]["provisioningState"] = "Failed"
                    vm["_failure"] = op.error
            else:
                op.status = "Succeeded"
                if vm is not None:
                    vm["properties"]["provisioningState"] = "Succeeded"
                    self.power[op.vm_key] = "running"

    def _take(self, faults: list[Fault], call: str) -> Fault | None:
        for fault in faults:
            if fault.call == call and fault.count > 0:
                fault.count -= 1
                return fault
        return None

    def _op_headers(self, op: Operation, location: str, *, monitor: bool) -> dict[str, str]:
        base = f"{self.url}/subscriptions/{self.subscription}/providers/Microsoft.Compute/locations/{location}"
        headers = {"Azure-AsyncOperation": f"{base}/operations/{op.id}?p=1&api-version=2026-04-01"}
        if monitor:
            headers["Location"] = f"{base}/operations/{op.id}?p=1&monitor=true&api-version=2026-04-01"
        return headers

    # -------------------------------------------------------------------------------------------- handlers

    def handle(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], body: Any
    ) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            self.requests.append(Recorded(method, path, query, headers, body))
            self._advance()
            if self.api_version_required and "api-version" not in query:
                return arm_error(400, "MissingApiVersionParameter", "The api-version query parameter is required.")
            if not headers.get("authorization", "").startswith("Bearer "):
                msg = "Authentication failed. The 'Authorization' header is missing."
                return arm_error(401, "AuthenticationFailed", msg)
            op_match = _OP.match(path)
            if op_match is not None:
                return self._operation(op_match.group("id"), "monitor" in query)
            sub_match = _SUB_VMS.match(path)
            if sub_match is not None and sub_match.group("sub") == self.subscription:
                if method != "GET":
                    return arm_error(405, "MethodNotAllowed", method)
                return self._paged("list_all", None, path, query, headers)
            m = _VM.match(path)
            if m is None or m.group("sub") != self.subscription:
                return arm_error(404, "NotFound", f"no route for {path}")
            rg, name = m.group("rg"), m.group("name")
            if name is None:
                if method != "GET":
                    return arm_error(405, "MethodNotAllowed", method)
                return self._paged("list", rg, path, query, headers)
            if m.group("iv"):
                return self._get(rg, name, expand=False, instance_view_only=True)
            if method == "PUT":
                return self._put(rg, name, body or {}, headers.get(FAULT_HEADER.lower(), ""))
            if method == "GET":
                return self._get(rg, name, expand=query.get("$expand", [""])[0].lower() == "instanceview")
            if method == "DELETE":
                return self._delete(rg, name)
            return arm_error(405, "MethodNotAllowed", method)

    def _fault(self, call: str) -> tuple[int, dict[str, str], Any] | None:
        fault = self._take(self.faults, call)
        if fault is None:
            return None
        status, headers, body = arm_error(fault.status, fault.code, fault.message)
        if fault.status == 429:
            headers["Retry-After"] = "1"
        return status, headers, body

    def _not_found(self, rg: str, name: str) -> tuple[int, dict[str, str], Any]:
        msg = (
            f"The Resource 'Microsoft.Compute/virtualMachines/{name}' under resource group '{rg}' was not found. "
            "For more details please go to https://aka.ms/ARMResourceNotFoundFix"
        )
        return arm_error(404, "ResourceNotFound", msg)

    def _validate(self, body: dict[str, Any]) -> tuple[int, dict[str, str], Any] | None:
        if not body.get("location"):
            return arm_error(400, "LocationRequired", "The location property is required for this definition.")
        for key, value in (body.get("tags") or {}).items():
            if _TAG_FORBIDDEN.search(key):
                msg = f"The tag names '{key}' have reserved characters '<,>,%,&,\\,?,/' or control characters."
                return arm_error(400, "InvalidTagNameCharacters", msg)
            if len(str(value)) > 256:
                return arm_error(400, "InvalidTagValueLength", f"Tag value too long for '{key}'.")
        props = body.get("properties") or {}
        if not (props.get("hardwareProfile") or {}).get("vmSize"):
            return arm_error(400, "InvalidParameter", "Required parameter 'hardwareProfile.vmSize' is missing.")
        custom = (props.get("osProfile") or {}).get("customData")
        if custom is not None:
            try:
                base64.b64decode(custom, validate=True)
            except (binascii.Error, ValueError):
                return arm_error(400, "InvalidParameter", "Custom data in OSProfile must be in Base64 encoding.")
        network = props.get("networkProfile") or {}
        if network.get("networkInterfaceConfigurations") and not network.get("networkApiVersion"):
            msg = "networkApiVersion must be specified when networkInterfaceConfigurations is used."
            return arm_error(400, "InvalidParameter", msg)
        if props.get("priority") != "Spot" and (props.get("evictionPolicy") or props.get("billingProfile")):
            msg = "Eviction policy and billing profile can be set only for Azure Spot virtual machines."
            return arm_error(400, "InvalidParameter", msg)
        return None

    def _put(self, rg: str, name: str, body: dict[str, Any], allocation: str = "") -> tuple[int, dict[str, str], Any]:
        fault = self._fault("put")
        if fault is not None:
            return fault
        invalid = self._validate(body)
        if invalid is not None:
            return invalid
        key = (rg.lower(), name.lower())
        now = time.time()
        existing = self.vms.get(key)
        if existing is not None and existing["properties"].get("provisioningState") == "Deleting":
            msg = f"Operation 'PUT' is not allowed on VM '{name}' since the VM is marked for deletion."
            return arm_error(409, "OperationNotAllowed", msg)
        status = 200 if existing is not None else 201
        (self.updated if existing is not None else self.created)[name.lower()] += 1
        vm = self._new_vm(rg, name, body, now)
        if existing is not None:
            vm["properties"]["vmId"] = existing["properties"]["vmId"]
            vm["properties"]["timeCreated"] = existing["properties"]["timeCreated"]
            vm["properties"]["provisioningState"] = "Updating"
        self.vms[key] = vm
        self.power.setdefault(key, "starting")
        op = Operation(str(uuid.uuid4()), "put", key, now + self.op_seconds, now)
        async_fault = None if allocation else self._take(self.async_faults, "put")
        if allocation:
            op.error = {"code": allocation, "message": allocation_error(allocation)}
        elif async_fault is not None:
            op.error = {"code": async_fault.code, "message": async_fault.message}
        if op.error is not None:
            self.power.pop(key, None)
        self.operations[op.id] = op
        headers = self._op_headers(op, str(body["location"]), monitor=False)
        public = self._public(key, expand=False)
        if self.drops.get("put", 0) > 0:
            self.drops["put"] -= 1
            return -1, headers, public
        return status, headers, public

    def _get(
        self, rg: str, name: str, *, expand: bool, instance_view_only: bool = False
    ) -> tuple[int, dict[str, str], Any]:
        fault = self._fault("instance_view" if instance_view_only else "get")
        if fault is not None:
            return fault
        key = (rg.lower(), name.lower())
        if key not in self.vms:
            return self._not_found(rg, name)
        if instance_view_only:
            return 200, {}, self._instance_view(key)
        return 200, {}, self._public(key, expand)

    def _paged(
        self, call: str, rg: str | None, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> tuple[int, dict[str, str], Any]:
        """One page of the group's ("list", `rg`) or the subscription's ("list_all") VMs (see the module docstring)."""
        fault = self._fault(call)
        if fault is not None:
            return fault
        status_only = call == "list_all" and query.get("statusOnly", [""])[0].lower() == "true"
        expand = query.get("$expand", [""])[0]
        text = query.get("$filter", [""])[0]
        scale_set = _SCALE_SET_FILTER.match(text) if text else None
        if text and scale_set is None:
            return arm_error(400, "InvalidParameter", f"The $filter '{text}' is not supported.")
        if expand and (expand.lower() != "instanceview" or scale_set is None):
            return arm_error(400, "InvalidParameter", _EXPAND_NEEDS_FILTER)
        token = query.get("$skiptoken", ["0"])[0]
        if not token.isdigit():
            return arm_error(400, "InvalidParameter", f"The $skiptoken '{token}' is not valid.")
        start = int(token)
        now = time.time()
        keys = [
            k
            for k in sorted(self.vms)
            if (rg is None or k[0] == rg.lower())
            and scale_set is None
            and now - _created_at(self.vms[k]) >= self.list_lag
        ]
        page = keys[start : start + self.page_size]
        body: dict[str, Any] = {
            "value": [self._status_only(k) if status_only else self._public(k, expand=bool(expand)) for k in page]
        }
        if start + self.page_size < len(keys):
            host = headers.get("host") or self.url.removeprefix("http://")
            params = {k: v[0] for k, v in query.items() if k != "$skiptoken"}
            params["$skiptoken"] = str(start + self.page_size)
            body["nextLink"] = f"http://{host}{path}?{urlencode(params)}"
        for action in self.hooks.pop(call, []):
            action()
        return 200, {}, body

    def _status_only(self, key: tuple[str, str]) -> dict[str, Any]:
        """A VM as a `statusOnly=true` list shows it: identity, provisioning state and instance-view statuses."""
        vm = self.vms[key]
        return {
            "name": vm["name"],
            "id": vm["id"],
            "type": vm["type"],
            "location": vm["location"],
            "properties": {
                "vmId": vm["properties"].get("vmId"),
                "hardwareProfile": {},
                "provisioningState": vm["properties"].get("provisioningState"),
                "instanceView": {"statuses": self._instance_view(key)["statuses"]},
            },
        }

    def _delete(self, rg: str, name: str) -> tuple[int, dict[str, str], Any]:
        fault = self._fault("delete")
        if fault is not None:
            return fault
        key = (rg.lower(), name.lower())
        vm = self.vms.get(key)
        if vm is None:
            return 204, {}, None
        vm["properties"]["provisioningState"] = "Deleting"
        now = time.time()
        op = Operation(str(uuid.uuid4()), "delete", key, now + self.op_seconds, now)
        self.operations[op.id] = op
        self._advance()
        return 202, self._op_headers(op, str(vm["location"]), monitor=True), None

    def _operation(self, op_id: str, monitor: bool) -> tuple[int, dict[str, str], Any]:
        fault = self._fault("operation")
        if fault is not None:
            return fault
        op = self.operations.get(op_id)
        if op is None:
            return arm_error(404, "NotFound", f"operation {op_id} not found")
        if monitor:
            return (202, {}, None) if op.status == "InProgress" else (204, {}, None)
        body: dict[str, Any] = {"startTime": iso(op.started), "status": op.status, "name": op.id}
        if op.status != "InProgress":
            body["endTime"] = iso(max(op.done_at, op.started))
        if op.error is not None and op.status == "Failed":
            body["error"] = dict(op.error)
        return 200, {}, body


class _Handler(BaseHTTPRequestHandler):
    owner: AzureComputeFake
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        query = parse_qs(parts.query, keep_blank_values=True)
        status, extra, payload = self.owner.handle(method, parts.path, query, headers, body)
        if status < 0:  # carried out, but the client never hears back
            self.close_connection = True
            return
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            self.send_response(status)
            if data:
                self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        pass
