"""The note a waiting job shows (`wait_reason` in the API): never empty while it is `pending` or `starting`.

- `launch_times(session, offering_keys)`: each pool's measured launch times (placement made -> instance running)
  from its most recent placements: (median seconds, how many measured), by offering key.
- `waiting_note(job, placement, public_state, launch, now)`: the job's own note when it has one; else, for a job
  `starting`, "launch requested on <pool> at T; expected ready by T' (median of N launches on this pool)" (or that
  no launch on it has been measured yet, or that it is queued there); for a job `pending`, that it waits for the
  next placement round. Other states keep their note as it is.
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, col, select

from broker.store.tables import Job, Placement

LAUNCH_SAMPLE = 20  # recent launches per pool that make its measured launch time
_ROWS_PER_QUERY = 500


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def launch_times(session: Session, offering_keys: set[str]) -> dict[str, tuple[float, int]]:
    """See the module docstring; pools never launched are absent."""
    if not offering_keys:
        return {}
    rows = session.exec(
        select(Placement.offering_key, Placement.created_at, Placement.started_at)  # type: ignore[call-overload]
        .where(col(Placement.offering_key).in_(sorted(offering_keys)), col(Placement.started_at).is_not(None))
        .order_by(col(Placement.created_at).desc())
        .limit(_ROWS_PER_QUERY)
    ).all()
    samples: dict[str, list[float]] = {}
    for key, created, started in rows:
        seconds = (_aware(started) - _aware(created)).total_seconds()
        got = samples.setdefault(key, [])
        if seconds >= 0 and len(got) < LAUNCH_SAMPLE:
            got.append(seconds)
    return {key: (statistics.median(got), len(got)) for key, got in samples.items() if got}


def _at(at: datetime) -> str:
    return _aware(at).astimezone(UTC).strftime("%H:%M:%SZ")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def waiting_note(
    job: Job, placement: Placement | None, public_state: str, launch: tuple[float, int] | None, now: datetime | None
) -> str:
    """See the module docstring."""
    if job.wait_reason or public_state not in ("pending", "starting"):
        return job.wait_reason
    if public_state == "pending" or placement is None:
        return "waiting for the next placement round"
    requested = _aware(placement.created_at)
    note = f"launch requested on {placement.offering_key} at {_at(requested)}"
    if placement.state == "queued":
        note = f"queued on {placement.offering_key} since {_at(requested)}"
    if launch is None:
        return f"{note}; no launch on this pool measured yet"
    median, count = launch
    ready = requested + timedelta(seconds=median)
    late = now is not None and _aware(now) > ready
    tail = "overdue: " if late else ""
    launches = "launch" if count == 1 else f"median of {count} launches"
    return f"{note}; {tail}expected ready by {_at(ready)} ({_duration(median)}, {launches} on this pool)"
