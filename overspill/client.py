"""The Python client of the Overspill API: what the `overspill` CLI uses, public for notebooks and scripts.

Import it as `from overspill.client import Client` (or `from overspill.client import Client`, the same class):

    from overspill.client import Client

    api = Client("http://broker:8000", api_key="ovs_...")    # or OVERSPILL_URL / OVERSPILL_API_KEY
    job = api.submit({"name": "resnet", "image": "ghcr.io/acme/train:1.4", "accelerators": ["A100"],
                      "gpu_count": 1, "work_gpu_hours": "2", "max_total_usd": "40"})
    api.watch(job["id"], timeout=3600)                         # returns the job once it ends (or the timeout)
    api.cancel(job["id"])

Answers are the API's JSON as dicts (money as decimal strings, times as ISO 8601 with `Z`; the OpenAPI document at
`/openapi.json` and `/docs` describe every field). Every error raises `ApiError` with the HTTP status, the problem
details' `detail` and `errors` (each field at fault with its location), so `str(exc)` names what to fix. A client
generated from `/openapi.json` (openapi-python-client and the like) is the other way to call the API; the tests
build one (tests/test_openapi_client.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from overspill.defaults import DEFAULT_URL, DEV_API_KEY, TERMINAL_STATES, check_url
from overspill.errors import ApiError

__all__ = ["TERMINAL_STATES", "ApiError", "BrokerClient", "Client"]


@dataclass(frozen=True)
class LogPage:
    """One read of a job's log (`BrokerClient.log_page`)."""

    data: bytes
    next_offset: int
    ended: bool
    placement_id: str | None


class BrokerClient:
    """Talks to a running broker at `url` (env OVERSPILL_URL, default http://127.0.0.1:8000) with `api_key`
    (env OVERSPILL_API_KEY, default the development key). Usable as a context manager (closes its connections).
    A URL that is not `http(s)://HOST[:PORT]` raises `ValueError` naming where it came from and the expected form."""

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 30.0) -> None:
        source = "url" if url else "OVERSPILL_URL"
        self.url = check_url(url or os.environ.get("OVERSPILL_URL") or DEFAULT_URL, source)
        key = api_key or os.environ.get("OVERSPILL_API_KEY") or DEV_API_KEY
        self._http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            raise ApiError(0, f"cannot reach the broker at {self.url} (is `overspill serve` running?)") from exc
        if resp.status_code >= 400:
            raise _error(resp)
        if resp.status_code == 204:
            return None
        return resp.json()

    # jobs

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Queue a job (`JobCreate` in the API document); the same `idempotency_key` never makes a second one."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/jobs", json=spec, headers=headers)  # type: ignore[no-any-return]

    def get(self, job_id: str) -> dict[str, Any]:
        """The job as it is now (state, spend, placement)."""
        return self._call("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    def watch(
        self,
        job_id: str,
        *,
        interval: float = 5.0,
        timeout: float | None = None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll the job every `interval` seconds until it ends (succeeded, failed or cancelled) and return it; after
        `timeout` seconds return it as it then is. `on_change(job)` is called whenever its state or spend changes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: tuple[Any, ...] | None = None
        while True:
            job = self.get(job_id)
            now = (job["state"], job["spent_usd"], job.get("wait_reason"))
            if on_change is not None and now != seen:
                on_change(job)
            seen = now
            if job["state"] in TERMINAL_STATES or (deadline is not None and time.monotonic() >= deadline):
                return job
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def update(self, job_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change a job's ceilings, deadline or priority (`JobUpdate`)."""
        return self._call("PATCH", f"/v1/jobs/{job_id}", json=changes)  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; any instance it holds is stopped by the broker's next tick."""
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")  # type: ignore[no-any-return]

    def notice(self, job_id: str) -> dict[str, Any]:
        """Development drill: deliver a spot interruption notice to the job's running attempt (refused in
        production): `{job_id, placement_id, instance_id, deadline}`."""
        return self._call("POST", f"/v1/jobs/{job_id}/notice")  # type: ignore[no-any-return]

    def events(self, job_id: str) -> list[dict[str, Any]]:
        """All the job's events, oldest first (every page of `GET /v1/jobs/{id}/events`, `after=<last id>`)."""
        out: list[dict[str, Any]] = []
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"after": str(out[-1]["id"])} if out else {})}
            answer = self._call("GET", f"/v1/jobs/{job_id}/events", params=params)
            items = answer["items"] if isinstance(answer, dict) else answer
            out.extend(items)
            if len(items) < 1000:
                return out

    def follow_events(self, job_id: str, *, interval: float = 2.0) -> Iterator[dict[str, Any]]:
        """Every event of the job, oldest first, then each new one as it comes, until the job has ended (succeeded,
        failed or cancelled) and its last events are out. Pages through `after=<last id>`."""
        after: str | None = None
        ended = False
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"after": after} if after else {})}
            page = self._call("GET", f"/v1/jobs/{job_id}/events", params=params)
            items = page["items"] if isinstance(page, dict) else page
            for item in items:
                after = str(item["id"])
                yield item
            if len(items) == 1000:
                continue
            if ended:
                return
            ended = self.get(job_id)["state"] in TERMINAL_STATES  # one more read after the end: its last events
            if not ended:
                time.sleep(interval)

    def jobs(self, **params: Any) -> dict[str, Any]:
        """A page of jobs: `{"items": [...], "next_cursor": ...}` (filters: state, team, project, cursor, limit)."""
        return self._call("GET", "/v1/jobs", params={k: v for k, v in params.items() if v})  # type: ignore[no-any-return]

    # market and money

    def quote(self, spec: dict[str, Any], limit: int = 20) -> dict[str, Any]:
        """Where the job could run, at what expected cost and finish time, and why other pools are rejected."""
        return self._call("POST", "/v1/quotes", json=spec, params={"limit": limit})  # type: ignore[no-any-return]

    def logs(self, job_id: str, attempt: str | None = None, offset: int = 0) -> tuple[bytes, int, bool]:
        """(the job's log from `offset`, the offset to read on from, whether the attempt has ended)."""
        params: dict[str, Any] = {"offset": offset} | ({"attempt": attempt} if attempt else {})
        resp = self._raw("GET", f"/v1/jobs/{job_id}/logs", params=params)
        ended = resp.headers.get("X-Overspill-Attempt-Ended") == "true"
        return resp.content, int(resp.headers.get("X-Overspill-Next-Offset", offset + len(resp.content))), ended

    def log_page(self, job_id: str, attempt: str | int | None = None, offset: int = 0) -> LogPage:
        """One read of the job's log (`attempt`: a number from 1 or a placement id; default the latest with a log):
        the bytes from `offset`, where to read on, whether the attempt ended, and the placement read (None: no
        attempt of the job has a log yet, or ever will)."""
        params: dict[str, Any] = {"offset": offset} | ({"attempt": str(attempt)} if attempt is not None else {})
        resp = self._raw("GET", f"/v1/jobs/{job_id}/logs", params=params)
        return LogPage(
            data=resp.content,
            next_offset=int(resp.headers.get("X-Overspill-Next-Offset", offset + len(resp.content))),
            ended=resp.headers.get("X-Overspill-Attempt-Ended") == "true",
            placement_id=resp.headers.get("X-Overspill-Attempt"),
        )

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        """The job's attempts (placements), first to latest: number, pool, state, times, cost, why each ended."""
        return self._call("GET", f"/v1/jobs/{job_id}/attempts")["items"]  # type: ignore[no-any-return]

    def follow_logs(self, job_id: str, attempt: str | None = None, offset: int = 0) -> Iterator[bytes]:
        """The job's log from `offset` as it grows, until its attempt ends."""
        params: dict[str, Any] = {"offset": offset, "follow": "true"} | ({"attempt": attempt} if attempt else {})
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise _error(resp)
                yield from resp.iter_bytes()
        except httpx.ConnectError as exc:
            raise ApiError(0, f"cannot reach the broker at {self.url} (is `overspill serve` running?)") from exc

    def _raw(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            raise ApiError(0, f"cannot reach the broker at {self.url} (is `overspill serve` running?)") from exc
        if resp.status_code >= 400:
            raise _error(resp)
        return resp

    def pools(self, **params: Any) -> list[dict[str, Any]]:
        """Every pool with its current price (filters: accelerator, provider, capacity_type, limit)."""
        page = self._call("GET", "/v1/pools", params={k: v for k, v in params.items() if v})
        return page["items"]  # type: ignore[no-any-return]

    def costs(self, group_by: str = "team", start: str | None = None, end: str | None = None) -> dict[str, Any]:
        """Cost sums per group (finance and admin keys); default window: this month so far."""
        params = {"group_by": group_by, "from": start, "to": end}
        return self._call("GET", "/v1/costs", params={k: v for k, v in params.items() if v})  # type: ignore[no-any-return]


Client = BrokerClient


def _error(resp: httpx.Response) -> ApiError:
    """The `ApiError` of an error answer (problem details: `detail` and the fields at fault)."""
    errors: list[dict[str, Any]] = []
    try:
        body = resp.json()
        message = body.get("detail") or body.get("message") or resp.text
        errors = body.get("errors") or []
    except (ValueError, AttributeError):
        message = resp.text
    return ApiError(resp.status_code, str(message), errors)
