"""A job's timeline as the API reads it: in time order, a page at a time, filtered by kind, accruals folded.

Contract of `list_events(engine, tenant, job_id, after=, limit=, kinds=, fold=)`:
- Events come in time order (`at`, then id for events of the same instant) and the page holds at most `limit`
  items; `next_cursor` is set when more follow. The cursor is an event id: `after=<id>` continues right after
  that event, so `next_cursor` is the last item's id, and a client watching a running job polls with the id of
  the last item it has seen. An `after` that is not an event of this job is a 422 naming `after`.
- `kinds` keeps only events of those kinds.
- With `fold` (the default) each run of consecutive `cost_accrued` events of one placement is one item (the loop
  now writes one per placement, at its end, `broker.loop.accrue`; timelines written before it accrued on a cadence
  hold one per tick, hundreds per job-hour): its `id` and `at` are the run's last, `data` sums `usd`,
  `compute_usd` and `extras_usd`, keeps the last `spent_usd`, and adds `accruals` (how many) and `from` (the
  first one's time). `fold=False` returns every accrual as written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, or_
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from broker.api.schemas import EventPage, EventPublic
from broker.services.errors import Unprocessable
from broker.store.tables import JobEvent

ACCRUAL = "cost_accrued"
SUMMED = ("usd", "compute_usd", "extras_usd")


def _position(session: Session, job_id: str, after: str) -> tuple[datetime, int]:
    """Where `after` (an event id of this job) sits in the timeline."""
    row = session.get(JobEvent, int(after)) if after.isascii() and after.isdigit() and len(after) < 19 else None
    if row is None or row.job_id != job_id:
        raise Unprocessable("after", "not an event of this job; pass an item's id (or next_cursor) unchanged")
    return row.at, row.id or 0


@dataclass
class _Item:
    """One item of the page: an event, or a run of folded accruals (`rows` > 1)."""

    first: JobEvent
    last: JobEvent
    rows: int = 1
    sums: dict[str, Decimal] = field(default_factory=dict)

    def absorbs(self, row: JobEvent) -> bool:
        return (
            self.first.kind == ACCRUAL
            and row.kind == ACCRUAL
            and row.data.get("placement_id") == self.first.data.get("placement_id")
        )

    def add(self, row: JobEvent) -> None:
        if not self.sums:
            self.sums = {k: _dec(self.first.data.get(k)) for k in SUMMED}
        for k in SUMMED:
            self.sums[k] += _dec(row.data.get(k))
        self.last = row
        self.rows += 1

    def public(self) -> EventPublic:
        last = self.last
        if self.rows == 1:
            return EventPublic(id=last.id or 0, at=last.at, kind=last.kind, message=last.message, data=last.data)
        data: dict[str, Any] = {
            **last.data,
            **{k: str(v) for k, v in self.sums.items()},
            "accruals": self.rows,
            "from": self.first.at.isoformat(),
        }
        message = (
            f"${self.sums['usd'].quantize(Decimal('0.0001'))} over {self.rows} accruals from "
            f"{self.first.at:%Y-%m-%d %H:%M} to {last.at:%Y-%m-%d %H:%M} UTC"
        )
        return EventPublic(id=last.id or 0, at=last.at, kind=ACCRUAL, message=message, data=data)


def _dec(value: Any) -> Decimal:
    try:
        return Decimal(str(value)) if value is not None else Decimal(0)
    except ArithmeticError:
        return Decimal(0)


def list_events(
    engine: Engine,
    job_id: str,
    *,
    after: str | None = None,
    limit: int = 200,
    kinds: list[str] | None = None,
    fold: bool = True,
) -> EventPage:
    """One page of the job's timeline (see the module contract). The caller has checked the job is the tenant's."""
    query = select(JobEvent).where(JobEvent.job_id == job_id)
    if kinds:
        query = query.where(col(JobEvent.kind).in_(kinds))
    items: list[_Item] = []
    more = False
    with Session(engine) as session:
        if after:
            at, event_id = _position(session, job_id, after)
            query = query.where(or_(col(JobEvent.at) > at, and_(col(JobEvent.at) == at, col(JobEvent.id) > event_id)))
        query = query.order_by(col(JobEvent.at), col(JobEvent.id)).execution_options(yield_per=500)
        for row in session.exec(query):
            if fold and items and items[-1].absorbs(row):
                items[-1].add(row)
                continue
            if len(items) == limit:
                more = True
                break
            items.append(_Item(row, row))
        page = [item.public() for item in items]
    return EventPage(items=page, next_cursor=str(page[-1].id) if more and page else None)
