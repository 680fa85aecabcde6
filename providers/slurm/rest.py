"""The slurmrestd transport for `providers.slurm.provider.SlurmProvider` (`providers.slurm.transport.SlurmTransport`).

Contract: `RestTransport(url, user, token, fallback)` talks to slurmrestd's v0.0.38 API (Slurm 22.05; the openapi
and dbv openapi plugins: `slurmrestd -s openapi/v0.0.38,openapi/dbv0.0.38 -a rest_auth/jwt`) as `user`, the
broker's Slurm operator, with a JWT (`scontrol token username=<user> lifespan=<s>`, sent as
`X-SLURM-USER-NAME`/`X-SLURM-USER-TOKEN`; slurmctld and slurmdbd need `AuthAltTypes=auth/jwt` and slurmrestd
`SLURM_JWT=daemon`).

- `jobs()`: `GET /slurm/v0.0.38/jobs`; `nodes()`: `GET /slurm/v0.0.38/nodes` (the same documents `squeue --json` and
  `sinfo --json` print in 22.05, read by the same parsers).
- `accounting(ids)`: `GET /slurmdb/v0.0.38/jobs?step=<ids>` (sacct's document); "Nothing found" is no records.
  Without the dbv plugin (404) it is `sacct` through the fallback, logged once.
- `update_job`: `POST /slurm/v0.0.38/job/<target>` with `comment`, `dependency`, `priority`; `hold`: the same with
  `{"hold": true}` (an operator's hold: JobHeldAdmin). `cancel`: `DELETE /slurm/v0.0.38/job/<target>` (SIGKILL;
  an already ended job is success, an unknown one `NotFound`). An array task target (`123_4`) is split out of its
  record by the update as by scontrol; 22.05 answers every array-task update with an error entry that has no
  error number (it tests the per-task result array's pointer, not its codes) and HTTP 200, so for an array task a
  comment or dependency update is read back (`GET /job/<task>`) and a value that did not take is
  `SlurmCommandError`; a hold is decided by the provider's own read-back.
- What v0.0.38 cannot do goes through the fallback transport (`CliTransport`, the same operator account), each
  logged once at INFO: `release` (the API's `priority` must lie in 1..NO_VAL-1, so the INFINITE a release is cannot
  be sent, and setting a number would pin the job's priority for good; `hold: false` changes nothing),
  `requeue` (no endpoint), `submit` (slurmrestd submits as the token's user, and the broker never submits as its
  operator account: the site's submit wrapper runs sbatch as the tenant's own user), `priority_type` (no
  configuration endpoint) and the held job's batch script and record (`run`, `providers.slurm.script`: v0.0.38
  returns no batch script).
- Token: from `token_file` (re-read whenever the file changes; a site rotates it with a cron'd `scontrol token`) or
  the fixed `token`. When slurmrestd answers 401/403, or slurmctld rejects the token (22.05 relays that as HTTP 500
  "Unspecified error", number -1), the file is read again and the request retried once if the token changed;
  still refused, it is `AuthError`, unless `scontrol ping` (through the fallback) says slurmctld is down: 22.05's
  slurmrestd answers an unreachable controller with the same bare errors, so any such error is
  `SlurmUnavailable` then.
- Errors name the endpoint (`slurmrestd POST /slurm/v0.0.38/job/12: ...`): unreachable or timed out (`timeout`
  seconds to connect and to answer) or 502/503/504 -> `SlurmUnavailable`; otherwise Slurm's error text is
  classified like the tools' (`providers.slurm.transport.classify`); an unreadable body is `SlurmCommandError`.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from providers.base import AuthError, ProviderError
from providers.slurm.accounting import parse_sacct
from providers.slurm.json_api import SlurmJob, SlurmNode, SlurmParseError, parse_sinfo, parse_squeue
from providers.slurm.transport import (
    AccountingDisabled,
    CliTransport,
    Runner,
    SlurmCommandError,
    SlurmUnavailable,
    accounting_off,
    classify,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

API = "/slurm/v0.0.38"
DB_API = "/slurmdb/v0.0.38"
NOTHING_FOUND = 9003  # slurmdbd's "Nothing found with query": no records, not a failure
_DOWN = "slurmctld is down (scontrol ping): slurmrestd cannot reach it"
_AUTH_REJECTED = -1  # 22.05 relays slurmctld's refusal of a token as error number -1, "Unspecified error"


class RestTransport:
    """slurmrestd v0.0.38 with JWT (module docstring)."""

    def __init__(
        self,
        url: str,
        user: str,
        *,
        fallback: CliTransport,
        token: str = "",
        token_file: str = "",
        timeout: float = 30.0,
        client: httpx.Client | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"slurmrestd URL must be http(s)://host:port, got {url!r}")
        if not user:
            raise ValueError("slurmrestd needs the user name the token was issued for")
        if not token and not token_file:
            raise ValueError("slurmrestd needs a JWT: a token file (scontrol token ... > FILE) or the token")
        self.url = url.rstrip("/")
        self.user = user
        self.fallback = fallback
        self.name = fallback.name
        self._fixed = token
        self._file = token_file
        self._token: tuple[float, str] | None = None
        self._client = client or httpx.Client(timeout=httpx.Timeout(timeout))
        self._fell_back: set[str] = set()

    @property
    def run(self) -> Runner:
        """The fallback's command runner (what v0.0.38 cannot do runs through it)."""
        return self.fallback.run

    @run.setter
    def run(self, run: Runner) -> None:
        self.fallback.run = run

    # ---- token --------------------------------------------------------------------------------------------

    def token(self, *, reread: bool = False) -> str:
        """The JWT to send: the file's (read again when it changed, or when `reread`), else the fixed one."""
        if not self._file:
            return self._fixed
        try:
            mtime = os.stat(self._file).st_mtime
            if reread or self._token is None or self._token[0] != mtime:
                text = Path(self._file).read_text().strip()
                self._token = (mtime, text.partition("SLURM_JWT=")[2] or text)
        except OSError as exc:
            raise SlurmUnavailable(f"slurmrestd token file {self._file}: {exc}", provider=self.name) from exc
        return self._token[1]

    # ---- requests -----------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None, body: Any = None) -> Any:
        """One call: the decoded JSON body, or the typed error naming `method path`."""
        where = f"slurmrestd {method} {path}"
        token = self.token()
        resp = self._send(method, path, token, params, body, where)
        if self._rejected(resp):
            fresh = self.token(reread=True)
            if fresh != token:
                resp = self._send(method, path, fresh, params, body, where)
        try:
            doc = resp.json()
        except ValueError:
            doc = None
        if self._rejected(resp):
            if self._controller_down():
                raise SlurmUnavailable(f"{where} failed ({resp.status_code}): {_DOWN}", provider=self.name)
            raise AuthError(
                f"{where} failed ({resp.status_code}): slurmctld refused the request with no reason, which is how "
                f"22.05 answers an invalid or expired JWT for {self.user} (token file: {self._file or 'none'})",
                provider=self.name,
                detail=resp.text[:500],
            )
        if resp.status_code in (502, 503, 504):
            raise SlurmUnavailable(f"{where}: HTTP {resp.status_code}", provider=self.name, detail=resp.text[:500])
        if resp.status_code >= 400:
            text = _error_text(doc) or resp.text[:500]
            if resp.status_code in (401, 403) and "denied" not in text.lower():
                text = f"access denied: {text}"
            error = classify(f"{where} failed ({resp.status_code}): {text[:500]}", text, self.name)
            if type(error) is SlurmCommandError and resp.status_code >= 500 and self._controller_down():
                raise SlurmUnavailable(f"{where} failed ({resp.status_code}): {_DOWN}", provider=self.name, detail=text)
            raise error
        if not isinstance(doc, Mapping):
            raise SlurmCommandError(f"{where}: not a JSON object (HTTP {resp.status_code})", provider=self.name)
        return doc

    def _send(
        self, method: str, path: str, token: str, params: Mapping[str, str] | None, body: Any, where: str
    ) -> httpx.Response:
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": token}
        try:
            return self._client.request(method, self.url + path, params=params, json=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise SlurmUnavailable(f"{where} timed out: {exc}", provider=self.name) from exc
        except httpx.TransportError as exc:
            raise SlurmUnavailable(f"{where}: cannot reach slurmrestd: {exc}", provider=self.name) from exc

    @staticmethod
    def _rejected(resp: httpx.Response) -> bool:
        if resp.status_code in (401, 403):
            return True
        if resp.status_code != 500:
            return False
        try:
            errors = resp.json().get("errors") or []
        except (ValueError, AttributeError):
            return False
        return any(isinstance(e, Mapping) and e.get("error_number") == _AUTH_REJECTED for e in errors)

    def _controller_down(self) -> bool:
        """Whether slurmctld is down, asked with `scontrol ping` (22.05's slurmrestd answers an unreachable
        controller with the same bare errors as a refused token). False when the tools cannot tell."""
        try:
            done = self.fallback.run(["scontrol", "ping"])
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode != 0 or " DOWN" in (done.stdout or "")

    def _fallback(self, op: str, why: str) -> CliTransport:
        if op not in self._fell_back:
            self._fell_back.add(op)
            log.info("slurmrestd transport: %s goes through the Slurm tools (%s)", op, why)
        return self.fallback

    # ---- the transport ------------------------------------------------------------------------------------

    def _parsed(self, path: str, parse: Callable[[Any], list[T]], doc: Any) -> list[T]:
        """`parse(doc)` of the answer to `GET path`; an unreadable one is `SlurmCommandError` naming the endpoint."""
        try:
            return parse(doc)
        except SlurmParseError as exc:
            raise SlurmCommandError(f"slurmrestd GET {path}: unreadable: {exc}", provider=self.name) from exc

    def jobs(self) -> list[SlurmJob]:
        return self._parsed(f"{API}/jobs", parse_squeue, self.request("GET", f"{API}/jobs"))

    def nodes(self) -> list[SlurmNode]:
        return self._parsed(f"{API}/nodes", parse_sinfo, self.request("GET", f"{API}/nodes"))

    def accounting(self, ids: Sequence[str]) -> list[SlurmJob]:
        path = f"{DB_API}/jobs"
        try:
            doc = self.request("GET", path, params={"step": ",".join(ids)})
        except SlurmUnavailable:
            raise
        except ProviderError as exc:
            if accounting_off(str(exc.detail or exc)):
                raise AccountingDisabled(f"no accounting on {self.name}: {exc}", provider=self.name) from exc
            if "failed (404)" in str(exc):
                return self._fallback("accounting", "slurmrestd runs without openapi/dbv0.0.38").accounting(ids)
            raise
        errors = [e for e in doc.get("errors") or [] if not _nothing_found(e)]
        return self._parsed(path, parse_sacct, {**doc, "errors": errors})

    def update_job(
        self, target: str, *, comment: str | None = None, dependency: str | None = None, priority: int | None = None
    ) -> None:
        body: dict[str, object] = {}
        if comment is not None:
            body["comment"] = comment
        if dependency is not None:
            body["dependency"] = dependency
        if priority is not None:
            body["priority"] = priority
        if not body:
            return
        path = f"{API}/job/{quote(target, safe='')}"
        self.request("POST", path, body=body)
        if "_" in target:  # 22.05 answers every array-task update 200-with-an-error: read the task back
            self._verify_update(target, path, comment, dependency)

    def _verify_update(self, target: str, path: str, comment: str | None, dependency: str | None) -> None:
        """The array task `target` carries the comment and dependency just sent, else `SlurmCommandError`."""
        jobs = self._parsed(path, parse_squeue, self.request("GET", path))
        job = next((j for j in jobs if j.target == target), None)
        wrong = []
        if job is None:
            wrong.append("the task is not in the answer")
        else:
            if comment is not None and job.comment != comment:
                wrong.append(f"comment is {job.comment!r}")
            if dependency is not None and _dependency_jobs(job.dependency) != _dependency_jobs(dependency):
                wrong.append(f"dependency is {job.dependency!r}, not {dependency!r}")
        if wrong:
            raise SlurmCommandError(
                f"slurmrestd POST {path}: the update did not take ({'; '.join(wrong)})", provider=self.name
            )

    def hold(self, target: str) -> None:
        self.request("POST", f"{API}/job/{quote(target, safe='')}", body={"hold": True})

    def release(self, target: str) -> None:
        self._fallback("release", "v0.0.38 can send no INFINITE priority; a number would pin it").release(target)

    def cancel(self, target: str) -> None:
        self.request("DELETE", f"{API}/job/{quote(target, safe='')}")

    def requeue(self, target: str) -> None:
        self._fallback("requeue", "v0.0.38 has no requeue endpoint").requeue(target)

    def submit(self, argv: list[str]) -> str:
        return self._fallback("submit", "jobs are submitted as the tenant's own user, never the token's").submit(argv)

    def priority_type(self) -> str:
        return self._fallback("priority_type", "v0.0.38 has no configuration endpoint").priority_type()

    def close(self) -> None:
        self._client.close()


def _dependency_jobs(text: str | None) -> list[str]:
    """A dependency as its (type, job) terms, without the state Slurm appends (`afterok:12_3(unfulfilled)`)."""
    return sorted(re.sub(r"\([^)]*\)", "", term) for term in re.split(r"[,?]", text or "") if term.strip())


def _nothing_found(error: object) -> bool:
    return isinstance(error, Mapping) and error.get("error_number") == NOTHING_FOUND


def _error_text(doc: object) -> str:
    if not isinstance(doc, Mapping):
        return ""
    parts = []
    for e in doc.get("errors") or []:
        if isinstance(e, Mapping):
            parts.append(": ".join(str(e[k]) for k in ("description", "error") if e.get(k)))
        else:
            parts.append(str(e))
    return "; ".join(p for p in parts if p)
