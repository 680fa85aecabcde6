"""How many log streams (`GET /v1/jobs/{id}/logs?follow=true`) this API process holds open: a cap per tenant and
a cap for the whole process, so no submitter can hold the process's connections, memory or polls for everyone.

Role: one `FollowSlots` per app (`app.state.log_follows`). Contract:
- `acquire(tenant)` takes a slot and returns a `Slot`, or raises `FollowsFull` (the route answers 429 with
  `Retry-After`) when the tenant already holds `per_tenant` streams or the process `per_process`. It never waits.
- `Slot.release()` gives the slot back; calling it again does nothing (the stream's response releases it however it
  ends: the attempt ended, the client went away, the server shuts down, or sending failed before the first byte).
- `active()` / `active(tenant)`: the streams held now (for tests, metrics and the benchmark).
The counts are per process: N API processes hold up to N x the caps (each process's threads and sockets are its
own, which is what the caps protect).
"""

from __future__ import annotations

import threading


class FollowsFull(Exception):
    """No slot for another followed log: the message says which cap and its value."""


class Slot:
    """One held stream; `release()` is idempotent."""

    def __init__(self, owner: FollowSlots, tenant: str) -> None:
        self._owner = owner
        self.tenant = tenant
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._owner._release(self.tenant)


class FollowSlots:
    """Counts of followed logs held open, capped per tenant and per process (see the module docstring)."""

    def __init__(self, per_tenant: int, per_process: int) -> None:
        if per_tenant < 1 or per_process < 1:
            raise ValueError("follow caps must be at least 1")
        self.per_tenant = per_tenant
        self.per_process = per_process
        self._by_tenant: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def acquire(self, tenant: str) -> Slot:
        with self._lock:
            held = self._by_tenant.get(tenant, 0)
            if held >= self.per_tenant:
                raise FollowsFull(
                    f"follow: tenant {tenant!r} already follows {held} logs in this API process, the most it may "
                    f"(OVERSPILL_LOG_FOLLOW_MAX_PER_TENANT={self.per_tenant}); close one, or read without follow"
                )
            if self._total >= self.per_process:
                raise FollowsFull(
                    f"follow: this API process already streams {self._total} logs, the most it may "
                    f"(OVERSPILL_LOG_FOLLOW_MAX_PER_PROCESS={self.per_process}); retry later, or read without follow"
                )
            self._by_tenant[tenant] = held + 1
            self._total += 1
        return Slot(self, tenant)

    def _release(self, tenant: str) -> None:
        with self._lock:
            left = self._by_tenant.get(tenant, 0) - 1
            if left > 0:
                self._by_tenant[tenant] = left
            else:
                self._by_tenant.pop(tenant, None)
            self._total = max(0, self._total - 1)

    def active(self, tenant: str | None = None) -> int:
        with self._lock:
            return self._total if tenant is None else self._by_tenant.get(tenant, 0)
