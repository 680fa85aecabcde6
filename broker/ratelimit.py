"""Per-API-key rate limiting: a token bucket per presented key, 429 with `Retry-After` when it is empty.

Role: pure ASGI middleware in front of the app (cheaper than Starlette's BaseHTTPMiddleware). Contract:
- Each key gets `burst` requests at once and `rate` more per second after that. The bucket is found by a SHA-256
  of the presented credential (`Authorization: Bearer` or `X-API-Key`), never the key itself, and before the key
  is verified, so a flood is refused without paying the slow hash. A wrong key guessed with another key's id gets
  its own bucket: it cannot drain the real key's.
- A request with no key, or with a key this process has not verified yet (which costs a slow scrypt hash), also
  takes a token from its client address's bucket: guessing keys from one address is rate limited too.
- Health checks (`/healthz`, `/readyz`) are never limited.
- 429 answers say which limit was hit and when to retry: `Retry-After` in whole seconds (rounded up).

Several replicas: buckets live in each process's memory, so N API processes admit up to N x `rate` per key in
total (a client's connections are spread over the processes by the kernel or the load balancer). Size `rate` per
process, or put a shared limiter (the load balancer, API Gateway usage plans) in front for a global cap.
At most `max_buckets` buckets are kept (least recently used dropped).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})


class TokenBuckets:
    """Token buckets by key: `take(key)` returns 0 when a token was taken, else the seconds until one is there."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_buckets: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.max_buckets = max_buckets
        self.clock = clock
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: bytes) -> float:
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[key] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        return wait


def presented_key(scope: Scope) -> str | None:
    """The API key a request presents (Bearer or X-API-Key), as `broker.deps.get_principal` reads it."""
    key = None
    for name, value in scope.get("headers", ()):
        if name == b"x-api-key":
            key = value.decode("latin-1").strip()
        elif name == b"authorization":
            scheme, _, rest = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return rest.strip() or None
    return key or None


class RateLimit:
    """ASGI middleware applying `TokenBuckets` per key (and per client address for unverified keys)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        rate: float,
        burst: int,
        is_verified: Callable[[Scope, str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.keys = TokenBuckets(rate, burst, clock=clock)
        self.addresses = TokenBuckets(rate, burst, clock=clock)
        self.is_verified = is_verified or (lambda scope, key: False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        key = presented_key(scope)
        wait, which = 0.0, ""
        if key is not None:
            wait, which = self.keys.take(b"k" + hashlib.sha256(key.encode()).digest()), "this API key"
        if not wait and (key is None or not self.is_verified(scope, key)):
            client = scope.get("client")
            address = client[0] if client else "unknown"
            wait, which = self.addresses.take(b"a" + address.encode()), f"client address {address}"
        if wait:
            await _reject(send, wait, which, self.keys.rate, int(self.keys.burst))
            return
        await self.app(scope, receive, send)


async def _reject(send: Send, wait: float, which: str, rate: float, burst: int) -> None:
    retry_after = max(1, math.ceil(wait))
    message = (
        f"rate limit: too many requests for {which} (at most {burst} at once, then {rate:g} per second); "
        f"retry after {retry_after} s"
    )
    body = json.dumps({"message": message, "detail": []}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(retry_after).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
