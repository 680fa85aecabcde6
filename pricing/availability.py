"""A spot pool's availability history as run lengths: how long its capacity stayed up, and how long it stayed away.

Pure (no I/O but `load_trace_runs`, which reads a trace file). Two sources:
- a spot availability trace (`{"metadata": {"gap_seconds": N}, "data": [1, 1, 0, ...]}`, as in spot-traces/):
  `runs_from_trace` returns its completed runs; the first and last run are cut off by the trace's edges, so their
  true length is unknown and they are left out rather than counted short;
- a stream of observed state changes `(at, up)` (the broker's price feeds saying a pool is or is not offered, and
  its own reclaims): `runs_from_events` returns the completed runs before `now`, the current state and its age.
Run lengths are hours. These feed `federation.strategies.PoolOutlook`, which only ever sees the past.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby, pairwise
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Runs:
    """Completed up and down runs, in hours."""

    up: tuple[float, ...] = ()
    down: tuple[float, ...] = ()

    def __add__(self, other: Runs) -> Runs:
        return Runs(self.up + other.up, self.down + other.down)


def runs_from_trace(values: Sequence[int], gap_seconds: float) -> Runs:
    """The completed runs of a 0/1 availability trace sampled every `gap_seconds` (edge runs left out)."""
    lengths = [(up > 0, sum(1 for _ in group)) for up, group in groupby(values, key=lambda v: v > 0)]
    up: list[float] = []
    down: list[float] = []
    for is_up, ticks in lengths[1:-1]:
        (up if is_up else down).append(ticks * gap_seconds / 3600)
    return Runs(tuple(up), tuple(down))


def load_trace_runs(path: Path) -> Runs:
    """Read a spot-traces JSON file and return its completed runs; ValueError naming the file when malformed."""
    try:
        doc = json.loads(path.read_text())
        gap = float(doc["metadata"]["gap_seconds"])
        values = [int(v) for v in doc["data"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a spot availability trace ({exc})") from exc
    return runs_from_trace(values, gap)


@dataclass(frozen=True, slots=True)
class Observed:
    """What state changes say at `now`: the completed runs, whether the pool is up, and for how long (hours)."""

    runs: Runs
    up: bool
    age_hours: float


def runs_from_events(events: Sequence[tuple[datetime, bool]], now: datetime) -> Observed | None:
    """Fold `(at, up)` observations (any order; repeats of the same state are no change) into runs up to `now`.
    The run before the first observation is unknown, so the first run counts only from its first change on.
    None without any observation at or before `now`."""
    past = sorted((at, up) for at, up in events if at <= now)
    if not past:
        return None
    changes: list[tuple[datetime, bool]] = [past[0]]
    for at, up in past[1:]:
        if up != changes[-1][1]:
            changes.append((at, up))
    up_runs: list[float] = []
    down_runs: list[float] = []
    for (start, up), (end, _) in pairwise(changes[1:]):  # changes[0] starts a run of unknown length
        (up_runs if up else down_runs).append((end - start).total_seconds() / 3600)
    last_at, last_up = changes[-1]
    return Observed(Runs(tuple(up_runs), tuple(down_runs)), last_up, (now - last_at).total_seconds() / 3600)
