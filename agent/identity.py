"""The instance's own identity on each cloud, read from its metadata server: AWS credentials (IMDSv2), a GCP access
token, Azure managed-identity tokens, plus the few instance facts the agent needs (region, project, VM name).

All three clouds serve their metadata at http://169.254.169.254; `OVERSPILL_METADATA_URL` overrides that base (the
tests point it at tests/metadata_server.py). Requests go direct, never through a proxy.

Contract: each getter returns a value valid for at least a minute, caching it until shortly before it expires, and is
safe to call from several threads. Failures raise `IdentityError` with a message that names the metadata path but
never a credential. AWS credentials come from the environment first (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_SESSION_TOKEN`: on-prem or Slurm nodes), then from the instance role.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from urllib.parse import quote

from agent import net
from agent.compat import UTC, parse_iso8601
from agent.sigv4 import AwsCredentials

METADATA_ENV = "OVERSPILL_METADATA_URL"
DEFAULT_METADATA = "http://169.254.169.254"
_TIMEOUT = 5.0
_EARLY = 300.0  # refresh credentials this many seconds before they expire


class IdentityError(Exception):
    """The instance identity could not be read; the message is safe to log."""


def metadata_base(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return (env.get(METADATA_ENV) or DEFAULT_METADATA).rstrip("/")


def _get(url: str, headers: dict[str, str], what: str, *, method: str = "GET", timeout: float = _TIMEOUT) -> str:
    try:
        resp = net.retry(
            lambda: net.request(method, url, headers=headers, timeout=timeout, direct=True), attempts=3, base=0.2
        )
    except net.NetError as exc:
        raise IdentityError(f"{what}: {exc}") from None
    if resp.status != 200:
        raise IdentityError(f"{what}: HTTP {resp.status} from {net.safe_url(url)}")
    return resp.text()


class AwsIdentity:
    """IMDSv2 (a session token from PUT /latest/api/token on every read) and the instance role's credentials."""

    def __init__(self, base: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.env = os.environ if env is None else env
        self.base = base or metadata_base(self.env)
        self._lock = threading.Lock()
        self._token: tuple[str, float] | None = None
        self._creds: AwsCredentials | None = None
        self._region: str | None = None

    def imds_token(self, *, refresh: bool = False) -> str:
        with self._lock:
            if self._token and not refresh and self._token[1] > time.monotonic():
                return self._token[0]
            token = _get(
                f"{self.base}/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
                "AWS IMDSv2 session token",
                method="PUT",
            ).strip()
            self._token = (token, time.monotonic() + 21600 - _EARLY)
            return token

    def get(self, path: str, *, timeout: float = _TIMEOUT) -> net.Response:
        """GET an IMDS path (e.g. `/latest/meta-data/spot/instance-action`) with the session token; the answer as
        is (404 is a normal answer for some paths). Raises net.NetError when IMDS does not answer."""
        url = f"{self.base}{path}"
        resp = net.request(
            "GET", url, headers={"X-aws-ec2-metadata-token": self.imds_token()}, timeout=timeout, direct=True
        )
        if resp.status == 401:  # the session token expired early (e.g. IMDS restarted)
            token = self.imds_token(refresh=True)
            resp = net.request("GET", url, headers={"X-aws-ec2-metadata-token": token}, timeout=timeout, direct=True)
        return resp

    def credentials(self) -> AwsCredentials:
        key, secret = self.env.get("AWS_ACCESS_KEY_ID"), self.env.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            return AwsCredentials(key, secret, self.env.get("AWS_SESSION_TOKEN") or None)
        with self._lock:
            creds = self._creds
        now = datetime.now(UTC)
        if creds and creds.expires_at and creds.expires_at - timedelta(seconds=_EARLY) > now:
            return creds
        root = "/latest/meta-data/iam/security-credentials/"
        try:
            role = self._text(root).strip().splitlines()[0]
            raw = json.loads(self._text(root + quote(role, safe="")))
            creds = AwsCredentials(
                raw["AccessKeyId"],
                raw["SecretAccessKey"],
                raw.get("Token"),
                parse_iso8601(raw["Expiration"]) if raw.get("Expiration") else None,
            )
        except (IndexError, KeyError, ValueError, TypeError) as exc:
            raise IdentityError(f"AWS instance role credentials at {root}: unexpected answer ({exc})") from None
        with self._lock:
            self._creds = creds
        return creds

    def region(self) -> str:
        given = self.env.get("AWS_REGION") or self.env.get("AWS_DEFAULT_REGION")
        if given:
            return given
        if self._region is None:
            self._region = self._text("/latest/meta-data/placement/region").strip()
        return self._region

    def _text(self, path: str) -> str:
        try:
            resp = net.retry(lambda: self.get(path), attempts=3, base=0.2)
        except net.NetError as exc:
            raise IdentityError(f"AWS IMDS {path}: {exc}") from None
        if resp.status != 200:
            raise IdentityError(f"AWS IMDS {path}: HTTP {resp.status} (is an instance role attached?)")
        return resp.text()


class GcpIdentity:
    """The VM's default service account token and project from the GCE metadata server."""

    HEADERS = {"Metadata-Flavor": "Google"}

    def __init__(self, base: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.env = os.environ if env is None else env
        self.base = base or metadata_base(self.env)
        self._lock = threading.Lock()
        self._token: tuple[str, float] | None = None
        self._project: str | None = None

    def url(self, path: str) -> str:
        return f"{self.base}/computeMetadata/v1/{path.lstrip('/')}"

    def access_token(self) -> str:
        with self._lock:
            if self._token and self._token[1] > time.monotonic():
                return self._token[0]
            text = _get(self.url("instance/service-accounts/default/token"), self.HEADERS, "GCP service account token")
            try:
                raw = json.loads(text)
                token, ttl = str(raw["access_token"]), float(raw.get("expires_in", 300))
            except (KeyError, ValueError, TypeError) as exc:
                raise IdentityError(f"GCP service account token: unexpected answer ({exc})") from None
            self._token = (token, time.monotonic() + max(30.0, ttl - 60))
            return token

    def project_id(self) -> str:
        if self._project is None:
            self._project = _get(self.url("project/project-id"), self.HEADERS, "GCP project id").strip()
        return self._project


class AzureIdentity:
    """Managed-identity tokens from Azure IMDS, one per resource (storage, Key Vault, ARM). `AZURE_CLIENT_ID`
    selects a user-assigned identity."""

    API_VERSION = "2018-02-01"
    HEADERS = {"Metadata": "true"}
    STORAGE = "https://storage.azure.com/"
    KEY_VAULT = "https://vault.azure.net"
    MANAGEMENT = "https://management.azure.com/"

    def __init__(self, base: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.env = os.environ if env is None else env
        self.base = base or metadata_base(self.env)
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, float]] = {}
        self._vm_name: str | None = None

    def access_token(self, resource: str) -> str:
        with self._lock:
            held = self._tokens.get(resource)
            if held and held[1] > time.monotonic():
                return held[0]
            url = (
                f"{self.base}/metadata/identity/oauth2/token?api-version={self.API_VERSION}"
                f"&resource={quote(resource, safe='')}"
            )
            client_id = self.env.get("AZURE_CLIENT_ID")
            if client_id:
                url += f"&client_id={quote(client_id, safe='')}"
            text = _get(url, self.HEADERS, f"Azure managed identity token for {resource}")
            try:
                raw = json.loads(text)
                token, ttl = str(raw["access_token"]), float(raw.get("expires_in", 300))
            except (KeyError, ValueError, TypeError) as exc:
                raise IdentityError(f"Azure managed identity token: unexpected answer ({exc})") from None
            self._tokens[resource] = (token, time.monotonic() + max(30.0, ttl - _EARLY))
            return token

    def vm_name(self) -> str | None:
        """This VM's name (Scheduled Events list the VMs they affect by name), None when IMDS does not say."""
        if self._vm_name is None:
            try:
                self._vm_name = _get(
                    f"{self.base}/metadata/instance/compute/name?api-version=2021-02-01&format=text",
                    self.HEADERS,
                    "Azure VM name",
                ).strip()
            except IdentityError:
                return None
        return self._vm_name or None


def jwt_claims(token: str) -> dict[str, object]:
    """The (unverified) claims of a JWT, e.g. the tenant `tid` of an Azure token; {} when it is not a JWT."""
    try:
        payload = token.split(".")[1]
        raw = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


class Identities:
    """One lazily built identity per cloud, shared by the agent's stores, secrets, registry and notices."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = os.environ if env is None else env
        self._lock = threading.Lock()
        self._aws: AwsIdentity | None = None
        self._gcp: GcpIdentity | None = None
        self._azure: AzureIdentity | None = None

    @property
    def aws(self) -> AwsIdentity:
        with self._lock:
            if self._aws is None:
                self._aws = AwsIdentity(env=self.env)
            return self._aws

    @property
    def gcp(self) -> GcpIdentity:
        with self._lock:
            if self._gcp is None:
                self._gcp = GcpIdentity(env=self.env)
            return self._gcp

    @property
    def azure(self) -> AzureIdentity:
        with self._lock:
            if self._azure is None:
                self._azure = AzureIdentity(env=self.env)
            return self._azure
