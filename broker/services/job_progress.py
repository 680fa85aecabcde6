"""A job's reported progress and last durable checkpoint, from its instance agent's reports.

The agent reports the workload's progress file (`done` units of `total` for the whole job, `checkpoint` units in
the last checkpoint) with every progress, heartbeat, notice and final report; the broker keeps each report it took
(`placement_report`). `latest_reports(session, placement_ids)` reads the newest such report of each placement in
one query; `progress_public` and `checkpoint_public` turn it (and the placement's durable checkpoint,
`checkpointed_work_hours`, raised by `broker.services.agent_reports`) into the API's fields;
`remaining_from_progress` is the job's work left by its reported progress (None when it reports none), which the
API shows instead of the clock estimate.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, func
from sqlmodel import Session, col, select

from broker.api.schemas import CheckpointPublic, ProgressPublic
from broker.store.tables import Job, Placement, PlacementReport

_CARRIES_PROGRESS = ("progress", "heartbeat", "notice", "final")
_HOURS = Decimal("0.001")


def latest_reports(session: Session, placement_ids: list[str]) -> dict[str, PlacementReport]:
    """The newest report carrying progress of each placement (by the agent's seq), by placement id."""
    if not placement_ids:
        return {}
    newest = (
        select(PlacementReport.placement_id, func.max(PlacementReport.seq).label("seq"))  # type: ignore[call-overload]
        .where(col(PlacementReport.placement_id).in_(placement_ids), col(PlacementReport.kind).in_(_CARRIES_PROGRESS))
        .group_by(PlacementReport.placement_id)
        .subquery()
    )
    rows = session.exec(
        select(PlacementReport).join(
            newest, and_(PlacementReport.placement_id == newest.c.placement_id, PlacementReport.seq == newest.c.seq)
        )
    ).all()
    return {r.placement_id: r for r in rows}


def _progress(report: PlacementReport | None) -> dict[str, Any] | None:
    raw = report.data.get("progress") if report is not None and isinstance(report.data, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        done, total = float(raw["done"]), float(raw["total"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (math.isfinite(done) and math.isfinite(total)) or total <= 0 or done < 0:
        return None
    checkpoint = raw.get("checkpoint")
    try:
        units = float(checkpoint) if checkpoint is not None else None
    except (TypeError, ValueError):
        units = None
    return {"done": done, "total": total, "checkpoint": units if units is None or math.isfinite(units) else None}


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def progress_public(report: PlacementReport | None) -> ProgressPublic | None:
    """The units done of total the agent last reported, with when the broker received it; None if none."""
    raw = _progress(report)
    if raw is None or report is None:
        return None
    fraction = min(1.0, raw["done"] / raw["total"])
    return ProgressPublic(
        done=raw["done"], total=raw["total"], fraction=round(fraction, 6), reported_at=_aware(report.received_at)
    )


def checkpoint_public(job: Job, placement: Placement | None, report: PlacementReport | None) -> CheckpointPublic | None:
    """The last durable checkpoint (stored in the job's checkpoint store, as the agent reported it): the fraction
    and hours of the job's work it holds, and its units when the workload reports them; None before the first."""
    if placement is None or placement.checkpointed_work_hours is None or job.work_hours <= 0:
        return None
    saved = job.work_hours - placement.work_hours_at_start + placement.checkpointed_work_hours
    saved = min(job.work_hours, max(Decimal(0), saved))
    raw = _progress(report)
    return CheckpointPublic(
        fraction=round(float(saved / job.work_hours), 6),
        work_hours=saved.quantize(_HOURS),
        units=raw["checkpoint"] if raw is not None else None,
        placement_id=placement.id,
    )


def remaining_from_progress(job: Job, report: PlacementReport | None) -> Decimal | None:
    """The job's work left by its reported progress (its work estimate times the share not done); None if the job
    reports no progress."""
    raw = _progress(report)
    if raw is None:
        return None
    left = Decimal(1) - Decimal(str(min(1.0, raw["done"] / raw["total"])))
    return max(Decimal(0), job.work_hours * left).quantize(_HOURS)
