"""Log the container runtime in to the job's registry with the instance's identity, and pull the image.

Credentials per `RegistryAuth.kind`:
- `ecr`: ECR `GetAuthorizationToken` (SigV4 JSON call to api.ecr.<region>.amazonaws.com, region from the server
  name; endpoint override `AWS_ENDPOINT_URL_ECR` / `AWS_ENDPOINT_URL`), whose token is base64 `AWS:<password>`.
- `gcp`: user `oauth2accesstoken` with the metadata server's access token (Artifact Registry, GCR).
- `acr`: the managed identity's Entra ID token for ARM, exchanged at `https://<registry>/oauth2/exchange` for an ACR
  refresh token, used with the user `00000000-0000-0000-0000-000000000000` (ACR's documented AAD flow).
- `secret`: a secret holding `{"username": ..., "password": ...}`, resolved like the job's secrets.
Token kinds only ever send the instance's tokens to a registry of that cloud (`*.dkr.ecr.*.amazonaws.com`,
`*.pkg.dev` / `gcr.io`, `*.azurecr.io`): a spec naming any other server with them is refused.

Then `<runtime> login --username U --password-stdin SERVER` (the password on stdin, never on a command line) into an
auth file private to the agent (`REGISTRY_AUTH_FILE` for podman, `DOCKER_CONFIG` for docker), and `<runtime> pull`
retried with full-jitter exponential backoff. `OVERSPILL_REGISTRY_CERT_DIR` (podman) trusts a private registry CA.
Every failure raises `RegistryError` (the attempt is then infra_failed); messages never hold a password or token.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from agent import net
from agent.identity import AzureIdentity, Identities, IdentityError, jwt_claims
from agent.protocol import RegistryAuth, RegistryAuthKind, SecretRef
from agent.sigv4 import sign

ECR_HOST = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr(-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?$")
GCP_HOST = re.compile(r"^([a-z0-9-]+-docker\.pkg\.dev|([a-z]+\.)?gcr\.io)$")
ACR_HOST = re.compile(r"^[a-z0-9]{5,50}\.azurecr\.(io|cn|us)$")
ACR_USER = "00000000-0000-0000-0000-000000000000"
CERT_DIR_ENV = "OVERSPILL_REGISTRY_CERT_DIR"


class RegistryError(Exception):
    """Login or pull failed (after retries); the message is safe to log and report."""


@dataclass(frozen=True)
class Login:
    server: str
    username: str
    password: str

    def __repr__(self) -> str:
        return f"Login(server={self.server!r}, username={self.username!r})"


def _host(server: str) -> str:
    return server.split("/", 1)[0].lower()


def login_for(
    auth: RegistryAuth,
    identities: Identities,
    resolve_secret: Callable[[SecretRef], str],
    env: Mapping[str, str] | None = None,
) -> Login | None:
    """The credentials for `auth`, None for kind `none`. Raises RegistryError."""
    env = os.environ if env is None else env
    if auth.kind is RegistryAuthKind.NONE:
        return None
    if not auth.server:
        raise RegistryError(f"registry.server is required with registry.kind {auth.kind}")
    host = _host(auth.server)
    try:
        if auth.kind is RegistryAuthKind.ECR:
            m = ECR_HOST.match(host)
            if not m:
                raise RegistryError(
                    f"registry.server {auth.server!r} is not an ECR registry (<account>.dkr.ecr.<region>...)"
                )
            return _ecr(auth.server, m["region"], m["account"], identities, env)
        if auth.kind is RegistryAuthKind.GCP:
            if not GCP_HOST.match(host):
                raise RegistryError(f"registry.server {auth.server!r} is not Artifact Registry or GCR")
            return Login(auth.server, "oauth2accesstoken", identities.gcp.access_token())
        if auth.kind is RegistryAuthKind.ACR:
            if not ACR_HOST.match(host):
                raise RegistryError(
                    f"registry.server {auth.server!r} is not an Azure Container Registry (*.azurecr.io)"
                )
            return _acr(host, identities, env)
        if auth.secret is None:
            raise RegistryError("registry.secret is required with registry.kind secret")
        return _from_secret(auth.server, resolve_secret(auth.secret))
    except (net.NetError, IdentityError) as exc:
        raise RegistryError(f"registry credentials for {auth.server} ({auth.kind}): {exc}") from None


def _from_secret(server: str, value: str) -> Login:
    try:
        doc = json.loads(value)
        username, password = doc["username"], doc["password"]
    except (ValueError, KeyError, TypeError):
        raise RegistryError(
            f"the registry secret for {server} is not a JSON object with username and password"
        ) from None
    if not isinstance(username, str) or not isinstance(password, str):
        raise RegistryError(f"the registry secret for {server}: username and password must be strings")
    return Login(server, username, password)


def _ecr(server: str, region: str, account: str, identities: Identities, env: Mapping[str, str]) -> Login:
    endpoint = env.get("AWS_ENDPOINT_URL_ECR") or env.get("AWS_ENDPOINT_URL")
    url = (endpoint.rstrip("/") + "/") if endpoint else f"https://api.ecr.{region}.amazonaws.com/"
    body = json.dumps({"registryIds": [account]}).encode()
    target = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken"

    def once() -> net.Response:
        headers = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": target}
        headers.update(
            sign(
                "POST", url, headers, payload_sha256=hashlib.sha256(body).hexdigest(),
                credentials=identities.aws.credentials(), region=region, service="ecr",
            )
        )  # fmt: skip
        resp = net.request("POST", url, headers=headers, body=body)
        if resp.status != 200:
            raise net.status_error("ECR GetAuthorizationToken", resp, url)
        return resp

    resp = net.retry(once, attempts=4)
    try:
        data = json.loads(resp.body)["authorizationData"][0]["authorizationToken"]
        user, _, password = base64.b64decode(data).decode().partition(":")
    except (ValueError, KeyError, IndexError, TypeError):
        raise RegistryError("ECR GetAuthorizationToken: unexpected answer") from None
    return Login(server, user, password)


def _acr(host: str, identities: Identities, env: Mapping[str, str]) -> Login:
    aad = identities.azure.access_token(AzureIdentity.MANAGEMENT)
    tenant = str(jwt_claims(aad).get("tid") or "")
    base = (env.get("OVERSPILL_ACR_ENDPOINT") or f"https://{host}").rstrip("/")
    url = f"{base}/oauth2/exchange"
    form = f"grant_type=access_token&service={quote(host)}&access_token={quote(aad, safe='')}"
    if tenant:
        form += f"&tenant={quote(tenant)}"
    body = form.encode()

    def once() -> net.Response:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        resp = net.request("POST", url, headers=headers, body=body)
        if resp.status != 200:
            raise net.status_error("ACR token exchange", resp, url)
        return resp

    resp = net.retry(once, attempts=4)
    try:
        refresh = str(json.loads(resp.body)["refresh_token"])
    except (ValueError, KeyError, TypeError):
        raise RegistryError("ACR token exchange: the answer holds no refresh_token") from None
    return Login(host, ACR_USER, refresh)


@dataclass
class Client:
    """One container runtime binary (`podman` or `docker`) with an auth file private to this agent."""

    binary: str
    auth_dir: str
    env: Mapping[str, str]
    attempts: int = 5
    base_delay: float = 2.0
    sleep: Callable[[float], None] = time.sleep

    def run_env(self) -> dict[str, str]:
        env = dict(self.env)
        if os.path.basename(self.binary).startswith("docker"):
            env["DOCKER_CONFIG"] = self.auth_dir
        else:
            env["REGISTRY_AUTH_FILE"] = os.path.join(self.auth_dir, "auth.json")
        return env

    def _tls_args(self) -> list[str]:
        cert_dir = self.env.get(CERT_DIR_ENV)
        return ["--cert-dir", cert_dir] if cert_dir and not os.path.basename(self.binary).startswith("docker") else []

    def _run(self, args: list[str], stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [self.binary, *args], input=stdin, capture_output=True, text=True, env=self.run_env(), timeout=timeout
            )
        except FileNotFoundError:
            raise RegistryError(f"the container runtime {self.binary!r} is not installed") from None
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(args, 124, "", f"timed out after {timeout:.0f}s")

    def login(self, login: Login) -> None:
        def scrub(text: str) -> str:
            return text.replace(login.password, "[redacted]").strip()[-500:]

        last = ""
        for n in range(self.attempts):
            done = self._run(
                ["login", *self._tls_args(), "--username", login.username, "--password-stdin", login.server],
                stdin=login.password + "\n",
                timeout=120,
            )
            if done.returncode == 0:
                return
            last = scrub(done.stderr or done.stdout)
            if re.search(r"unauthori[sz]ed|denied|401|403|incorrect username or password", last, re.IGNORECASE):
                break  # a wrong password stays wrong
            if n + 1 < self.attempts:
                self.sleep(min(30.0, self.base_delay * 2**n) * (0.5 + 0.5 * _jitter()))
        raise RegistryError(f"registry login to {login.server} as {login.username} failed: {last}")

    def has_image(self, image: str) -> bool:
        """Whether the runtime's local store already holds `image`."""
        return self._run(["image", "inspect", image], timeout=60).returncode == 0

    def pull(self, image: str) -> None:
        last = ""
        for n in range(self.attempts):
            done = self._run(["pull", *self._tls_args(), image])
            if done.returncode == 0:
                return
            last = (done.stderr or done.stdout).strip()[-500:]
            if n + 1 < self.attempts:
                self.sleep(min(60.0, self.base_delay * 2**n) * (0.5 + 0.5 * _jitter()))
        raise RegistryError(f"pulling {image} failed after {self.attempts} attempts: {last}")

    def logout(self, server: str) -> None:
        self._run(["logout", server], timeout=30)


def _jitter() -> float:
    import random

    return random.random()
