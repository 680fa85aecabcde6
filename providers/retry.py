"""Bounded retries with full-jitter exponential backoff for cloud API calls.

Role: adapters wrap each SDK call in `RetryPolicy.call(fn, retryable)`. Only transient failures are retried
(throttling, 5xx, timeouts, dropped connections: whatever `retryable` says); a definitive answer (no capacity in
this zone, quota, credentials, bad request) is returned at once so the broker can fail over instead of hammering a
pool that said no. Attempts are bounded (`attempts`, the first call included) and spaced by full jitter
(`uniform(0, min(cap, base * 2**n))`, as in AWS's "Exponential Backoff and Jitter"), so a fleet of replicas
retrying together does not synchronise. The SDK's own retries should be off (botocore `total_max_attempts=1`,
google-api-core `retry=None`, azure-core `retry_total=0`) so the layers do not multiply.

Server hints: `call(..., retry_after=hint)` reads a failure's own wait hint (an HTTP `Retry-After`, as ARM sends
with every 429). A hint within `cap_seconds` is honoured (the pause is at least the hint); a longer one ends the
retries at once and the failure is raised (`deferred` counts these): the server asked for more patience than one
call should hold a tick for, so the caller (the broker's next tick) tries again later instead.

Counters, for the fault benchmarks: `attempts_made` (every call this policy made: attempts per placement),
`retries_made`, `slept_seconds` (backoff actually slept) and `deferred`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

T = TypeVar("T")


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """An HTTP `Retry-After` value (delay-seconds or an HTTP-date) as seconds from now; None when absent or
    unreadable. A date in the past is 0."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        at = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max(0.0, (at - (now or datetime.now(UTC))).total_seconds())


@dataclass
class RetryPolicy:
    attempts: int = 3
    base_seconds: float = 0.2
    cap_seconds: float = 2.0
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    attempts_made: int = 0
    retries_made: int = 0
    slept_seconds: float = 0.0
    deferred: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("a retry policy needs at least one attempt")

    def delay(self, retry: int) -> float:
        """The pause before retry number `retry` (1 = the first retry)."""
        return self.rng.uniform(0.0, min(self.cap_seconds, self.base_seconds * 2 ** (retry - 1)))

    def call(
        self,
        fn: Callable[[], T],
        retryable: Callable[[BaseException], bool],
        retry_after: Callable[[BaseException], float | None] | None = None,
    ) -> T:
        """`fn()`, retried on exceptions `retryable` accepts, at most `attempts` calls in all; the last
        exception is raised as it was. `retry_after(exc)` may give the server's wait hint (see the module
        docstring)."""
        for n in range(1, self.attempts + 1):
            with self._lock:
                self.attempts_made += 1
            try:
                return fn()
            except Exception as exc:
                if n >= self.attempts or not retryable(exc):
                    raise
                hint = retry_after(exc) if retry_after is not None else None
                if hint is not None and hint > self.cap_seconds:
                    with self._lock:
                        self.deferred += 1
                    raise
                pause = max(self.delay(n), hint or 0.0)
                with self._lock:
                    self.retries_made += 1
                    self.slept_seconds += pause
                self.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover
