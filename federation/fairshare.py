"""Fair share across tenants: in what order one placement round looks at pending jobs.

Pure (no database, no clock). Tenants take turns in weighted fair share, as Kueue's fair sharing and Slurm's
fairshare factor do: each tenant's share of a round is its weight (an operator setting) over the sum of the
weights of the tenants with jobs waiting, counted against what it already runs. Concretely a stride scheduler: a
tenant's "pass" is (jobs it runs + jobs taken for it this round + 1) / its weight (the finish tag of its next job,
as in weighted fair queueing), and the next job comes from the tenant with the lowest pass (ties by tenant name,
so the order is deterministic). A job's `priority` orders it only within its own tenant (the caller's queues are
in that order): no priority, however high, moves a tenant ahead of another's turn. A tenant with thousands of jobs
at top priority therefore takes at most its share of a round, and every other tenant with a waiting job is looked
at in the same round.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

DEFAULT_WEIGHT = 1.0


def fair_order(
    queues: Mapping[str, Sequence[T]],
    limit: int,
    *,
    weights: Mapping[str, float] | None = None,
    running: Mapping[str, int] | None = None,
    default_weight: float = DEFAULT_WEIGHT,
) -> list[T]:
    """At most `limit` items from `queues` (tenant -> its waiting jobs, best first), interleaved in weighted fair
    share: each pick goes to the tenant with the lowest (running + picked + 1) / weight, ties by tenant name, and takes
    that tenant's next item. A tenant missing from `weights` has `default_weight`; a weight <= 0 is treated as the
    smallest positive weight would be (the tenant still gets a turn once every other tenant is far ahead: never
    starved). `running` counts what each tenant already runs (its usage). Each queue keeps its own order."""
    if limit <= 0:
        return []
    weights = weights or {}
    running = running or {}
    heap: list[tuple[float, str]] = []
    for tenant, queue in queues.items():
        if queue:
            heap.append((_pass(running.get(tenant, 0), _weight(weights, tenant, default_weight)), tenant))
    heapq.heapify(heap)
    taken: dict[str, int] = {}
    out: list[T] = []
    while heap and len(out) < limit:
        _, tenant = heapq.heappop(heap)
        n = taken.get(tenant, 0)
        queue = queues[tenant]
        out.append(queue[n])
        taken[tenant] = n + 1
        if n + 1 < len(queue):
            used = running.get(tenant, 0) + n + 1
            heapq.heappush(heap, (_pass(used, _weight(weights, tenant, default_weight)), tenant))
    return out


_MIN_WEIGHT = 1e-6


def _weight(weights: Mapping[str, float], tenant: str, default: float) -> float:
    w = weights.get(tenant, default)
    return w if w > _MIN_WEIGHT else _MIN_WEIGHT


def _pass(used: int, weight: float) -> float:
    return (used + 1) / weight
