"""HTTP for the agent over the standard library: one request function, typed errors, and bounded retries.

Contract:
- `request()` returns a `Response` for every HTTP status (the caller decides what a 404 means); it raises
  `Unreachable` when no answer came (refused, reset, DNS, TLS, timeout). Redirects are never followed (a signed or
  bearer request must not be replayed to another host). Messages carry the method and the URL without its query
  string, never headers or bodies, so they are safe to log and to put in reports.
- `direct=True` bypasses any `*_proxy` environment variables: the metadata servers (169.254.169.254) must be reached
  directly (Azure's IMDS refuses proxied requests).
- `retry()` re-runs a call on `Unreachable` and on `TransientHTTP` with full-jitter exponential backoff, at most
  `attempts` times, then re-raises the last error.
"""

from __future__ import annotations

import os
import random
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")
DEFAULT_TIMEOUT = 30.0
# throttling and server-side trouble: worth another try; every other status is an answer
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


class NetError(Exception):
    """Base of the agent's HTTP errors; the message is safe to log (no headers, no query strings, no bodies)."""


class Unreachable(NetError):
    """No HTTP answer: connection refused or reset, name resolution, TLS, or timeout."""


class HTTPStatusError(NetError):
    """An answer with a status the caller did not expect. `status` and a short `snippet` of the body."""

    def __init__(self, message: str, *, status: int, snippet: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.snippet = snippet


class TransientHTTP(HTTPStatusError):
    """An unexpected status that a retry may fix (429, 5xx)."""


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def safe_url(url: str) -> str:
    """`url` without its query string and user info: fit for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def status_error(what: str, response: Response, url: str) -> HTTPStatusError:
    """An error for an unexpected answer, transient or not by its status."""
    snippet = response.text()[:300].replace("\n", " ")
    cls = TransientHTTP if response.status in TRANSIENT_STATUSES else HTTPStatusError
    return cls(
        f"{what}: HTTP {response.status} from {safe_url(url)}: {snippet}", status=response.status, snippet=snippet
    )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener(direct: bool, cafile: str | None) -> urllib.request.OpenerDirector:
    proxies = urllib.request.ProxyHandler({}) if direct else urllib.request.ProxyHandler()
    https = urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile))
    return urllib.request.build_opener(_NoRedirect(), proxies, https)


_OPENERS: dict[tuple[bool, str | None], urllib.request.OpenerDirector] = {}


def opener(direct: bool) -> urllib.request.OpenerDirector:
    """The opener for direct or proxied requests; TLS trusts the system CAs, or `SSL_CERT_FILE` when set (read on
    every call, so a private CA can be given to a running agent's children and tests alike)."""
    cafile = os.environ.get("SSL_CERT_FILE") or None
    key = (direct, cafile)
    if key not in _OPENERS:
        _OPENERS[key] = _opener(direct, cafile)
    return _OPENERS[key]


@contextmanager
def open_request(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | IO[bytes] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    direct: bool = False,
) -> Iterator[tuple[int, dict[str, str], IO[bytes]]]:
    """Send a request and yield (status, lower-case headers, the body stream) for reading it in pieces.

    A file-like `body` is streamed; give its length in `headers["Content-Length"]`."""
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        resp = opener(direct).open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        resp = exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"{method} {safe_url(url)}: {reason}") from None
    try:
        status = int(resp.status if hasattr(resp, "status") else resp.code)
        yield status, {k.lower(): v for k, v in resp.headers.items()}, resp
    finally:
        resp.close()


def request(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | IO[bytes] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    direct: bool = False,
    max_bytes: int = 64 * 1024 * 1024,
) -> Response:
    """Send a request and read the whole answer (at most `max_bytes`)."""
    with open_request(method, url, headers=headers, body=body, timeout=timeout, direct=direct) as (status, hdrs, fp):
        try:
            data = read_at_most(fp, max_bytes + 1)
        except (OSError, ValueError) as exc:
            raise Unreachable(f"{method} {safe_url(url)}: reading the answer: {exc}") from None
        if len(data) > max_bytes:
            raise HTTPStatusError(f"{method} {safe_url(url)}: answer over {max_bytes} bytes", status=status)
        return Response(status, hdrs, data)


READ_PIECE = 1024 * 1024


def read_at_most(fp: IO[bytes], limit: int) -> bytes:
    """Up to `limit` bytes of `fp` (fewer at its end), read in pieces of at most `READ_PIECE`.

    Not `fp.read(limit)`: on Python 3.8 and 3.9 `HTTPResponse.read(n)` zero-fills an n-byte buffer before reading,
    whatever the answer's length, so a 64 MiB limit cost every request 64 MiB and ~100 ms there."""
    parts: list[bytes] = []
    left = limit
    while left > 0:
        piece = fp.read(min(left, READ_PIECE))
        if not piece:
            break
        parts.append(piece)
        left -= len(piece)
    return b"".join(parts)


def backoff_delays(attempts: int, base: float, cap: float) -> Iterator[float]:
    """Full-jitter exponential delays between `attempts` tries (attempts - 1 of them)."""
    for n in range(attempts - 1):
        yield random.uniform(0, min(cap, base * 2**n))


def retry(
    call: Callable[[], T],
    *,
    attempts: int = 5,
    base: float = 0.5,
    cap: float = 20.0,
    retry_on: tuple[type[BaseException], ...] = (Unreachable, TransientHTTP),
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, retried on `retry_on` errors with full-jitter exponential backoff; the last error is raised."""
    delays = backoff_delays(attempts, base, cap)
    while True:
        try:
            return call()
        except retry_on:
            delay = next(delays, None)
            if delay is None:
                raise
            sleep(delay)
