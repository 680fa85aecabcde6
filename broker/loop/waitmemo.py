"""What the placement round remembers between rounds: the pending jobs it judged and found no pool for, so that a
job whose wait cannot have changed is skipped without being locked or judged again (`broker.loop.place`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pricing.book import PriceBook


@dataclass(frozen=True)
class Waiting:
    """A pending job as the placement round's selection reads it: its id and the columns its verdict reads besides
    its fixed shape (`fingerprint`: when it last changed, its limits, spend, work left and attempts; a PATCH moves
    at least one of them, even on a clock that did not move)."""

    job_id: str
    fingerprint: tuple[Any, ...]


class WaitMemo:
    """The jobs the last rounds judged and found no pool for (not paused, no deadline), with the `updated_at` their
    row had then, valid while the price book (the same object: the catalog rebuilds it when any price or pool
    changes), the blocklist and the set of spent hard budgets are the same. Such a job's wait cannot have changed
    until one of those or its own row does, so the round skips it without locking or judging it. Deadline jobs are
    never remembered (their verdict moves with the clock). One per process (`Runtime.wait_memo`)."""

    def __init__(self) -> None:
        self.book: PriceBook | None = None
        self.blocklist: frozenset[str] = frozenset()
        self.budgets: frozenset[int] = frozenset()
        self._seen: dict[str, tuple[Any, ...]] = {}

    def renew(self, book: PriceBook, blocklist: frozenset[str], budgets: frozenset[int]) -> WaitMemo:
        """This memo for a round on these inputs: emptied when any of them differs from the last round's."""
        if book is not self.book or blocklist != self.blocklist or budgets != self.budgets:
            self.book, self.blocklist, self.budgets = book, blocklist, budgets
            self._seen.clear()
        return self

    def forget(self) -> None:
        self.book = None
        self._seen.clear()

    def unchanged(self, w: Waiting) -> bool:
        return self._seen.get(w.job_id) == w.fingerprint

    def remember(self, w: Waiting) -> None:
        self._seen[w.job_id] = w.fingerprint

    def __len__(self) -> int:
        return len(self._seen)
