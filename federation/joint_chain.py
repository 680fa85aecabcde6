"""The spot pools' joint availability as a Markov chain, fitted on their dated histories (pure, numpy).

Role: the model shared by the Bayes bound of `federation.simulate.information` (fitted on a trace) and the
`chain_dp` strategy of `federation.chain_dp` (fitted on the `Timeline`s the broker or the simulator records).
Zones that go down together (a region short of capacity) are one event here, not independent coin flips.

Model: time in steps of `step_seconds`; a step's state is (bitmask of the pools up in it, age bucket of that
bitmask). A pool is up in a step only if it is up for the whole step (a spot job there would be reclaimed by any
down moment). Ages count the steps a bitmask has held (1 = it changed this step), bucketed by `edges` (default 1 /
2-4 / 5-16 / 17+ steps: 0-15 min, 15-60 min, 1-4 h, 4 h+ at 15-minute steps). From (mask, b) the chain goes to
(mask, b) (a bucket wider than one step, or the last), to (mask, b + 1), or to (another mask, 0); the transition
matrix counts exactly those moves on the history plus `pseudo` on every allowed move (a Dirichlet prior), so it is
Markov by construction. State id = mask * len(edges) + bucket; bit z of a mask is pool z.

Contract: pure functions of their arguments; a history shorter than two steps gives the prior alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from federation.strategies import Timeline

EDGES = (1, 2, 5, 17)  # bucket b holds ages edges[b] .. edges[b + 1] - 1 steps (the last: edges[-1] and more)


def bucket_of(age: int, edges: Sequence[int] = EDGES) -> int:
    """The bucket of an age of `age` steps (>= 1)."""
    b = 0
    while b + 1 < len(edges) and age >= edges[b + 1]:
        b += 1
    return b


def allowed(edges: Sequence[int], nzones: int) -> np.ndarray:
    """(states, states) bool: the transitions the chain structure allows (see the module docstring)."""
    nb = len(edges)
    n = (1 << nzones) * nb
    ok = np.zeros((n, n), dtype=bool)
    for mask in range(1 << nzones):
        for b in range(nb):
            c = mask * nb + b
            last = b == nb - 1
            if last or edges[b + 1] - edges[b] > 1:
                ok[c, c] = True
            if not last:
                ok[c, c + 1] = True
            for other in range(1 << nzones):
                if other != mask:
                    ok[c, other * nb] = True
    return ok


def masks_of(up: np.ndarray) -> np.ndarray:
    """(zones, steps) bool -> the bitmask of the zones up at each step."""
    bits = np.asarray(up, dtype=np.int64)
    return (bits << np.arange(bits.shape[0])[:, None]).sum(axis=0)


def states_of_masks(masks: np.ndarray, edges: Sequence[int] = EDGES) -> np.ndarray:
    """The chain state at each step of a bitmask series (ages counted from its first step)."""
    out = np.empty(len(masks), dtype=np.int64)
    age = 0
    for i, m in enumerate(masks):
        age = age + 1 if i and m == masks[i - 1] else 1
        out[i] = int(m) * len(edges) + bucket_of(age, edges)
    return out


def transition_matrix(states: np.ndarray, edges: Sequence[int], nzones: int, pseudo: float) -> np.ndarray:
    """The fitted transition matrix of a state series: counted moves plus `pseudo` on every allowed one (a state
    never visited, with `pseudo` 0: uniform over its allowed moves)."""
    ok = allowed(edges, nzones)
    counts = np.where(ok, pseudo, 0.0)
    np.add.at(counts, (states[:-1], states[1:]), 1.0)
    unseen = counts.sum(axis=1) == 0
    counts[unseen] = ok[unseen]
    return counts / counts.sum(axis=1, keepdims=True)


def grid_up(timeline: Timeline, start: datetime, steps: int, step_seconds: float) -> np.ndarray:
    """(steps,) bool: whether the pool was up for the whole of each step [start + k step, start + (k + 1) step),
    from its timeline (the state after the last flip holds on). `start` must not be before `timeline.origin` (the
    state there is unknown)."""
    offset = (start - timeline.origin).total_seconds()
    if offset < 0:
        raise ValueError("the grid starts before the pool's history")
    flips = np.asarray(timeline.flips, dtype=float)
    bounds = offset + step_seconds * np.arange(steps + 1)
    at_start = np.searchsorted(flips, bounds[:-1], side="right")  # flips at or before each step's start
    before_end = np.searchsorted(flips, bounds[1:], side="left")  # flips strictly before each step's end
    up_at_start = (at_start % 2 == 0) == timeline.first_up
    return up_at_start & (before_end == at_start)


def shared_grid(timelines: Sequence[Timeline], end: datetime, step_seconds: float) -> np.ndarray:
    """(pools, steps) bool: `grid_up` of each pool over the history they all share, from the latest origin to
    `end` (whole steps; none when `end` is not past every origin)."""
    start = max(t.origin for t in timelines)
    steps = max(0, int((end - start).total_seconds() // step_seconds))
    return np.array([grid_up(t, start, steps, step_seconds) for t in timelines]).reshape(len(timelines), steps)


def fit_grid(up: np.ndarray, edges: Sequence[int] = EDGES, pseudo: float = 0.1) -> np.ndarray:
    """The transition matrix of the joint chain of the pools whose steps are the rows of `up`."""
    return transition_matrix(states_of_masks(masks_of(up), edges), edges, up.shape[0], pseudo)


def fit_timelines(
    timelines: Sequence[Timeline],
    end: datetime,
    step_seconds: float,
    edges: Sequence[int] = EDGES,
    pseudo: float = 0.1,
) -> tuple[np.ndarray, int]:
    """The transition matrix of the pools' joint chain over the history they share (`shared_grid`), and the
    number of steps it was counted on."""
    up = shared_grid(timelines, end, step_seconds)
    return fit_grid(up, edges, pseudo), up.shape[1]
