"""Stand-ins for the cloud APIs the agent calls that have no local emulator: GCP Secret Manager, Azure Key Vault and
ACR's AAD token exchange, answering their documented request and response shapes on one 127.0.0.1 port.

- Secret Manager `GET /v1/projects/{p}/secrets/{s}/versions/{v}:access` with `Authorization: Bearer <the metadata
  server's GCP token>` -> `{"name", "payload": {"data": base64, "dataCrc32c": "<int64 as a string>"}}` (CRC32C from
  google-crc32c, independent of the agent's own); an unknown secret -> 404 `NOT_FOUND`; another token -> 401.
- Key Vault `GET /secrets/{name}[/{version}]?api-version=7.4` with a bearer JWT whose audience is
  https://vault.azure.net -> `{"value", "id", "attributes"}`; no token -> 401 with a `WWW-Authenticate` challenge;
  unknown -> 404 `SecretNotFound`.
- ACR `POST /oauth2/exchange` (form: `grant_type=access_token`, `service`, `access_token` = a JWT for ARM, optional
  `tenant`) -> `{"refresh_token"}`; anything else -> 401 in ACR's `{"errors": [...]}` shape.
`requests` records (method, path, authorization header) of every call.
"""

from __future__ import annotations

import base64
import json
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import google_crc32c

from tests.local_server import LocalServer
from tests.metadata_server import MetadataServer


def _claims(token: str) -> dict[str, Any]:
    try:
        payload = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}


class CloudStandIns(LocalServer):
    def __init__(self, metadata: MetadataServer) -> None:
        self.metadata = metadata
        self.gcp_secrets: dict[str, bytes] = {}  # "projects/p/secrets/s" -> latest value
        self.vault_secrets: dict[str, str] = {}  # name -> value
        self.requests: list[tuple[str, str, str]] = []
        self.acr_refresh_tokens: list[str] = []
        self._serve(_Handler)


class _Handler(BaseHTTPRequestHandler):
    owner: CloudStandIns
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        auth = self.headers.get("Authorization", "")
        self.owner.requests.append(("GET", parts.path, auth))
        if parts.path.startswith("/v1/projects/") and parts.path.endswith(":access"):
            return self._secret_manager(unquote(parts.path[len("/v1/") : -len(":access")]), auth)
        if parts.path.startswith("/secrets/"):
            return self._key_vault(parts.path, parse_qs(parts.query), auth)
        self._json(404, {"error": "not found"})

    def _secret_manager(self, name: str, auth: str) -> None:
        if auth != f"Bearer {self.owner.metadata.gcp_token}":
            return self._json(401, {"error": {"code": 401, "message": "Request had invalid authentication credentials.",
                                              "status": "UNAUTHENTICATED"}})  # fmt: skip
        secret, _, version = name.partition("/versions/")
        value = self.owner.gcp_secrets.get(secret)
        if value is None or version not in ("latest", "1"):
            message = f"Secret [{secret}] not found or has no versions."
            return self._json(404, {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}})
        doc = {
            "name": f"{secret}/versions/1",
            "payload": {"data": base64.b64encode(value).decode(), "dataCrc32c": str(google_crc32c.value(value))},
        }
        self._json(200, doc)

    def _key_vault(self, path: str, query: dict[str, list[str]], auth: str) -> None:
        if query.get("api-version") != ["7.4"]:
            return self._json(400, {"error": {"code": "BadParameter", "message": "api-version is missing or wrong"}})
        token = auth.removeprefix("Bearer ")
        if not auth.startswith("Bearer ") or _claims(token).get("aud") != "https://vault.azure.net":
            challenge = 'Bearer authorization="https://login.microsoftonline.com/t", resource="https://vault.azure.net"'
            return self._json(401, {"error": {"code": "Unauthorized", "message": "AKV10000: Request is missing a "
                                              "Bearer or PoP token."}}, {"WWW-Authenticate": challenge})  # fmt: skip
        name = path.split("/")[2]
        if name not in self.owner.vault_secrets:
            return self._json(404, {"error": {"code": "SecretNotFound", "message": f"A secret with (name/id) {name} "
                                              "was not found in this key vault."}})  # fmt: skip
        doc = {
            "value": self.owner.vault_secrets[name],
            "id": f"https://overspill-kv.vault.azure.net/secrets/{name}/{uuid.uuid4().hex}",
            "attributes": {
                "enabled": True,
                "created": 1700000000,
                "updated": 1700000000,
                "recoveryLevel": "Recoverable",
            },
        }
        self._json(200, doc)

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        self.owner.requests.append(("POST", parts.path, ""))
        form = {k: v[0] for k, v in parse_qs(body).items()}
        unauthorized = {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}
        if parts.path != "/oauth2/exchange" or form.get("grant_type") != "access_token" or not form.get("service"):
            return self._json(401, unauthorized)
        claims = _claims(form.get("access_token", ""))
        tenant = claims.get("tid")
        if claims.get("aud") != "https://management.azure.com" or form.get("tenant", tenant) != tenant:
            return self._json(401, unauthorized)
        refresh = f"acr-refresh-{uuid.uuid4().hex}"
        self.owner.acr_refresh_tokens.append(refresh)
        self._json(200, {"refresh_token": refresh})
