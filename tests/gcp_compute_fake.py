"""A local stand-in for the Compute Engine instance and zone-operation APIs, for `providers.gcp` tests through the real
`google.cloud.compute_v1` clients (transport="rest", `api_endpoint` = `GcpComputeFake.endpoint`, anonymous
credentials).

Role: keep instances and operations in memory and answer in the real REST shapes (the libcloud gce fixture
`zones_us-central1-a_instances_node-name.json` for instances: full-URL `machineType`/`zone`/`selfLink`, int64 `id` as a
string, `metadata.items`, `scheduling`, RFC 3339 timestamps with an offset; `compute#operation` for operations).

Contract:
- `POST .../zones/{z}/instances` validates the name (RFC 1035) and labels ([a-z0-9_-], keys start with a letter, at
  most 63), answers 409 `alreadyExists` for a taken name and, for a `requestId` it has seen, the original operation.
  It returns a RUNNING `insert` operation; the VM exists at once as PROVISIONING and turns RUNNING after `boot_seconds`.
  Operations finish after `op_seconds` (0: on the next request).
- `DELETE .../instances/{name}` answers 404 `notFound` for an unknown VM, else a `delete` operation; the VM is
  STOPPING until the operation finishes, then gone.
- `GET .../instances/{name}`, `GET /compute/v1/projects/{p}/aggregated/instances` (every zone in `zones`, empty ones
  with the real NO_RESULTS_ON_PAGE warning), `GET .../zones/{z}/operations[/{op}]`, `POST .../operations/{op}/wait`
  (blocks until done, at most 2 s). List filters accept `(field = "value")` clauses joined by AND or spaces, on
  dotted paths (`labels.overspill-broker`, `operationType`, `targetLink`); anything else is a 400.
- The aggregated list pages as Compute Engine does: at most `maxResults` VMs a page (default `page_size`, 500 like
  the API), a `nextPageToken` while more remain, the next page asked with `pageToken` (and the same filter: a
  token from another filter is a 400). `list_lag` plays list reads lagging behind writes: a VM inserted less than
  `list_lag` seconds ago is missing from aggregated lists, while `instances.get` finds it at once. A zone in
  `unreachable` plays a zone the list cannot reach: its scope holds no VMs and an UNREACHABLE warning (a code of the
  API's Warning enum, "a given scope cannot be reached"; the message text is this fake's).
- Faults: `fail(call, status, reason)` makes the next request(s) of a call ("insert", "get", "delete", "list",
  "operations") answer the Google error body; `fail_operation(code, message, http_status)` makes the next insert's
  operation finish with that error and no VM. A failing insert operation runs like any other (RUNNING for
  `op_seconds`, so with 0 it is DONE in the insert's own answer) and carries its error once DONE, as Google's does.
- `preempt(instance_id)` plays a spot reclaim: the VM goes TERMINATED with `lastStopTimestamp`, a DONE
  "compute.instances.preempted" operation by user "system" targets it, and with instanceTerminationAction DELETE the
  VM is then deleted. `guest_shutdown` stops a VM from inside (TERMINATED, no operation). `add_instance` makes a
  VM the broker did not launch.
- `drop_response("insert")` carries out the next insert but hangs up without answering (the caller crashed or lost
  the answer); `forget_request_ids()` plays the end of Google's requestId idempotency window.
- An insert carrying the header `X-Fake-Fault: <code>` (sent by tests/fault_proxy.py, which decides the faults of a
  seeded run) fails the way Google reports a stockout: the insert is accepted (200, an operation) and the
  operation ends (after `op_seconds`) DONE with `error.errors[0].code` = the code (ZONE_RESOURCE_POOL_EXHAUSTED or
  ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS), Google's message and `errorDetails` (help link, localized message),
  `httpErrorStatusCode` 503 "SERVICE UNAVAILABLE", and no VM (`operation_error`). A retried insert of a requestId
  already seen gets its first operation, as on Google, whatever the header says.
- `adc_file(path, token)` writes an Application Default Credentials file for google-auth that holds `token`, so
  clients built with google.auth.default send `Authorization: Bearer <token>` here and never call Google.
- Bookkeeping: every request is appended to `requests` (method, path, query, parsed JSON body, headers);
  `created[name]` counts the VMs made under each name (a launch token never makes two), `replayed` the inserts
  answered from a known requestId.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.local_server import LocalServer

BASE = "https://www.googleapis.com/compute/v1"
PACIFIC = timezone(timedelta(hours=-7))  # the API answers in the project's local time, like the fixture
PREEMPTED = "compute.instances.preempted"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_CLAUSE = re.compile(r'\(?\s*([A-Za-z][\w.-]*)\s*(=|!=)\s*(?:"([^"]*)"|([^\s()"]+))\s*\)?')
_ROUTE = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/(?:"
    r"aggregated/instances$|"
    r"zones/(?P<zone>[^/]+)/(?:instances(?:/(?P<instance>[^/]+))?|operations(?:/(?P<op>[^/]+)(?P<wait>/wait)?)?)$)"
)
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
FAULT_HEADER = "X-Fake-Fault"
CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")


def stamp(at: float) -> str:
    return datetime.fromtimestamp(at, PACIFIC).isoformat(timespec="milliseconds")


def parse_filter(text: str) -> list[tuple[str, str, str]] | None:
    """`(path, op, value)` clauses of a Compute list filter; None when the text is not one this fake understands."""
    clauses: list[tuple[str, str, str]] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = _CLAUSE.match(text, pos)
        if m is None:
            return None
        value = m.group(3) if m.group(3) is not None else m.group(4)
        clauses.append((m.group(1), m.group(2), value))
        pos = m.end()
        rest = text[pos:].lstrip()
        if rest.startswith("AND "):
            rest = rest[4:]
        pos = len(text) - len(rest.lstrip())
    return clauses


def matches(resource: dict[str, Any], clauses: list[tuple[str, str, str]]) -> bool:
    for path, op, value in clauses:
        node: Any = resource
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (node is not None and str(node) == value) != (op == "="):
            return False
    return True


def error_body(status: int, reason: str, message: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "code": status,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}],
    }
    if status in _STATUS_NAMES:
        body["status"] = _STATUS_NAMES[status]
    return {"error": body}


def operation_error(code: str, project: str, zone: str) -> dict[str, Any]:
    """The `error` of an insert operation that hit a stockout, as Compute Engine writes it."""
    where = f"projects/{project}/zones/{zone}"
    lacking = f"The zone '{where}' does not have enough resources available to fulfill the request."
    if code == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS":
        message = f"{lacking}  '(resource type:compute)'."
    else:
        message = f"{lacking}  Try a different zone, or try again later."
    details = [
        {
            "help": {
                "links": [
                    {
                        "description": "Troubleshooting documentation",
                        "url": "https://cloud.google.com/compute/docs/resource-error",
                    }
                ]
            }
        },
        {"localizedMessage": {"locale": "en-US", "message": message}},
    ]
    return {"errors": [{"code": code, "message": message, "errorDetails": details}]}


def adc_file(path: Path, token: str) -> Path:
    """An Application Default Credentials file (authorized_user) that already holds a current access token, so
    google-auth uses it as it is for a day instead of refreshing it at Google (nothing leaves the machine)."""
    expiry = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    info = {
        "type": "authorized_user",
        "client_id": "overspill-faults.apps.googleusercontent.com",
        "client_secret": "not-a-secret",
        "refresh_token": "1//overspill-faults",
        "token": token,
        "expiry": expiry,
    }
    path.write_text(json.dumps(info))
    return path


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Fault:
    call: str
    status: int
    reason: str
    message: str
    count: int


@dataclass
class OperationFault:
    code: str
    message: str
    http_status: int
    count: int


class GcpComputeFake(LocalServer):
    """In-memory Compute Engine instances + zone operations behind a stdlib HTTP server (see the module docstring)."""

    def __init__(
        self,
        project: str = "proj",
        *,
        zones: tuple[str, ...] = ("us-central1-a", "us-central1-b", "us-east1-b"),
        op_seconds: float = 0.0,
        boot_seconds: float = 0.0,
        page_size: int = 500,
        list_lag: float = 0.0,
    ) -> None:
        self.project = project
        self.zones = zones
        self.op_seconds = op_seconds
        self.boot_seconds = boot_seconds
        self.page_size = page_size
        self.list_lag = list_lag
        self.unreachable: set[str] = set()
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.operations: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.op_faults: list[OperationFault] = []
        self.drops: dict[str, int] = {}
        self.created: Counter[str] = Counter()
        self.replayed = 0
        self._boot_at: dict[tuple[str, str], float] = {}
        self._inserted_at: dict[tuple[str, str], float] = {}
        self._done_at: dict[tuple[str, str], float] = {}
        self._op_errors: dict[tuple[str, str], tuple[dict[str, Any], int]] = {}  # what a failing op ends with
        self._request_ids: dict[str, tuple[str, str]] = {}
        self._seq = 0
        self._lock = threading.RLock()
        self._serve(_Handler)

    # ------------------------------------------------------------------------------------------------ lifecycle

    @property
    def endpoint(self) -> str:
        return self.url

    # ------------------------------------------------------------------------------------------- test helpers

    def fail(self, call: str, status: int, reason: str, message: str = "", count: int = 1) -> None:
        with self._lock:
            self.faults.append(Fault(call, status, reason, message or f"injected {reason}", count))

    def drop_response(self, call: str, count: int = 1) -> None:
        """Carry out the next `count` requests of `call` but hang up instead of answering (a client-side crash)."""
        with self._lock:
            self.drops[call] = self.drops.get(call, 0) + count

    def forget_request_ids(self) -> None:
        """Forget every `requestId` seen, as Google does after its idempotency window."""
        with self._lock:
            self._request_ids.clear()

    def fail_operation(self, code: str, message: str, http_status: int, count: int = 1) -> None:
        with self._lock:
            self.op_faults.append(OperationFault(code, message, http_status, count))

    def finish_operations(self) -> None:
        """End every operation still running now, as if its `op_seconds` had passed (tests that must not race the
        clock give operations a long `op_seconds` and end them here)."""
        with self._lock:
            now = time.time()
            for key, at in self._done_at.items():
                self._done_at[key] = min(at, now)

    def recorded(self, method: str, suffix: str = "") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    def instance(self, instance_id: str) -> dict[str, Any] | None:
        zone, _, name = instance_id.partition("/")
        with self._lock:
            self._advance()
            found = self.instances.get((zone, name))
            return copy.deepcopy(found) if found else None

    def add_instance(self, zone: str, name: str, labels: dict[str, str] | None = None) -> str:
        """A running VM the broker did not launch (no overspill metadata)."""
        with self._lock:
            body = {"name": name, "machineType": f"zones/{zone}/machineTypes/n1-standard-1", "labels": labels or {}}
            vm = self._new_instance(zone, body, time.time())
            vm["status"] = "RUNNING"
            self.instances[(zone, name)] = vm
        return f"{zone}/{name}"

    def guest_shutdown(self, instance_id: str) -> None:
        """The guest powers off (the start-up script's final `shutdown -h now`): TERMINATED, no preemption."""
        zone, _, name = instance_id.partition("/")
        with self._lock:
            self._advance()
            vm = self.instances[(zone, name)]
            vm["status"] = "TERMINATED"
            vm["lastStopTimestamp"] = stamp(time.time())

    def preempt(self, instance_id: str) -> str:
        """Reclaim a spot VM; returns the name of the preemption operation."""
        zone, _, name = instance_id.partition("/")
        now = time.time()
        with self._lock:
            self._advance()
            vm = self.instances[(zone, name)]
            vm["status"] = "TERMINATED"
            vm["lastStopTimestamp"] = stamp(now)
            op = self._new_operation(zone, PREEMPTED, vm, now, done=True)
            op["user"] = "system"
            op["statusMessage"] = "Instance was preempted."
            if vm.get("scheduling", {}).get("instanceTerminationAction") == "DELETE":
                del self.instances[(zone, name)]
            return str(op["name"])

    # -------------------------------------------------------------------------------------------- the model

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _new_instance(self, zone: str, body: dict[str, Any], now: float) -> dict[str, Any]:
        name = body["name"]
        vm = copy.deepcopy(body)
        zone_url = f"{BASE}/projects/{self.project}/zones/{zone}"
        vm.update(
            {
                "kind": "compute#instance",
                "id": str(zlib.crc32(f"{zone}/{name}".encode()) * 1_000_003 + self._next()),
                "creationTimestamp": stamp(now),
                "zone": zone_url,
                "selfLink": f"{zone_url}/instances/{name}",
                "status": "PROVISIONING",
                "cpuPlatform": "Intel Broadwell",
                "labelFingerprint": "42WmSpB8rSM=",
                "tags": {"fingerprint": "42WmSpB8rSM="},
                "canIpForward": False,
            }
        )
        vm["machineType"] = f"{BASE}/projects/{self.project}/{body['machineType']}"
        scheduling = vm.setdefault("scheduling", {})
        scheduling.setdefault("automaticRestart", True)
        scheduling.setdefault("onHostMaintenance", "MIGRATE")
        scheduling.setdefault("provisioningModel", "STANDARD")
        for card in vm.get("guestAccelerators", []):
            card["acceleratorType"] = f"{BASE}/projects/{self.project}/{card['acceleratorType']}"
        vm["disks"] = [
            {
                "kind": "compute#attachedDisk",
                "boot": True,
                "autoDelete": True,
                "deviceName": "persistent-disk-0",
                "index": 0,
                "mode": "READ_WRITE",
                "type": "PERSISTENT",
                "source": f"{zone_url}/disks/{name}",
                "diskSizeGb": str(d.get("initializeParams", {}).get("diskSizeGb", "10")),
            }
            for d in body.get("disks", [{}])
        ]
        nics = []
        for i, nic in enumerate(body.get("networkInterfaces", [{}])):
            out: dict[str, Any] = {"kind": "compute#networkInterface", "name": f"nic{i}"}
            out["networkIP"] = f"10.240.72.{75 + i}"
            out["network"] = f"{BASE}/projects/{self.project}/{nic.get('network', 'global/networks/default')}"
            if nic.get("accessConfigs"):
                out["accessConfigs"] = [
                    {"kind": "compute#accessConfig", "name": "External NAT", "natIP": "23.236.58.15", **a}
                    for a in nic["accessConfigs"]
                ]
            nics.append(out)
        vm["networkInterfaces"] = nics
        vm["metadata"] = {
            "kind": "compute#metadata",
            "fingerprint": "42WmSpB8rSM=",
            **({"items": body["metadata"]["items"]} if body.get("metadata", {}).get("items") else {}),
        }
        return vm

    def _new_operation(
        self, zone: str, kind: str, vm: dict[str, Any], now: float, *, done: bool = False
    ) -> dict[str, Any]:
        name = f"operation-{int(now * 1000)}-{self._next():06x}"
        zone_url = f"{BASE}/projects/{self.project}/zones/{zone}"
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(7_000_000_000_000_000_000 + self._next()),
            "name": name,
            "zone": zone_url,
            "operationType": kind,
            "targetLink": vm["selfLink"],
            "targetId": vm["id"],
            "status": "DONE" if done else "RUNNING",
            "user": "overspill@proj.iam.gserviceaccount.com",
            "progress": 100 if done else 0,
            "insertTime": stamp(now),
            "startTime": stamp(now),
            "selfLink": f"{zone_url}/operations/{name}",
        }
        if done:
            op["endTime"] = stamp(now)
        self.operations[(zone, name)] = op
        self._done_at[(zone, name)] = now if done else now + self.op_seconds
        return op

    def _advance(self) -> None:
        """Move instances and operations along the clock (called under the lock at every request)."""
        now = time.time()
        for key, at in list(self._boot_at.items()):
            vm = self.instances.get(key)
            if vm is None:
                del self._boot_at[key]
            elif now >= at and vm["status"] == "PROVISIONING":
                vm["status"] = "RUNNING"
                vm["lastStartTimestamp"] = stamp(now)
                del self._boot_at[key]
        for key, op in self.operations.items():
            if op["status"] == "DONE" or now < self._done_at[key]:
                continue
            op.update({"status": "DONE", "progress": 100, "endTime": stamp(now)})
            failure = self._op_errors.pop(key, None)
            if failure is not None:
                error, http_status = failure
                op["error"] = error
                op["httpErrorStatusCode"] = http_status
                op["httpErrorMessage"] = {403: "FORBIDDEN", 412: "PRECONDITION FAILED", 503: "SERVICE UNAVAILABLE"}.get(
                    http_status, ""
                )
            if op["operationType"] == "delete":
                zone = key[0]
                self.instances.pop((zone, op["targetLink"].rsplit("/", 1)[-1]), None)

    def _take_drop(self, call: str) -> bool:
        if self.drops.get(call, 0) > 0:
            self.drops[call] -= 1
            return True
        return False

    def _take_fault(self, call: str) -> Fault | None:
        for fault in self.faults:
            if fault.call == call and fault.count > 0:
                fault.count -= 1
                return fault
        return None

    # -------------------------------------------------------------------------------------------- handlers

    def handle(
        self, method: str, path: str, query: dict[str, list[str]], body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        headers = headers or {}
        with self._lock:
            self.requests.append(Recorded(method, path, query, body, headers))
            self._advance()
            if path == "/token" and method == "POST":
                self.tokens_issued += 1
                return 200, {
                    "access_token": f"ya29.fake-{self.tokens_issued}",
                    "expires_in": 3599,
                    "token_type": "Bearer",
                }
            m = _ROUTE.match(path)
            if m is None or m.group("project") != self.project:
                return 404, error_body(404, "notFound", f"The resource '{path}' was not found")
            zone, instance, op, wait = m.group("zone"), m.group("instance"), m.group("op"), m.group("wait")
            if zone is None:
                return self._aggregated(query) if method == "GET" else (405, error_body(405, "badRequest", method))
            if "/operations" in path:
                if op is None:
                    return self._list_operations(zone, query)
                return self._operation(zone, op, bool(wait))
            if method == "POST" and instance is None:
                return self._insert(zone, query, body, headers.get(FAULT_HEADER.lower(), ""))
            if method == "GET" and instance is not None:
                return self._get(zone, instance)
            if method == "DELETE" and instance is not None:
                return self._delete(zone, instance, query)
            return 405, error_body(405, "badRequest", f"{method} {path}")

    def _fault_response(self, call: str) -> tuple[int, Any] | None:
        fault = self._take_fault(call)
        return None if fault is None else (fault.status, error_body(fault.status, fault.reason, fault.message))

    def _insert(self, zone: str, query: dict[str, list[str]], body: Any, stockout: str = "") -> tuple[int, Any]:
        refused = self._fault_response("insert")
        if refused is not None:
            return refused
        rid = query.get("requestId", [""])[0]
        if rid and rid in self._request_ids:
            self.replayed += 1
            return (-1 if self._take_drop("insert") else 200), self.operations[self._request_ids[rid]]
        name = str(body.get("name", ""))
        if not _NAME.match(name):
            msg = f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'"  # noqa: E501
            return 400, error_body(400, "invalid", msg)
        for key, value in (body.get("labels") or {}).items():
            if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                return 400, error_body(400, "invalid", f"Invalid value for field 'resource.labels': '{key}'")
        for item in (body.get("metadata") or {}).get("items", []):
            if not re.fullmatch(r"[a-zA-Z0-9_-]{1,128}", item.get("key", "")):
                return 400, error_body(400, "invalid", f"Invalid value for field 'resource.metadata': '{item}'")
        machine = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        if body.get("guestAccelerators") and not machine.startswith("n1-"):
            msg = f"[{machine}] features are not compatible for creating instance with guest accelerators."
            return 400, error_body(400, "invalid", msg)
        if (zone, name) in self.instances:
            msg = f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists"
            return 409, error_body(409, "alreadyExists", msg)
        now = time.time()
        vm = self._new_instance(zone, body, now)
        failure = self._operation_failure(zone, stockout)
        if failure is None:
            self.instances[(zone, name)] = vm
            self._boot_at[(zone, name)] = now + self.boot_seconds
            self._inserted_at[(zone, name)] = now
            self.created[name] += 1
            op = self._new_operation(zone, "insert", vm, now)
        else:  # no VM: the operation runs, then ends with the error
            op = self._new_operation(zone, "insert", vm, now)
            self._op_errors[(zone, op["name"])] = failure
        if rid:
            self._request_ids[rid] = (zone, op["name"])
        self._advance()
        return (-1 if self._take_drop("insert") else 200), op

    def _operation_failure(self, zone: str, stockout: str) -> tuple[dict[str, Any], int] | None:
        """(error, HTTP status) an insert operation ends with: the stockout the header asked for, else the next
        armed `fail_operation` fault, else None (the insert succeeds)."""
        if stockout:
            return operation_error(stockout, self.project, zone), 503
        for failing in self.op_faults:
            if failing.count > 0:
                failing.count -= 1
                return {"errors": [{"code": failing.code, "message": failing.message}]}, failing.http_status
        return None

    def _get(self, zone: str, name: str) -> tuple[int, Any]:
        fault = self._fault_response("get")
        if fault is not None:
            return fault
        vm = self.instances.get((zone, name))
        if vm is None:
            msg = f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found"
            return 404, error_body(404, "notFound", msg)
        return 200, vm

    def _delete(self, zone: str, name: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        fault = self._fault_response("delete")
        if fault is not None:
            return fault
        rid = query.get("requestId", [""])[0]
        if rid and rid in self._request_ids and self._request_ids[rid] in self.operations:
            return 200, self.operations[self._request_ids[rid]]
        vm = self.instances.get((zone, name))
        if vm is None:
            msg = f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found"
            return 404, error_body(404, "notFound", msg)
        vm["status"] = "STOPPING"
        op = self._new_operation(zone, "delete", vm, time.time())
        if rid:
            self._request_ids[rid] = (zone, op["name"])
        self._advance()
        return 200, op

    def _aggregated(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        fault = self._fault_response("list")
        if fault is not None:
            return fault
        text = query.get("filter", [""])[0]
        clauses = parse_filter(text)
        if clauses is None:
            return 400, error_body(400, "invalid", f"Invalid value for field 'filter': '{query.get('filter')}'")
        try:
            size = int(query.get("maxResults", [str(self.page_size)])[0])
        except ValueError:
            size = -1
        if not 0 <= size <= 500:
            return 400, error_body(400, "invalid", f"Invalid value for field 'maxResults': '{query.get('maxResults')}'")
        size = size or 500
        token = query.get("pageToken", [""])[0]
        start = 0
        if token:
            offset, _, filtered = token.partition(":")
            if not offset.isdigit() or filtered != str(zlib.crc32(text.encode())):
                return 400, error_body(400, "invalid", f"Invalid value for field 'pageToken': '{token}'")
            start = int(offset)
        now = time.time()
        listed = [
            (zone, vm)
            for (zone, name), vm in sorted(self.instances.items())
            if matches(vm, clauses)
            and now - self._inserted_at.get((zone, name), 0.0) >= self.list_lag
            and zone not in self.unreachable
        ]
        page = listed[start : start + size]
        items: dict[str, Any] = {}
        for zone in sorted(set(self.zones) | {z for z, _ in self.instances}):
            found = [vm for z, vm in page if z == zone]
            scope = f"zones/{zone}"
            if zone in self.unreachable:
                message = f"Scope '{scope}' is unreachable."
                items[scope] = {
                    "warning": {"code": "UNREACHABLE", "message": message, "data": [{"key": "scope", "value": scope}]}
                }
            elif found:
                items[scope] = {"instances": found}
            else:
                message = f"There are no results for scope '{scope}' on this page."
                warning = {"code": "NO_RESULTS_ON_PAGE", "message": message, "data": [{"key": "scope", "value": scope}]}
                items[scope] = {"warning": warning}
        body: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{self.project}/aggregated/instances",
            "items": items,
            "selfLink": f"{BASE}/projects/{self.project}/aggregated/instances",
        }
        if start + size < len(listed):
            body["nextPageToken"] = f"{start + size}:{zlib.crc32(text.encode())}"
        return 200, body

    def _list_operations(self, zone: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        fault = self._fault_response("operations")
        if fault is not None:
            return fault
        clauses = parse_filter(query.get("filter", [""])[0])
        if clauses is None:
            return 400, error_body(400, "invalid", f"Invalid value for field 'filter': '{query.get('filter')}'")
        found = [op for (z, _), op in self.operations.items() if z == zone and matches(op, clauses)]
        zone_url = f"{BASE}/projects/{self.project}/zones/{zone}"
        return 200, {"kind": "compute#operationList", "id": f"{zone_url}/operations", "items": found}

    def _operation(self, zone: str, name: str, wait: bool) -> tuple[int, Any]:
        key = (zone, name)
        if key not in self.operations:
            msg = f"The resource 'projects/{self.project}/zones/{zone}/operations/{name}' was not found"
            return 404, error_body(404, "notFound", msg)
        if wait:
            deadline = time.monotonic() + 2.0
            while self.operations[key]["status"] != "DONE" and time.monotonic() < deadline:
                self._lock.release()
                try:
                    time.sleep(0.005)
                finally:
                    self._lock.acquire()
                self._advance()
        return 200, self.operations[key]


class _Handler(BaseHTTPRequestHandler):
    owner: GcpComputeFake
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
        status, payload = self.owner.handle(method, parts.path, query, body, headers)
        if status < 0:  # done, but the client never hears back
            self.close_connection = True
            return
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        pass
