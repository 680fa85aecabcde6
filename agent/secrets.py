"""Resolve the job's secret references at run time, with the instance's identity, from the cloud's secret service.

- AWS Secrets Manager `GetSecretValue` (SigV4 JSON; the region from the ARN, else the instance's; endpoint
  override `AWS_ENDPOINT_URL_SECRETS_MANAGER` / `AWS_ENDPOINT_URL`).
- GCP Secret Manager `projects/<p>/secrets/<s>[/versions/<v>]:access` (REST, the metadata server's token; default
  version `latest`; the payload's CRC32C is checked; endpoint override `OVERSPILL_GCP_SECRET_MANAGER_ENDPOINT`).
- Azure Key Vault `GET https://<vault>.vault.azure.net/secrets/<name>[/<version>]?api-version=7.4` with a managed
  identity token for https://vault.azure.net. The reference must name a Key Vault host (the token must never be
  sent anywhere else); `OVERSPILL_AZURE_KEYVAULT_ENDPOINT` redirects the request (tests) without relaxing that.

Contract: `resolve()` returns the value (or, with `SecretRef.field`, that key of a JSON secret). Values live only in
memory and in the workload's environment: never logged, stored or reported. A missing secret, a refused access or a
malformed reference raises `SecretError` with `user_fault=True` (the job's configuration: retrying elsewhere will not
help); a service that does not answer raises it with `user_fault=False`. Messages name the reference, never a value.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping
from urllib.parse import quote, urlsplit

from agent import net
from agent.identity import AzureIdentity, Identities, IdentityError
from agent.protocol import SecretRef, SecretSource
from agent.sigv4 import sign

KEY_VAULT_HOST = re.compile(
    r"^[a-z0-9-]{3,24}\.vault\.(azure\.net|azure\.cn|usgovcloudapi\.net|microsoftazure\.de)$", re.IGNORECASE
)
GCP_NAME = re.compile(r"^projects/[^/]+/secrets/[^/]+(/versions/[^/]+)?$")
AWS_ARN_REGION = re.compile(r"^arn:aws[a-z-]*:secretsmanager:(?P<region>[a-z0-9-]+):")


class SecretError(Exception):
    def __init__(self, message: str, *, user_fault: bool) -> None:
        super().__init__(message)
        self.user_fault = user_fault


def resolve(ref: SecretRef, identities: Identities, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    try:
        if ref.source is SecretSource.AWS_SECRETS_MANAGER:
            value = _aws(ref.ref, identities, env)
        elif ref.source is SecretSource.GCP_SECRET_MANAGER:
            value = _gcp(ref.ref, identities, env)
        elif ref.source is SecretSource.AZURE_KEY_VAULT:
            value = _azure(ref.ref, identities, env)
        else:  # pragma: no cover - the enum is closed
            raise SecretError(f"secret {ref.env}: unknown source {ref.source}", user_fault=True)
    except net.HTTPStatusError as exc:
        transient = isinstance(exc, net.TransientHTTP)
        raise SecretError(f"secret {ref.env} ({ref.source} {ref.ref}): {exc}", user_fault=not transient) from None
    except (net.NetError, IdentityError) as exc:
        raise SecretError(f"secret {ref.env} ({ref.source} {ref.ref}): {exc}", user_fault=False) from None
    return _field(ref, value) if ref.field else value


def _field(ref: SecretRef, value: str) -> str:
    try:
        doc = json.loads(value)
        picked = doc[ref.field]
    except (ValueError, KeyError, TypeError):
        raise SecretError(
            f"secret {ref.env} ({ref.ref}): not a JSON object with the key {ref.field!r}", user_fault=True
        ) from None
    if isinstance(picked, (dict, list)) or picked is None:
        raise SecretError(f"secret {ref.env} ({ref.ref}): key {ref.field!r} is not a string or number", user_fault=True)
    return str(picked)


def _answer(resp: net.Response, what: str, url: str) -> dict[str, object]:
    if resp.status != 200:
        raise net.status_error(what, resp, url)
    try:
        raw = json.loads(resp.body)
    except ValueError:
        raise net.HTTPStatusError(f"{what}: unreadable answer from {net.safe_url(url)}", status=resp.status) from None
    if not isinstance(raw, dict):
        raise net.HTTPStatusError(f"{what}: unexpected answer from {net.safe_url(url)}", status=resp.status)
    return raw


def _aws(secret_id: str, identities: Identities, env: Mapping[str, str]) -> str:
    m = AWS_ARN_REGION.match(secret_id)
    region = m["region"] if m else identities.aws.region()
    endpoint = env.get("AWS_ENDPOINT_URL_SECRETS_MANAGER") or env.get("AWS_ENDPOINT_URL")
    url = (endpoint.rstrip("/") + "/") if endpoint else f"https://secretsmanager.{region}.amazonaws.com/"
    body = json.dumps({"SecretId": secret_id}).encode()
    import hashlib

    def once() -> net.Response:
        headers = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "secretsmanager.GetSecretValue"}
        headers.update(
            sign(
                "POST", url, headers, payload_sha256=hashlib.sha256(body).hexdigest(),
                credentials=identities.aws.credentials(), region=region, service="secretsmanager",
            )
        )  # fmt: skip
        return net.request("POST", url, headers=headers, body=body)

    resp = net.retry(lambda: _raise_transient(once(), "GetSecretValue", url), attempts=4)
    raw = _answer(resp, "GetSecretValue", url)
    if isinstance(raw.get("SecretString"), str):
        return str(raw["SecretString"])
    if isinstance(raw.get("SecretBinary"), str):
        return base64.b64decode(str(raw["SecretBinary"])).decode("utf-8", errors="strict")
    raise net.HTTPStatusError("GetSecretValue: the answer holds no SecretString or SecretBinary", status=200)


def _raise_transient(resp: net.Response, what: str, url: str) -> net.Response:
    if resp.status in net.TRANSIENT_STATUSES:
        raise net.status_error(what, resp, url)
    return resp


def _gcp(name: str, identities: Identities, env: Mapping[str, str]) -> str:
    if not GCP_NAME.match(name):
        raise SecretError(f"GCP secret {name!r}: expected projects/<p>/secrets/<s>[/versions/<v>]", user_fault=True)
    if "/versions/" not in name:
        name += "/versions/latest"
    base = (env.get("OVERSPILL_GCP_SECRET_MANAGER_ENDPOINT") or "https://secretmanager.googleapis.com").rstrip("/")
    url = f"{base}/v1/{quote(name, safe='/')}:access"

    def once() -> net.Response:
        headers = {"Authorization": f"Bearer {identities.gcp.access_token()}"}
        return _raise_transient(net.request("GET", url, headers=headers), "Secret Manager access", url)

    raw = _answer(net.retry(once, attempts=4), "Secret Manager access", url)
    payload = raw.get("payload")
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), str):
        raise net.HTTPStatusError("Secret Manager access: the answer holds no payload.data", status=200)
    data = base64.b64decode(payload["data"])
    if payload.get("dataCrc32c") is not None and int(payload["dataCrc32c"]) != crc32c(data):
        raise net.TransientHTTP("Secret Manager access: the payload does not match its CRC32C", status=500)
    return data.decode("utf-8")


def _azure(ref: str, identities: Identities, env: Mapping[str, str]) -> str:
    parts = urlsplit(ref)
    if parts.scheme != "https" or not KEY_VAULT_HOST.match(parts.hostname or "") or parts.port:
        raise SecretError(
            f"Key Vault secret {ref!r}: expected https://<vault>.vault.azure.net/secrets/<name>[/<version>]",
            user_fault=True,
        )
    if not re.fullmatch(r"/secrets/[0-9A-Za-z-]+(/[0-9A-Za-z]+)?/?", parts.path):
        raise SecretError(f"Key Vault secret {ref!r}: the path must be /secrets/<name>[/<version>]", user_fault=True)
    override = env.get("OVERSPILL_AZURE_KEYVAULT_ENDPOINT")
    base = override.rstrip("/") if override else f"https://{parts.hostname}"
    url = f"{base}{parts.path.rstrip('/')}?api-version=7.4"

    def once() -> net.Response:
        token = identities.azure.access_token(AzureIdentity.KEY_VAULT)
        headers = {"Authorization": f"Bearer {token}"}
        return _raise_transient(net.request("GET", url, headers=headers), "Key Vault get secret", url)

    raw = _answer(net.retry(once, attempts=4), "Key Vault get secret", url)
    if not isinstance(raw.get("value"), str):
        raise net.HTTPStatusError("Key Vault get secret: the answer holds no value", status=200)
    return str(raw["value"])


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as Google reports payload checksums."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
