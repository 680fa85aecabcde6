"""Bounded retries with full-jitter exponential backoff for cloud API calls.

Role: adapters wrap each SDK call in `RetryPolicy.call(fn, retryable)`. Only transient failures are retried
(throttling, 5xx, timeouts, dropped connections: whatever `retryable` says); a definitive answer (no capacity in
this zone, quota, credentials, bad request) is returned at once so the broker can fail over instead of hammering a
pool that said no. Attempts are bounded (`attempts`, the first call included) and spaced by full jitter
(`uniform(0, min(cap, base * 2**n))`, as in AWS's "Exponential Backoff and Jitter"), so a fleet of replicas
retrying together does not synchronise. The SDK's own retries should be off (botocore `total_max_attempts=1`)
so the two layers do not multiply.

`attempts_made` counts every call this policy made (for the fault benchmarks: attempts per placement).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("a retry policy needs at least one attempt")

    def delay(self, retry: int) -> float:
        """The pause before retry number `retry` (1 = the first retry)."""
        return self.rng.uniform(0.0, min(self.cap_seconds, self.base_seconds * 2 ** (retry - 1)))

    def call(self, fn: Callable[[], T], retryable: Callable[[BaseException], bool]) -> T:
        """`fn()`, retried on exceptions `retryable` accepts, at most `attempts` calls in all; the last
        exception is raised as it was."""
        for n in range(1, self.attempts + 1):
            with self._lock:
                self.attempts_made += 1
            try:
                return fn()
            except Exception as exc:
                if n >= self.attempts or not retryable(exc):
                    raise
                pause = self.delay(n)
                with self._lock:
                    self.retries_made += 1
                    self.slept_seconds += pause
                self.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover
