"""A fault-injecting HTTP proxy in front of a moto server: EC2 answers capacity errors, throttling, 5xx and timeouts
at a set rate, as real EC2 sends them.

Every EC2 Query API request (form body with `Action=...`) is, with probability `rate` (seeded, so runs repeat),
answered with one fault instead of being forwarded:
- `capacity` (RunInstances and CreateFleet only): HTTP 500, `InsufficientInstanceCapacity` in EC2's XML error
  envelope (what EC2 really sends, and what botocore would retry if left to itself);
- `throttle`: HTTP 503 `RequestLimitExceeded`;
- `server`: HTTP 500 `InternalError` or 503 `Unavailable`;
- `timeout`: the proxy holds the connection for `hold_seconds` (longer than the client's read timeout) and closes
  it unanswered. Half of the timeouts are "lost responses": the request IS forwarded to moto first, so a
  RunInstances may have launched an instance its caller never hears about.
Requests of other services (SQS's JSON protocol, S3...) pass through untouched.

moto ignores RunInstances' `ClientToken`; real EC2 returns the first call's result for a repeated token. The proxy
emulates that (it remembers each token's successful answer), so a retried launch after a lost response behaves as
it would on AWS.

`stats` counts requests per action, faults per kind and action, and RunInstances attempts per ClientToken with their
times (to see backoff between retries).
"""

from __future__ import annotations

import http.client
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from tests.moto_server import free_port

LAUNCH_ACTIONS = frozenset({"RunInstances", "CreateFleet"})
KINDS = ("capacity", "throttle", "server", "timeout")


@dataclass
class FaultStats:
    requests: Counter[str] = field(default_factory=Counter)
    faults: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, action)
    launch_attempts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # token -> times
    replayed_tokens: int = 0

    def faults_of(self, kind: str, action: str | None = None) -> int:
        return sum(n for (k, a), n in self.faults.items() if k == kind and (action is None or a == action))


def _error(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


class FaultProxy:
    def __init__(self, upstream: str, *, rate: float, seed: int = 1, hold_seconds: float = 1.5) -> None:
        parsed = urlsplit(upstream)
        self.upstream_host = parsed.hostname or "127.0.0.1"
        self.upstream_port = parsed.port or 80
        self.rate = rate
        self.hold_seconds = hold_seconds
        self.rng = random.Random(seed)
        self.stats = FaultStats()
        self.lock = threading.Lock()
        self.token_answers: dict[str, tuple[int, list[tuple[str, str]], bytes]] = {}
        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _decide(self, action: str) -> str | None:
        with self.lock:
            self.stats.requests[action] += 1
            if self.rng.random() >= self.rate:
                return None
            kinds = KINDS if action in LAUNCH_ACTIONS else KINDS[1:]
            kind = self.rng.choice(kinds)
            self.stats.faults[(kind, action)] += 1
            return kind

    def _forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        try:
            keep = {k: v for k, v in headers if k.lower() not in ("host", "connection", "content-length")}
            keep["Content-Length"] = str(len(body))
            conn.request(method, path, body=body, headers=keep)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheaders(), data
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
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = list(self.headers.items())
                form = parse_qs(body.decode("utf-8", "replace")) if b"Action=" in body else {}
                action = (form.get("Action") or [""])[0]
                if not action:  # not EC2's Query API: pass through
                    self._send(*proxy._forward(self.command, self.path, headers, body))
                    return
                token = (form.get("ClientToken") or [""])[0] if action == "RunInstances" else ""
                if token:
                    with proxy.lock:
                        proxy.stats.launch_attempts[token].append(time.monotonic())
                kind = proxy._decide(action)
                if kind == "capacity":
                    message = "We currently do not have sufficient capacity in the Availability Zone you requested."
                    self._send(500, [("Content-Type", "text/xml")], _error("InsufficientInstanceCapacity", message))
                elif kind == "throttle":
                    self._send(
                        503, [("Content-Type", "text/xml")], _error("RequestLimitExceeded", "Request limit exceeded.")
                    )
                elif kind == "server":
                    with proxy.lock:
                        code, status = proxy.rng.choice([("InternalError", 500), ("Unavailable", 503)])
                    self._send(status, [("Content-Type", "text/xml")], _error(code, "An internal error has occurred"))
                elif kind == "timeout":
                    with proxy.lock:
                        lost_response = proxy.rng.random() < 0.5
                    if lost_response:  # the request reached EC2; only its answer is lost
                        self.wfile = _Discard()  # type: ignore[assignment]
                        self._answer(action, token, headers, body)
                    time.sleep(proxy.hold_seconds)
                    self.close_connection = True
                else:
                    self._answer(action, token, headers, body)

            def _answer(self, action: str, token: str, headers: list[tuple[str, str]], body: bytes) -> None:
                if token:
                    with proxy.lock:
                        cached = proxy.token_answers.get(token)
                    if cached is not None:  # EC2 answers a repeated ClientToken with the first result
                        with proxy.lock:
                            proxy.stats.replayed_tokens += 1
                        self._send(*cached)
                        return
                status, resp_headers, data = proxy._forward(self.command, self.path, headers, body)
                if token and status == 200:
                    with proxy.lock:
                        proxy.token_answers.setdefault(token, (status, resp_headers, data))
                self._send(status, resp_headers, data)

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
    upstream: str, *, rate: float, seed: int = 1, hold_seconds: float = 1.5
) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream, rate=rate, seed=seed, hold_seconds=hold_seconds)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
