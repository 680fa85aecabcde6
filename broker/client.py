"""A small HTTP client for the CLI's user commands (submit, update, cancel, jobs, logs, quote, pools)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx

from broker.settings import DEV_API_KEY


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class BrokerClient:
    """Talks to a running broker at `url` (env OVERSPILL_URL) with `api_key` (env OVERSPILL_API_KEY)."""

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.url = (url or os.environ.get("OVERSPILL_URL") or "http://127.0.0.1:8000").rstrip("/")
        key = api_key or os.environ.get("OVERSPILL_API_KEY") or DEV_API_KEY
        self._http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            raise ApiError(0, f"cannot reach the broker at {self.url} (is `overspill serve` running?)") from exc
        if resp.status_code >= 400:
            try:
                body = resp.json()
                message = body.get("message") or body.get("detail") or resp.text
            except ValueError:
                message = resp.text
            raise ApiError(resp.status_code, str(message))
        return resp.json()

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/jobs", json=spec, headers=headers)  # type: ignore[no-any-return]

    def update(self, job_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/v1/jobs/{job_id}", json=changes)  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")  # type: ignore[no-any-return]

    def jobs(self, **params: Any) -> dict[str, Any]:
        return self._call("GET", "/v1/jobs", params={k: v for k, v in params.items() if v})  # type: ignore[no-any-return]

    def quote(self, spec: dict[str, Any], limit: int = 20) -> dict[str, Any]:
        return self._call("POST", "/v1/quotes", json=spec, params={"limit": limit})  # type: ignore[no-any-return]

    def logs(self, job_id: str, attempt: str | None = None, offset: int = 0) -> tuple[bytes, int, bool]:
        """(the job's log from `offset`, the offset to read on from, whether the attempt has ended)."""
        params: dict[str, Any] = {"offset": offset} | ({"attempt": attempt} if attempt else {})
        resp = self._raw("GET", f"/v1/jobs/{job_id}/logs", params=params)
        ended = resp.headers.get("X-Overspill-Attempt-Ended") == "true"
        return resp.content, int(resp.headers.get("X-Overspill-Next-Offset", offset + len(resp.content))), ended

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
        return self._call("GET", "/v1/pools", params={k: v for k, v in params.items() if v})  # type: ignore[no-any-return]


def _error(resp: httpx.Response) -> ApiError:
    try:
        body = resp.json()
        message = body.get("message") or body.get("detail") or resp.text
    except ValueError:
        message = resp.text
    return ApiError(resp.status_code, str(message))
