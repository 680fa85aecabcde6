"""A fault-injecting HTTP proxy in front of a cloud API stand-in: the cloud answers capacity errors, throttling, 5xx
and timeouts at a set rate, in the shapes and places the real cloud uses.

One proxy, one seeded decision per request, three dialects (what a request is, and how each cloud says "no"):
- `Ec2Dialect` (in front of a moto server; the default, unchanged from the AWS-only proxy): EC2 Query API requests
  (`Action=...` in a form body, as botocore sends them, or in the query string, as libcloud's EC2 driver does).
  `capacity` (RunInstances and CreateFleet only): HTTP 500 `InsufficientInstanceCapacity` in EC2's XML error envelope
  (what EC2 really sends, and what botocore would retry if left to itself); `throttle`: 503 `RequestLimitExceeded`;
  `server`: 500 `InternalError` or 503 `Unavailable`. Requests of other services (SQS's JSON protocol, S3...) pass
  through untouched. moto ignores RunInstances' `ClientToken`; real EC2 returns the first call's result for a repeated
  token, so the proxy does (it remembers each token's successful answer, and a repeat that arrives while the first call
  is still in flight waits for it).
- `GceDialect` (in front of tests/gcp_compute_fake.py): Compute Engine instance and zone-operation calls. `capacity`
  (instances.insert only) is forwarded with the header `X-Fake-Fault: ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]`:
  Google accepts the insert and its operation ends DONE with that error code and HTTP status 503, which is where
  and how Google reports a stockout (the fake writes it). `throttle`: 429 `rateLimitExceeded` with the
  RATE_LIMIT_EXCEEDED ErrorInfo, as the API sends it; `server`: 500 INTERNAL or 503 UNAVAILABLE `backendError`.
- `ArmDialect` (in front of tests/azure_compute_fake.py): ARM virtual-machine calls and the long-running operations'
  status polls. `capacity` (the VM PUT only) is either a synchronous 409 `SkuNotAvailable` (ARM refuses the PUT
  before creating anything) or the PUT forwarded with `X-Fake-Fault: AllocationFailed` (`ZonalAllocationFailed` for
  a zonal VM): the PUT is accepted and the operation ends Failed with that code, which is where Azure reports an
  allocation failure. `throttle`: 429 with `Retry-After` (1, 5 or 30 s) and either the Compute resource provider's
  body (`OperationNotAllowed` with a `TooManyRequests` detail naming the operation group) or ARM's
  `SubscriptionRequestsThrottled`; `server`: 500 `InternalExecutionError` or 504 `GatewayTimeout`. ARM's absolute
  `Azure-AsyncOperation` / `Location` URLs (and a JSON page's `nextLink`) are rewritten to point at the proxy, so
  status polls and later pages meet faults too.
Every dialect: `timeout` holds the connection for `hold_seconds` (longer than the client's read timeout) and closes
it unanswered; half of the timeouts are "lost responses": the request IS forwarded first, so a launch may have
happened that its caller never hears about. A capacity fault is only drawn for a launch whose idempotency key
(GCE requestId, ARM VM name) never reached the cloud before: a retry of a launch the cloud already carried out is
answered from that first launch (the original operation, or an update of the same VM), never with a new stockout.
Requests the dialect does not know pass through untouched, to `routes`' upstream when a route matches the path (the
GCP price feed's SKU and machine-type calls share the endpoint override with the instance calls).

`stats` counts requests per action, faults per kind and action, launch attempts per idempotency key with their times
(to see backoff between retries) and retried launches answered idempotently (`replayed_tokens`).
"""

from __future__ import annotations

import http.client
import json
import random
import re
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from tests.local_server import QuietHTTPServer
from tests.moto_server import free_port

LAUNCH_ACTIONS = frozenset({"RunInstances", "CreateFleet"})
KINDS = ("capacity", "throttle", "server", "timeout")
FAULT_HEADER = "X-Fake-Fault"

Answer = tuple[int, list[tuple[str, str]], bytes]


@dataclass(frozen=True)
class Call:
    """One request as a dialect sees it: the API action, whether it launches, and the launch's idempotency key."""

    action: str
    launch: bool = False
    token: str = ""


@dataclass(frozen=True)
class Capacity:
    """How a dialect injects a capacity error: an answer sent instead of forwarding, or headers to forward with."""

    answer: Answer | None = None
    forward_headers: tuple[tuple[str, str], ...] = ()


class Dialect(Protocol):
    name: str
    launch_action: str
    replays_tokens: bool  # the proxy itself answers a repeated launch token from the first success (EC2 on moto)
    capacity_on_repeat: bool  # a capacity fault may hit a launch whose token already reached the cloud

    def classify(self, method: str, path: str, body: bytes) -> Call | None: ...

    def capacity(self, rng: random.Random, call: Call, path: str, body: bytes) -> Capacity: ...

    def throttle(self, rng: random.Random, call: Call) -> Answer: ...

    def server_error(self, rng: random.Random, call: Call) -> Answer: ...


@dataclass
class FaultStats:
    requests: Counter[str] = field(default_factory=Counter)
    faults: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, action)
    launch_attempts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # token -> times
    replayed_tokens: int = 0
    forwarded_tokens: set[str] = field(default_factory=set)  # launch keys that reached the cloud at least once

    def faults_of(self, kind: str, action: str | None = None) -> int:
        return sum(n for (k, a), n in self.faults.items() if k == kind and (action is None or a == action))


# -- EC2 --------------------------------------------------------------------------------------------------------------


def _ec2_error(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


class Ec2Dialect:
    name = "ec2"
    launch_action = "RunInstances"
    replays_tokens = True
    capacity_on_repeat = True

    def classify(self, method: str, path: str, body: bytes) -> Call | None:
        # botocore POSTs a form; libcloud's EC2 driver sends the same parameters in a GET's query string
        form = parse_qs(body.decode("utf-8", "replace")) if b"Action=" in body else parse_qs(urlsplit(path).query)
        action = (form.get("Action") or [""])[0]
        if not action:
            return None
        token = (form.get("ClientToken") or [""])[0] if action == "RunInstances" else ""
        return Call(action, action in LAUNCH_ACTIONS, token)

    def capacity(self, rng: random.Random, call: Call, path: str, body: bytes) -> Capacity:
        message = "We currently do not have sufficient capacity in the Availability Zone you requested."
        return Capacity(
            answer=(500, [("Content-Type", "text/xml")], _ec2_error("InsufficientInstanceCapacity", message))
        )

    def throttle(self, rng: random.Random, call: Call) -> Answer:
        return 503, [("Content-Type", "text/xml")], _ec2_error("RequestLimitExceeded", "Request limit exceeded.")

    def server_error(self, rng: random.Random, call: Call) -> Answer:
        code, status = rng.choice([("InternalError", 500), ("Unavailable", 503)])
        return status, [("Content-Type", "text/xml")], _ec2_error(code, "An internal error has occurred")


# -- Compute Engine ---------------------------------------------------------------------------------------------------

_GCE = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/(?:(?P<aggregated>aggregated/instances)|"
    r"zones/(?P<zone>[^/]+)/(?:(?P<instances>instances)(?:/(?P<instance>[^/]+))?|"
    r"(?P<operations>operations)(?:/(?P<op>[^/]+)(?P<wait>/wait)?)?))$"
)
_JSON = [("Content-Type", "application/json; charset=UTF-8")]


def _json(status: int, body: dict[str, Any], headers: list[tuple[str, str]] | None = None) -> Answer:
    return status, [*_JSON, *(headers or [])], json.dumps(body).encode()


class GceDialect:
    name = "gce"
    launch_action = "instances.insert"
    replays_tokens = False
    capacity_on_repeat = False

    def classify(self, method: str, path: str, body: bytes) -> Call | None:
        parts = urlsplit(path)
        m = _GCE.match(parts.path)
        if m is None:
            return None
        if m.group("aggregated"):
            return Call("instances.aggregatedList")
        if m.group("operations"):
            if m.group("op") is None:
                return Call("zoneOperations.list")
            return Call("zoneOperations.wait" if m.group("wait") else "zoneOperations.get")
        if m.group("instance") is None:
            if method != "POST":
                return Call("instances.list")
            request_id = (parse_qs(parts.query).get("requestId") or [""])[0]
            return Call("instances.insert", True, request_id)
        return Call({"GET": "instances.get", "DELETE": "instances.delete"}.get(method, f"instances.{method}"))

    def capacity(self, rng: random.Random, call: Call, path: str, body: bytes) -> Capacity:
        code = rng.choice(("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"))
        return Capacity(forward_headers=((FAULT_HEADER, code),))

    def throttle(self, rng: random.Random, call: Call) -> Answer:
        message = (
            "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
            "'compute.googleapis.com' for consumer 'project_number:123456789012'."
        )
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {
                "service": "compute.googleapis.com",
                "quota_metric": "compute.googleapis.com/default",
                "quota_limit": "defaultPerMinutePerProject",
                "consumer": "projects/123456789012",
            },
        }
        error = {
            "code": 429,
            "message": message,
            "errors": [{"message": message, "domain": "usageLimits", "reason": "rateLimitExceeded"}],
            "status": "RESOURCE_EXHAUSTED",
            "details": [info],
        }
        return _json(429, {"error": error})

    def server_error(self, rng: random.Random, call: Call) -> Answer:
        status, text, message = rng.choice(
            [
                (
                    500,
                    "INTERNAL",
                    f"Internal error. Please try again or contact Google Support. (Code: '{uuid.uuid4().hex[:16]}')",
                ),
                (503, "UNAVAILABLE", "The service is currently unavailable."),
            ]
        )
        error = {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": "backendError"}],
            "status": text,
        }
        return _json(status, {"error": error})


# -- Azure Resource Manager -------------------------------------------------------------------------------------------

_ARM_VM = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/virtualMachines"
    r"(?:/(?P<name>[^/]+)(?P<iv>/instanceView)?)?$",
    re.IGNORECASE,
)
_ARM_OP = re.compile(
    r"^/subscriptions/[^/]+/providers/Microsoft\.Compute/locations/[^/]+/operations/[^/]+$", re.IGNORECASE
)
_ARM_VM_ALL = re.compile(r"^/subscriptions/[^/]+/providers/Microsoft\.Compute/virtualMachines$", re.IGNORECASE)
_OPERATION_GROUP = {
    "virtualMachines.createOrUpdate": "PutVM3Min",
    "virtualMachines.delete": "DeleteVM3Min",
    "virtualMachines.list": "HighCostGet3Min",
    "virtualMachines.listAll": "HighCostGet3Min",
}


class ArmDialect:
    name = "arm"
    launch_action = "virtualMachines.createOrUpdate"
    replays_tokens = False
    capacity_on_repeat = False

    def classify(self, method: str, path: str, body: bytes) -> Call | None:
        parts = urlsplit(path)
        if _ARM_OP.match(parts.path):
            return Call("operations.get")
        if _ARM_VM_ALL.match(parts.path):  # the subscription's VMs (statusOnly: the power states of a sync batch)
            return Call("virtualMachines.listAll")
        m = _ARM_VM.match(parts.path)
        if m is None:
            return None
        name = m.group("name")
        if name is None:
            return Call("virtualMachines.list")
        if m.group("iv"):
            return Call("virtualMachines.instanceView")
        if method == "PUT":
            return Call("virtualMachines.createOrUpdate", True, name.lower())
        return Call({"GET": "virtualMachines.get", "DELETE": "virtualMachines.delete"}.get(method, method))

    def capacity(self, rng: random.Random, call: Call, path: str, body: bytes) -> Capacity:
        try:
            vm = json.loads(body)
        except ValueError:
            vm = {}
        zonal = bool(vm.get("zones"))
        if rng.random() < 1 / 3:  # ARM refuses the size up front: nothing is created
            resource = urlsplit(path).path
            zones = ",".join(vm.get("zones") or [])
            message = (
                f"The requested size for resource '{resource}' is currently not available in location "
                f"'{vm.get('location', '')}' zones '{zones}' for subscription '{resource.split('/')[2]}'. Please try "
                "another size or deploy to a different location or zones. See https://aka.ms/azureskunotavailable "
                "for details."
            )
            return Capacity(answer=_json(409, {"error": {"code": "SkuNotAvailable", "message": message}}))
        code = "ZonalAllocationFailed" if zonal else "AllocationFailed"
        return Capacity(forward_headers=((FAULT_HEADER, code),))

    def throttle(self, rng: random.Random, call: Call) -> Answer:
        retry_after = rng.choice(("1", "5", "30"))
        if rng.random() < 0.5:  # the Compute resource provider's own limits
            group = _OPERATION_GROUP.get(call.action, "LowCostGet3Min")
            window = {
                "operationGroup": group,
                "startTime": "2026-11-02T08:00:00.0000000+00:00",
                "endTime": "2026-11-02T08:03:00+00:00",
                "allowedRequestCount": 300,
                "measuredRequestCount": 317,
            }
            body = {
                "error": {
                    "code": "OperationNotAllowed",
                    "message": "The server rejected the request because too many requests have been received for "
                    "this subscription.",
                    "details": [{"code": "TooManyRequests", "target": group, "message": json.dumps(window)}],
                }
            }
            headers = [
                ("Retry-After", retry_after),
                ("x-ms-ratelimit-remaining-resource", f"Microsoft.Compute/{group};0"),
            ]
            return _json(429, body, headers)
        kind = "write" if call.action in ("virtualMachines.createOrUpdate", "virtualMachines.delete") else "read"
        message = (
            f"Number of '{kind}' requests for subscription '00000000-0000-0000-0000-000000000001' actor "
            f"'5c1e2ab9-4f1c-4fb4-9b26-0f0a7d0c1b8e' exceeded. Please try again after '{retry_after}' seconds after "
            "additional tasks are completed."
        )
        return _json(
            429,
            {"error": {"code": "SubscriptionRequestsThrottled", "message": message}},
            [("Retry-After", retry_after)],
        )

    def server_error(self, rng: random.Random, call: Call) -> Answer:
        status, code, message = rng.choice(
            [
                (500, "InternalExecutionError", "An internal execution error occurred. Please retry later."),
                (
                    504,
                    "GatewayTimeout",
                    "The gateway did not receive a response from 'Microsoft.Compute' within the specified time period.",
                ),
            ]
        )
        return _json(status, {"error": {"code": code, "message": message}})


# -- the proxy --------------------------------------------------------------------------------------------------------


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        *,
        rate: float,
        seed: int = 1,
        hold_seconds: float = 1.5,
        dialect: Dialect | None = None,
        routes: list[tuple[str, str]] | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.routes = [(re.compile(pattern), url.rstrip("/")) for pattern, url in routes or []]
        self.dialect: Dialect = dialect or Ec2Dialect()
        self.rate = rate
        self.hold_seconds = hold_seconds
        self.rng = random.Random(seed)
        self.stats = FaultStats()
        self.lock = threading.Lock()
        self.token_answers: dict[str, Answer] = {}
        self._token_locks: dict[str, threading.Lock] = {}
        self.port = free_port()
        self.server = QuietHTTPServer(("127.0.0.1", self.port), self._handler())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _decide(self, call: Call) -> str | None:
        with self.lock:
            self.stats.requests[call.action] += 1
            if self.rng.random() >= self.rate:
                return None
            capacity_possible = call.launch and (
                self.dialect.capacity_on_repeat or call.token not in self.stats.forwarded_tokens
            )
            kinds = KINDS if capacity_possible else KINDS[1:]
            kind = self.rng.choice(kinds)
            self.stats.faults[(kind, call.action)] += 1
            return kind

    def token_lock(self, token: str) -> threading.Lock:
        """The lock that makes launches with one idempotency token happen one at a time."""
        with self.lock:
            return self._token_locks.setdefault(token, threading.Lock())

    def _upstream_for(self, path: str) -> str:
        for pattern, url in self.routes:
            if pattern.search(urlsplit(path).path):
                return url
        return self.upstream

    def _forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> Answer:
        upstream = self._upstream_for(path)
        parsed = urlsplit(upstream)
        conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=60)
        try:
            keep = {k: v for k, v in headers if k.lower() not in ("host", "connection", "content-length")}
            keep["Content-Length"] = str(len(body))
            conn.request(method, path, body=body, headers=keep)
            resp = conn.getresponse()
            data = resp.read()
            # a reverse proxy's duty: absolute URLs the upstream hands out (ARM's operation monitors in headers,
            # the nextLink of a JSON page) lead back here
            answer_headers = [(k, v.replace(upstream, self.url)) for k, v in resp.getheaders()]
            if "json" in (resp.getheader("Content-Type") or "") and upstream.encode() in data:
                data = data.replace(upstream.encode(), self.url.encode())
            return resp.status, answer_headers, data
        finally:
            conn.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:
                return

            def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                try:
                    self.send_response(status)
                    for k, v in headers:
                        if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client's read timed out first: it retries
                    self.close_connection = True

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = list(self.headers.items())
                call = proxy.dialect.classify(self.command, self.path, body)
                if call is None:  # not a call this dialect faults: pass through
                    self._send(*proxy._forward(self.command, self.path, headers, body))
                    return
                if call.token:
                    with proxy.lock:
                        proxy.stats.launch_attempts[call.token].append(time.monotonic())
                kind = proxy._decide(call)
                if kind == "capacity":
                    with proxy.lock:
                        capacity = proxy.dialect.capacity(proxy.rng, call, self.path, body)
                    if capacity.answer is not None:
                        self._send(*capacity.answer)
                    else:
                        self._answer(call, [*headers, *capacity.forward_headers], body)
                elif kind == "throttle":
                    with proxy.lock:
                        answer = proxy.dialect.throttle(proxy.rng, call)
                    self._send(*answer)
                elif kind == "server":
                    with proxy.lock:
                        answer = proxy.dialect.server_error(proxy.rng, call)
                    self._send(*answer)
                elif kind == "timeout":
                    with proxy.lock:
                        lost_response = proxy.rng.random() < 0.5
                    if lost_response:  # the request reached the cloud; only its answer is lost
                        self.wfile = _Discard()  # type: ignore[assignment]
                        self._answer(call, headers, body)
                    time.sleep(proxy.hold_seconds)
                    self.close_connection = True
                else:
                    self._answer(call, headers, body)

            def _answer(self, call: Call, headers: list[tuple[str, str]], body: bytes) -> None:
                token = call.token
                if token and proxy.dialect.replays_tokens:
                    # EC2 answers a repeated ClientToken with the first call's result, also when the repeat comes
                    # while the first call is still in flight (a client whose read timed out on a slow answer):
                    # calls with one token are carried out one at a time, the later ones from the first's answer
                    with proxy.token_lock(token):
                        with proxy.lock:
                            cached = proxy.token_answers.get(token)
                            if cached is not None:
                                proxy.stats.replayed_tokens += 1
                        if cached is None:
                            answer = proxy._forward(self.command, self.path, headers, body)
                            if answer[0] == 200:
                                with proxy.lock:
                                    proxy.token_answers.setdefault(token, answer)
                    self._send(*(cached or answer))
                    return
                if token and not proxy.dialect.replays_tokens:
                    with proxy.lock:
                        if token in proxy.stats.forwarded_tokens:  # the cloud answers it from the first launch
                            proxy.stats.replayed_tokens += 1
                        proxy.stats.forwarded_tokens.add(token)
                self._send(*proxy._forward(self.command, self.path, headers, body))

            def do_POST(self) -> None:
                self._handle()

            def do_GET(self) -> None:
                self._handle()

            def do_PUT(self) -> None:
                self._handle()

            def do_DELETE(self) -> None:
                self._handle()

            def do_HEAD(self) -> None:
                self._handle()

        return Handler

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Discard:
    """Swallows what a handler writes (the answer whose delivery a timeout fault loses)."""

    closed = False

    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        return

    def close(self) -> None:
        return


@contextmanager
def running_fault_proxy(
    upstream: str,
    *,
    rate: float,
    seed: int = 1,
    hold_seconds: float = 1.5,
    dialect: Dialect | None = None,
    routes: list[tuple[str, str]] | None = None,
) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream, rate=rate, seed=seed, hold_seconds=hold_seconds, dialect=dialect, routes=routes)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
