"""A local instance-metadata endpoint that answers AWS's, GCP's and Azure's documented paths on one port, and can
issue each provider's interruption notice mid-run. Point the agent at it with `OVERSPILL_METADATA_URL=server.url`.

AWS (IMDSv2 only, as hardened instances run it): `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
(1-21600) returns a session token; every `GET /latest/...` needs it in `X-aws-ec2-metadata-token` (401 otherwise) and
is refused with a `X-Forwarded-For` header. `spot/instance-action` is 404 until `issue_aws_interruption()`, then
`{"action": "terminate", "time": "<UTC, 2 min ahead>"}`; `events/recommendations/rebalance` is 404 until
`issue_aws_rebalance()`, then `{"noticeTime": ...}`. `iam/security-credentials/` names a role whose credentials are
`aws_credentials` (with `Token` and `Expiration`); `placement/region` is `region`.

GCP: `/computeMetadata/v1/...` needs `Metadata-Flavor: Google` (403 otherwise) and answers with that header.
`instance/preempted` is `FALSE` until `issue_gcp_preemption()`, then `TRUE`, with an `ETag`; with
`wait_for_change=true` and `last_etag` equal to the current ETag it holds the request until the value changes or
`timeout_sec` passes. `instance/service-accounts/default/token` gives `{"access_token", "expires_in", "token_type"}`;
`project/project-id` the project.

Azure: `/metadata/...` needs `Metadata: true` (400 otherwise). `GET /metadata/scheduledevents` returns
`{"DocumentIncarnation", "Events": [...]}`; `issue_azure_preempt()` adds a `Preempt` event (`EventStatus:
Scheduled`, `NotBefore` in RFC 1123 form, `Resources: [vm_name]`); `POST` with `{"StartRequests": [{"EventId"}]}`
acknowledges (recorded in `acknowledged`). `/metadata/identity/oauth2/token?resource=R` gives a JWT for audience R
(unsigned: Azurite's `--oauth basic` checks its lifetime, issuer and audience, not its signature);
`/metadata/instance/compute/name?format=text` the VM name.

`issued_at[kind]` records when each notice was issued (time.time()), `hits[path]` counts requests.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.local_server import LocalServer

AWS_ROLE = "overspill-agent-role"
AZURE_TENANT = "72f988bf-0000-4000-8000-2d7cd011db47"


def fake_jwt(audience: str, *, tenant: str = AZURE_TENANT, lifetime: int = 3600) -> str:
    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {
        "aud": audience.rstrip("/"),
        "iss": f"https://sts.windows.net/{tenant}/",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + lifetime,
        "tid": tenant,
        "oid": str(uuid.uuid4()),
    }
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MetadataServer(LocalServer):
    def __init__(
        self,
        *,
        aws_credentials: tuple[str, str, str | None] = ("testing", "testing", "testing-session-token"),
        region: str = "us-east-1",
        gcp_project: str = "overspill-test",
        gcp_token: str = "ya29.test-gcp-access-token",
        azure_vm_name: str = "ovs-vm-1",
    ) -> None:
        self.aws_credentials = aws_credentials
        self.region = region
        self.gcp_project = gcp_project
        self.gcp_token = gcp_token
        self.azure_vm_name = azure_vm_name
        self.lock = threading.Condition()
        self.hits: Counter[str] = Counter()
        self.imds_tokens: set[str] = set()
        self.azure_tokens: dict[str, str] = {}  # resource -> the last token handed out
        self.issued_at: dict[str, float] = {}
        self.reset()
        self._serve(_Handler)

    def reset(self) -> None:
        with self.lock:
            self.aws_action: dict[str, str] | None = None
            self.aws_rebalance: dict[str, str] | None = None
            self.gcp_preempted = False
            self.gcp_etag = uuid.uuid4().hex[:16]
            self.azure_events: list[dict[str, Any]] = []
            self.azure_incarnation = 1
            self.acknowledged: list[str] = []
            self.issued_at.clear()
            self.lock.notify_all()

    # ------------------------------------------------------------------------------------------- issue notices

    def issue_aws_interruption(self, action: str = "terminate", in_seconds: int = 120) -> None:
        with self.lock:
            self.aws_action = {"action": action, "time": _iso(datetime.now(UTC) + timedelta(seconds=in_seconds))}
            self.issued_at["aws"] = time.time()

    def issue_aws_rebalance(self) -> None:
        with self.lock:
            self.aws_rebalance = {"noticeTime": _iso(datetime.now(UTC))}
            self.issued_at["aws-rebalance"] = time.time()

    def issue_gcp_preemption(self) -> None:
        with self.lock:
            self.gcp_preempted = True
            self.gcp_etag = uuid.uuid4().hex[:16]
            self.issued_at["gcp"] = time.time()
            self.lock.notify_all()

    def issue_azure_preempt(self, not_before_seconds: int = 30, resources: list[str] | None = None) -> str:
        event_id = str(uuid.uuid4()).upper()
        with self.lock:
            self.azure_events.append(
                {
                    "EventId": event_id,
                    "EventStatus": "Scheduled",
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": resources if resources is not None else [self.azure_vm_name],
                    "NotBefore": format_datetime(
                        datetime.now(UTC) + timedelta(seconds=not_before_seconds), usegmt=True
                    ),
                    "Description": "Virtual machine is being preempted.",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
            self.azure_incarnation += 1
            self.issued_at["azure"] = time.time()
        return event_id


class _Handler(BaseHTTPRequestHandler):
    owner: MetadataServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes | str = b"", headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(doc), {"Content-Type": "application/json", **(headers or {})})

    def do_PUT(self) -> None:
        path = urlsplit(self.path).path
        self.owner.hits[f"PUT {path}"] += 1
        if path != "/latest/api/token":
            return self._send(404)
        if self.headers.get("X-Forwarded-For"):
            return self._send(403)
        try:
            ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
        except ValueError:
            return self._send(400)
        if not 1 <= ttl <= 21600:
            return self._send(400)
        token = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()
        self.owner.imds_tokens.add(token)
        self._send(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        self.owner.hits[f"GET {parts.path}"] += 1
        if parts.path.startswith("/latest/"):
            return self._aws(parts.path)
        if parts.path.startswith("/computeMetadata/v1/"):
            return self._gcp(parts.path.removeprefix("/computeMetadata/v1/"), parse_qs(parts.query))
        if parts.path.startswith("/metadata/"):
            return self._azure_get(parts.path, parse_qs(parts.query))
        self._send(404)

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        self.owner.hits[f"POST {parts.path}"] += 1
        if parts.path != "/metadata/scheduledevents" or self.headers.get("Metadata") != "true":
            return self._send(400)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            ids = [str(r["EventId"]) for r in json.loads(body)["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return self._send(400)
        with self.owner.lock:
            self.owner.acknowledged += ids
        self._send(200)

    # --------------------------------------------------------------------------------------------------- AWS

    def _aws(self, path: str) -> None:
        owner = self.owner
        if self.headers.get("X-Forwarded-For"):
            return self._send(403)
        if self.headers.get("X-aws-ec2-metadata-token") not in owner.imds_tokens:
            return self._send(401)
        with owner.lock:
            action, rebalance = owner.aws_action, owner.aws_rebalance
        if path == "/latest/meta-data/spot/instance-action":
            return self._json(200, action) if action else self._send(404)
        if path == "/latest/meta-data/events/recommendations/rebalance":
            return self._json(200, rebalance) if rebalance else self._send(404)
        if path == "/latest/meta-data/iam/security-credentials/":
            return self._send(200, AWS_ROLE)
        if path == f"/latest/meta-data/iam/security-credentials/{AWS_ROLE}":
            key, secret, token = owner.aws_credentials
            now = datetime.now(UTC)
            doc = {
                "Code": "Success",
                "LastUpdated": _iso(now),
                "Type": "AWS-HMAC",
                "AccessKeyId": key,
                "SecretAccessKey": secret,
                "Token": token,
                "Expiration": _iso(now + timedelta(hours=6)),
            }
            return self._json(200, doc)
        if path == "/latest/meta-data/placement/region":
            return self._send(200, owner.region)
        self._send(404)

    # --------------------------------------------------------------------------------------------------- GCP

    def _gcp(self, path: str, query: dict[str, list[str]]) -> None:
        owner = self.owner
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403)
        flavor = {"Metadata-Flavor": "Google"}
        if path == "instance/preempted":
            timeout = float(query.get("timeout_sec", ["300"])[0])
            with owner.lock:
                if query.get("wait_for_change", [""])[0] == "true":
                    last = query.get("last_etag", [""])[0]
                    end = time.monotonic() + timeout
                    while owner.gcp_etag == last and time.monotonic() < end:
                        owner.lock.wait(min(1.0, end - time.monotonic()))
                value, etag = ("TRUE" if owner.gcp_preempted else "FALSE"), owner.gcp_etag
            return self._send(200, value, {**flavor, "ETag": etag, "Content-Type": "application/text"})
        if path == "instance/service-accounts/default/token":
            return self._json(
                200, {"access_token": owner.gcp_token, "expires_in": 3599, "token_type": "Bearer"}, flavor
            )
        if path == "project/project-id":
            return self._send(200, owner.gcp_project, flavor)
        self._send(404, "", flavor)

    # ------------------------------------------------------------------------------------------------- Azure

    def _azure_get(self, path: str, query: dict[str, list[str]]) -> None:
        owner = self.owner
        if self.headers.get("Metadata") != "true" or self.headers.get("X-Forwarded-For"):
            return self._send(400)
        if "api-version" not in query:
            return self._json(400, {"error": "Bad request. api-version was not specified in the request"})
        if path == "/metadata/scheduledevents":
            with owner.lock:
                doc = {"DocumentIncarnation": owner.azure_incarnation, "Events": list(owner.azure_events)}
            return self._json(200, doc)
        if path == "/metadata/identity/oauth2/token":
            resource = query.get("resource", [""])[0]
            if not resource:
                return self._json(400, {"error": "invalid_request", "error_description": "resource is required"})
            token = fake_jwt(resource)
            owner.azure_tokens[resource] = token
            now = int(time.time())
            doc = {
                "access_token": token,
                "client_id": "00000000-1111-2222-3333-444444444444",
                "expires_in": "3599",
                "expires_on": str(now + 3599),
                "ext_expires_in": "3599",
                "not_before": str(now - 60),
                "resource": resource,
                "token_type": "Bearer",
            }
            return self._json(200, doc)
        if path == "/metadata/instance/compute/name":
            return self._send(200, owner.azure_vm_name, {"Content-Type": "text/plain"})
        self._send(404)
