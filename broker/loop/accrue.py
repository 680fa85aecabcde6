"""Tick step: accrue the cost of the started placements that are due, as append-only ledger entries.

Cadence (`accrual_cadence_seconds`, default 60): a tick's cost should grow with what changed, not with what runs,
so a running placement is not accrued on every tick. Each placement has its own grid, a point every cadence at a
phase hashed from its id (`grid_point`), and it is due
- when a point of its grid passed since its mark: it is then accrued up to that point, so placements that started
  (or were marked, at a midnight or a price move) together still spread over the ticks, about
  tick-interval/cadence of them on each;
- at once when it ended (up to its end), or when its pool's price moved (up to now: the stretch at the old price,
  the new one from the tick that sees it), or when a UTC midnight passed (at least up to the midnight, so each
  day's ledger is complete one tick after it ends).
A cadence of 0 accrues every running placement up to now on every tick. Which placements may be due is one SQL
condition (`_Due.clauses`: a mark a cadence old or older, before midnight or off its grid (at its start, at a new
price segment, at midnight), or an offering whose price differs from a placement's price segment, found by one
DISTINCT read); `_Due.end` decides each of those candidates before any lock is taken, and again under the lock.
Between accruals the ledger and `job.spent_usd` trail the spend by up to a cadence and a tick: the ceiling guard
(`broker.loop.sync`), budgets and a lowered ceiling (`broker.finance.unaccrued`) add that stretch.
No event per accrual: the accrual that reaches a placement's end writes its one `cost_accrued` event (its total).

Each entry covers `[accrued_until, end)` at its price segment's rate (the pool's price when the segment began;
spot prices move mid-run) and records the on-demand counterfactual for savings. Amounts telescope within a
segment at one price: an entry is `Q(price x hours since the segment began) - Q(price x hours already accrued in
it)`, with Q rounding to 1e-10 USD, so the entries of a segment sum to exactly `Q(price x its duration)`, however
many accruals cut it.
Entries are also cut at UTC midnight, so every day and month holds exactly its own cost (reports never
prorate). On-prem placements accrue the same way at their pool's internal rate (`onprem_rate_usd_per_gpu_hour`
or a Slurm partition's `rate_usd_per_gpu_hour`).
When a preempted placement's last second is accrued, the compute since its last checkpoint is reclassified as
`wasted` (`broker.finance.ledger.record_wasted`).
Beside compute, a cloud instance bills its boot disk and its public IPv4 address (`rt.extras`, list prices from
`pricing.extras`, settings `OVERSPILL_DISK_USD_PER_GB_MONTH` / `OVERSPILL_PUBLIC_IPV4_USD_PER_HOUR`): each is its
own ledger entry over the same stretch as the compute, kind `disk` (unit GB-Hours, the billed size) or `public_ip`
(unit Hours), at a constant rate telescoped from the placement's start (so its entries also sum exactly), with no
spot saving (`on_demand_usd` = cost). They count in the placement's `cost_usd` and the job's `spent_usd`, so
budgets and ceilings see them; FOCUS reports them as Storage / Block Storage and Networking / Network
Infrastructure. The compute of lost work is reclassified as wasted; the disk and address are not (they are billed
whatever the work).
The placement's `accrued_until`, its `cost_usd`, the job's `spent_usd` and the entries are written in one
transaction under row locks, so a crash or a second replica can neither skip nor double-count a second.
Placements are accrued `loop_batch_size` (a setting) to a transaction, set-based: the batch's rows are locked and
read in two Core statements (plain rows: no ORM object per placement or job; of a job only the columns an entry
needs), every entry, event and new mark is computed in memory, and each kind of write is one statement for the
whole batch (`broker.store.bulk`: on PostgreSQL one statement per table for the whole batch, the rows sent as one
JSON parameter read by the server, for the ledger entries, the events, the placements' marks and the jobs'
totals). Only a preempted placement's final accrual goes on through the ORM and `record_wasted` (rare: once per
preemption).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.engine import Connection
from sqlmodel import Session, or_

from broker.crashpoints import crashpoint
from broker.finance.ledger import LEDGER_QUANTUM, day_cuts, entry_values, record_wasted
from broker.loop.common import in_scope
from broker.runtime import Runtime
from broker.services.bulkhead import Bulkhead, bulkhead, job_event
from broker.store.bulk import bulk_insert, bulk_update
from broker.store.tables import CostEntryRow, Job, JobEvent, Placement
from pricing.book import PriceBook
from pricing.extras import ExtraCharge
from providers.model import CostKind, PlacementState, hours_between

_P = Placement.__table__  # type: ignore[attr-defined]
_J = Job.__table__  # type: ignore[attr-defined]
# the placement columns accrual reads (its marks, its price, its entries' labels), not the whole row
_READ = tuple(
    _P.c[name]
    for name in (
        "id", "job_id", "state", "provider", "region", "zone", "instance_type", "instance_id", "capacity_type",
        "offering_key", "hourly_usd", "started_at", "ended_at", "accrued_until", "cost_usd",
        "price_segment_started_at", "price_segment_hourly_usd",
    )
)  # fmt: skip
# what deciding whether a placement is due reads (`_Due.end`), before locking only the due ones
_DUE_READ = tuple(
    _P.c[name]
    for name in (
        "id", "started_at", "ended_at", "accrued_until", "offering_key", "price_segment_hourly_usd",
    )
)  # fmt: skip
_E = CostEntryRow.__table__  # type: ignore[attr-defined]
_V = JobEvent.__table__  # type: ignore[attr-defined]


def _telescoped(hourly: Decimal, seg_start: datetime, start: datetime, end: datetime) -> Decimal:
    before = (hourly * hours_between(seg_start, start)).quantize(LEDGER_QUANTUM)
    return (hourly * hours_between(seg_start, end)).quantize(LEDGER_QUANTUM) - before


def accrue_costs(rt: Runtime, now: datetime) -> int:
    """Returns the number of ledger entries written (for the placements of this replica's shards that are due:
    `_Due`)."""
    book = rt.catalog.book(now)
    with Session(rt.engine) as session:
        due = _Due.at(rt, session.connection(), book, now)
        candidates = (
            session.connection()
            .execute(
                select(*_DUE_READ)
                .where(
                    _P.c.started_at.is_not(None),
                    or_(
                        and_(_P.c.state == PlacementState.RUNNING.value, or_(*due.clauses())),
                        _P.c.accrued_until < _P.c.ended_at,
                    ),
                    in_scope(rt, _P.c.id),
                )
                .order_by(_P.c.id)
            )
            .all()
        )
        ids = [p.id for p in candidates if due.end(p) is not None]
    written = 0
    size = rt.settings.loop_batch_size
    extras = {
        (provider, capacity): ex.charges(capacity)
        for provider, ex in rt.extras.items()
        for capacity in ("spot", "on_demand", "reserved")
    }
    with bulkhead(rt, "accrue_costs", now) as bh:
        ids = [i for i in ids if not bh.skip(i)] if bh.known else ids
        for start in range(0, len(ids), size):
            written += _accrue_batch(rt, ids[start : start + size], book, due, extras, bh)
    return written


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class _Due:
    """Which placements accrue this tick, and up to when (module docstring, "Cadence")."""

    now: datetime
    cadence: timedelta
    midnight: datetime  # the start of `now`'s UTC day
    book: PriceBook
    moved: frozenset[str]  # offerings whose price differs from some running placement's segment price

    @classmethod
    def at(cls, rt: Runtime, conn: Connection, book: PriceBook, now: datetime) -> _Due:
        """The plan for `now`: one read of the distinct (offering, segment price) pairs of the running placements
        in scope, compared with the price book, names the offerings whose price moved."""
        pairs = conn.execute(
            select(_P.c.offering_key, _P.c.price_segment_hourly_usd)
            .where(_P.c.state == PlacementState.RUNNING.value, _P.c.started_at.is_not(None), in_scope(rt, _P.c.id))
            .distinct()
        ).all()
        moved = frozenset(key for key, seg in pairs if _price_moved(book, key, seg))
        midnight = datetime.combine(now.astimezone(UTC).date(), time(0), tzinfo=UTC)
        return cls(now, timedelta(seconds=rt.settings.accrual_cadence_seconds), midnight, book, moved)

    def clauses(self) -> list[Any]:
        """SQL for "a running placement that may be due" (a superset: `end` decides for each row): its mark a
        cadence old or more, or before midnight, or off its grid (at its start, at a price move: a new segment
        starts at the mark, at midnight), or its offering's price moved."""
        out = [
            _P.c.accrued_until.is_(None),
            _P.c.accrued_until <= self.now - self.cadence,
            _P.c.accrued_until <= self.midnight,
            _P.c.accrued_until == _P.c.started_at,
            _P.c.accrued_until == _P.c.price_segment_started_at,
        ]
        if self.moved:
            out.append(_P.c.offering_key.in_(sorted(self.moved)))
        return out

    def end(self, p: Any) -> datetime | None:
        """Up to when `p` accrues now, or None when it is not due: its end, once it ended; now, when its price
        moved (or the cadence is 0); else, once its unaccrued stretch reached the cadence, its last grid point
        (`grid_point`); and at least the last UTC midnight, once one passed."""
        if p.started_at is None:
            return None
        start = p.accrued_until or p.started_at
        end: datetime | None
        if p.ended_at is not None:
            end = min(self.now, p.ended_at)
        elif not self.cadence or _price_moved(self.book, p.offering_key, p.price_segment_hourly_usd):
            end = self.now
        else:  # its grid point passed since its mark (a mark off the grid rejoins it at the next one)
            end = grid_point(p.id, self.now, self.cadence)
        if p.ended_at is None and start < self.midnight:
            end = max(end or self.midnight, self.midnight)
        return end if end is not None and end > start else None


def _price_moved(book: PriceBook, offering_key: str, segment_hourly: Decimal | None) -> bool:
    current = book.get(offering_key)
    return current is not None and segment_hourly is not None and current.price.hourly_usd != segment_hourly


def grid_point(pid: str, now: datetime, cadence: timedelta) -> datetime:
    """The last point at or before `now` of the placement's own accrual grid: every `cadence` from a phase in
    `[0, cadence)` hashed from its id. Placements accrue when their stretch crosses their grid point, so however
    they started (tens of thousands cloned at one instant, or restored after an outage), about
    tick-interval/cadence of them accrue on each tick, never all of them on one."""
    step = cadence // _US
    phase = zlib.crc32(pid.encode()) % step
    return now - _US * (((now - _EPOCH) // _US - phase) % step)


Extras = dict[tuple[str, str], tuple[ExtraCharge, ...]]


@dataclass
class _Writes:
    """What one batch writes, gathered in memory and sent as one statement per kind."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    marks: list[dict[str, Any]] = field(default_factory=list)
    spent: dict[str, Decimal] = field(default_factory=dict)  # job id -> its new spent_usd

    def mark(self) -> tuple[int, int, int, dict[str, Decimal]]:
        return len(self.entries), len(self.events), len(self.marks), dict(self.spent)

    def undo(self, mark: tuple[int, int, int, dict[str, Decimal]]) -> None:
        """Take back what was added since `mark` (one placement's accrual that raised half-way)."""
        del self.entries[mark[0] :], self.events[mark[1] :], self.marks[mark[2] :]
        self.spent = dict(mark[3])

    def send(self, session: Session) -> None:
        conn = session.connection()
        bulk_insert(conn, _E, self.entries)
        bulk_insert(conn, _V, self.events)
        bulk_update(conn, _P, "id", self.marks)
        bulk_update(conn, _J, "id", [{"id": job_id, "spent_usd": usd} for job_id, usd in self.spent.items()])


def _accrue_batch(rt: Runtime, ids: Sequence[str], book: PriceBook, due: _Due, extras: Extras, bh: Bulkhead) -> int:
    """Accrue a batch of placements in one transaction: the placements row-locked (skipping those another replica
    holds), then their jobs locked in id order, so two replicas' batches never wait on each other in a cycle. A
    placement whose accrual raises is left out whole (what it had added to the batch taken back), recorded on its
    job by the step's bulkhead, and the batch goes on without it."""
    now = due.now
    with Session(rt.engine) as session:
        locked_rows, jobs = _lock_rows(session, ids, due)
        if not locked_rows:
            return 0
        writes, placements, failed = _Writes(), [], []
        for p, end in locked_rows:
            before = writes.mark()
            with bh.item(p.id, lambda exc, quarantined, p=p: failed.append((p, exc, quarantined))):
                try:
                    _accrue_one(
                        p, jobs[p.job_id], book, now, end, extras.get((p.provider, p.capacity_type), ()), writes
                    )
                except Exception:
                    writes.undo(before)
                    raise
                placements.append((p, end))
        writes.send(session)
        for p, exc, quarantined in failed:
            job = session.get(Job, p.job_id)
            if job is not None:
                job_event(session, job, "accrue_costs", now, placement_id=p.id)(exc, quarantined)
        for (p, _), mark in zip(placements, writes.marks, strict=True):
            crashpoint("accrue.before_commit")  # each placement's entries written, the batch not committed yet
            if (
                p.state == PlacementState.PREEMPTED.value
                and p.ended_at is not None
                and mark["accrued_until"] == p.ended_at
            ):
                # the objects read after the batch's writes (its rows are locked by this transaction)
                placement = session.get(Placement, p.id, populate_existing=True)
                job = session.get(Job, p.job_id, populate_existing=True)
                assert placement is not None and job is not None
                record_wasted(session, job, placement, now)
        session.commit()
        crashpoint("accrue.after_commit")
    return len(writes.entries)


def _lock_rows(session: Session, ids: Sequence[str], due: _Due) -> tuple[list[tuple[Any, datetime]], dict[str, Any]]:
    """`broker.loop.common.lock_batch` in plain rows: the placements still due, with the end of their accrual
    (row-locked in id order, skipping those another replica holds; read again under the lock, so a placement
    another replica accrued meanwhile is no longer due), then their jobs' entry columns (locked in id order)."""
    conn = session.connection()
    placements = []
    for p in conn.execute(
        select(*_READ).where(_P.c.id.in_(ids)).order_by(_P.c.id).with_for_update(skip_locked=True, of=_P)
    ).all():
        end = due.end(p)
        if end is not None:
            placements.append((p, end))
    if not placements:
        return [], {}
    job_ids = sorted({p.job_id for p, _ in placements})
    jobs = conn.execute(
        select(_J.c.id, _J.c.tenant, _J.c.team, _J.c.project, _J.c.spent_usd)
        .where(_J.c.id.in_(job_ids))
        .order_by(_J.c.id)
        .with_for_update()
    )
    return placements, {j.id: j for j in jobs}


def _accrue_one(
    p: Any,
    job: Any,
    book: PriceBook,
    now: datetime,
    end: datetime,
    extras: tuple[ExtraCharge, ...],
    writes: _Writes,
) -> None:
    """Add to `writes` `p`'s entries (compute, then each of `extras`) from `accrued_until` to `end`, its new marks
    and its job's new total, and, when `end` is the placement's end, its `cost_accrued` event (`_final_event`).
    Reads `p` and `job` (a placement and a job, as objects or rows), changes neither."""
    assert p.started_at is not None
    start = p.accrued_until or p.started_at
    current = book.get(p.offering_key)
    hourly = current.price.hourly_usd if current is not None else (p.price_segment_hourly_usd or p.hourly_usd)
    twin = book.on_demand_price(current) if current is not None else None
    # no on-demand twin priced (or the pool is its own twin: on-demand, on-prem): claim no saving
    od_hourly = None if twin is None or twin is current else twin.price.hourly_usd
    # the stretch is charged at its price segment's rate, telescoped from the segment's start; when the price
    # moved, a new segment starts where this stretch ends (the tick that sees the new price)
    seg_start, rate = p.price_segment_started_at, p.price_segment_hourly_usd
    if seg_start is None or rate is None:  # its first stretch: at the price now
        seg_start, rate = start, hourly
    next_start, next_rate = (seg_start, rate) if rate == hourly else (end, hourly)
    spent = writes.spent.get(job.id, job.spent_usd)
    usd = Decimal("0")
    for a, b in day_cuts(start, end):
        part = _telescoped(rate, seg_start, a, b)
        entry = entry_values(
            job,
            kind=CostKind.COMPUTE,
            usd=part,
            start=a,
            end=b,
            now=now,
            placement=p,
            hourly_usd=rate,
            on_demand_usd=part if od_hourly is None else od_hourly * hours_between(a, b),
            quantity=hours_between(a, b),
        )
        writes.entries.append(entry)
        usd += part
        spent += entry["usd"]
    extras_usd = Decimal("0")
    for charge in extras:
        for a, b in day_cuts(start, end):
            part = _telescoped(charge.hourly_usd, p.started_at, a, b)  # a constant rate since the start
            entry = entry_values(
                job,
                kind=charge.kind,
                usd=part,
                start=a,
                end=b,
                now=now,
                placement=p,
                hourly_usd=charge.hourly_usd,
                on_demand_usd=part,
                quantity=charge.quantity_per_hour * hours_between(a, b),
                unit=charge.unit,
                note=charge.description,
            )
            writes.entries.append(entry)
            extras_usd += part
            spent += entry["usd"]
    writes.spent[job.id] = spent
    writes.marks.append(
        {
            "id": p.id,
            "accrued_until": end,
            "cost_usd": p.cost_usd + usd + extras_usd,
            "price_segment_started_at": next_start,
            "price_segment_hourly_usd": next_rate,
        }
    )
    if p.ended_at is not None and end == p.ended_at:
        writes.events.append(_final_event(p, job, p.cost_usd + usd + extras_usd, extras, spent))


def _final_event(p: Any, job: Any, total: Decimal, extras: tuple[ExtraCharge, ...], spent: Decimal) -> dict[str, Any]:
    """The one `cost_accrued` event of a placement, written by the accrual that reaches its end: what it cost in
    all (`usd`), split into compute and what the instance billed beside it (each extra telescopes from the start
    at a constant rate, so its total is `Q(rate x hours)`), and the job's total after it."""
    assert p.started_at is not None and p.ended_at is not None
    hours = hours_between(p.started_at, p.ended_at)
    extras_usd = sum(((c.hourly_usd * hours).quantize(LEDGER_QUANTUM) for c in extras), Decimal("0"))
    compute_usd = total - extras_usd
    message = f"${total.quantize(Decimal('0.0001'))} for {hours.quantize(Decimal('0.001'))} h on {p.offering_key}"
    if extras:
        message += (
            f" (${extras_usd.quantize(Decimal('0.0001'))} of it " + " and ".join(c.description for c in extras) + ")"
        )
    return {
        "job_id": job.id,
        "tenant": job.tenant,
        "at": p.ended_at,
        "kind": "cost_accrued",
        "message": message[:1000],
        "data": {
            "placement_id": p.id,
            "usd": str(total),
            "compute_usd": str(compute_usd),
            "extras_usd": str(extras_usd),
            "spent_usd": str(spent),
            "hours": str(hours),
        },
    }
