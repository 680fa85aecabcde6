"""Where a simulated provider keeps its instances, so the simulation survives broker restarts.

The simulated clouds stand in for external systems: their state must outlive a broker process and be shared by
every replica, exactly like a real cloud's. The broker injects a database-backed store; tests and the demo may
use `InMemorySimStore`.

Contract: `insert_if_absent` is atomic on `(provider, launch_token)` and returns the record that won, which makes
`launch` idempotent even under concurrent calls.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class SimRecord:
    provider: str
    launch_token: str
    instance_id: str
    offering_key: str
    launched_at: datetime
    data: dict[str, Any]
    terminated_at: datetime | None = None


class SimStore(Protocol):
    def insert_if_absent(self, record: SimRecord) -> SimRecord: ...

    def get(self, provider: str, instance_id: str) -> SimRecord | None: ...

    def get_many(self, provider: str, instance_ids: Sequence[str]) -> list[SimRecord]: ...

    def mark_terminated(self, provider: str, instance_id: str, at: datetime) -> None: ...

    def list(self, provider: str) -> list[SimRecord]: ...


class InMemorySimStore:
    """A thread-safe in-process store (one process only)."""

    def __init__(self) -> None:
        self._by_token: dict[tuple[str, str], SimRecord] = {}
        self._lock = threading.Lock()

    def insert_if_absent(self, record: SimRecord) -> SimRecord:
        with self._lock:
            key = (record.provider, record.launch_token)
            return self._by_token.setdefault(key, record)

    def get(self, provider: str, instance_id: str) -> SimRecord | None:
        with self._lock:
            for rec in self._by_token.values():
                if rec.provider == provider and rec.instance_id == instance_id:
                    return rec
        return None

    def get_many(self, provider: str, instance_ids: Sequence[str]) -> list[SimRecord]:
        wanted = set(instance_ids)
        with self._lock:
            return [r for r in self._by_token.values() if r.provider == provider and r.instance_id in wanted]

    def mark_terminated(self, provider: str, instance_id: str, at: datetime) -> None:
        with self._lock:
            for key, rec in self._by_token.items():
                if rec.provider == provider and rec.instance_id == instance_id and rec.terminated_at is None:
                    self._by_token[key] = replace(rec, terminated_at=at)

    def list(self, provider: str) -> list[SimRecord]:
        with self._lock:
            recs = [r for r in self._by_token.values() if r.provider == provider]
        return sorted(recs, key=lambda r: (r.launched_at, r.launch_token))
