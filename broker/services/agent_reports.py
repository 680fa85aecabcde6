"""Take the instance agent's reports (`agent.protocol.Report`): check them, then record each once.

Two paths bring a report: the tenant's mailbox in the job's checkpoint store, read by the tick step
`broker.loop.mailbox`, and the callback `POST /v1/placements/{id}/reports` (broker/api/routes/placements.py). Both call
`check_report` and then, with the placement and its job row-locked, `take_report`; whichever comes first records
it, the other finds its `placement_report` row and changes nothing.

`check_report` refuses (`ReportRefused`, with why and an HTTP status) a report, in this order:
- that names another placement than the one it was delivered for, or is not signed with that placement's key,
  `broker.api.auth.callback_token(settings, placement id)` (403; `check_signature`, which needs no database, so
  known and unknown placements get the same answer until a signature is verified);
- whose placement is unknown (404: only a correctly signed report learns that);
- found in another tenant's mailbox than its placement's (403): a report is only taken from its own tenant's box;
- a `final` report without an outcome (422).

`take_report` records the report (once by placement and seq: reports may arrive twice, or out of order) and:
- any kind: `placement.last_report_at`, the heartbeat the orphan sweep and operators read;
- `started`: an `agent_started` event;
- `progress`, `heartbeat`, `notice`, `final` carrying `checkpointed` (the fraction of the job's whole work its
  durable checkpoint holds): `placement.checkpointed_work_hours` = the part of this placement's work saved, never
  lowered by a late older report, and the running job's `remaining_work_hours` from it: remaining work, ceilings and
  deadlines are judged on real progress. The job's work estimate (`job.work_hours`) turns the fraction into hours;
- `notice` of kind `preempt`: `placement.notice_deadline_at` (the provider's deadline, else `NOTICE_DEFAULT`
  ahead): the sync step leaves the instance alone until its final checkpoint lands or the deadline passes;
- `final`: `placement.outcome`, `exit_code` and `detail`, and an `attempt_reported` event with the log tail. The
  sync step turns the outcome into the verdict (broker.loop.sync).
A report for a placement that has already ended is recorded and otherwise ignored.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import Session

from agent import protocol as proto
from agent.bounded import HostileInput, bounded_time, clean_text
from broker.api.auth import callback_token
from broker.config.settings import Settings
from broker.services.jobs import add_event
from broker.store.tables import Job, Placement, PlacementReport
from providers.model import JobState, PlacementState

LIVE = (PlacementState.LAUNCHING.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value)
NOTICE_DEFAULT = timedelta(minutes=2)  # a preempt notice without a deadline: the shortest one a cloud gives
NOTICE_GRACE = timedelta(seconds=60)
# how far from now a notice's deadline may lie (clouds give minutes; a day covers a late report and any clock skew)
NOTICE_HORIZON = timedelta(days=1)  # past a notice's deadline, for the final checkpoint's upload and report
LOG_TAIL_CHARS = 4000  # of the final report's log tail, kept in the event
_HOURS = Decimal("0.000001")
# prefix of an infrastructure failure's `placement.detail` (broker.loop.sync): `place.refused_pools` then leaves
# that pool out of the job's choices
INFRA_FAILED = "InfraFailed"


class ReportRefused(Exception):
    """A report that is not taken; `status` is the HTTP status the callback answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_report(data: bytes | str) -> proto.Report:
    """Parse a report's JSON; ReportRefused(422) naming the field when it does not follow the contract."""
    try:
        report = proto.Report.from_json(data)
    except proto.ProtocolError as exc:
        raise ReportRefused(422, f"report: {exc}") from None
    if not 0 < report.seq < 2**63:
        raise ReportRefused(422, "report.seq must be a positive 63-bit integer")
    return report


def check_signature(settings: Settings, report: proto.Report, placement_id: str) -> None:
    """ReportRefused(403) unless `report` names `placement_id` and is signed with its report key. Needs no database:
    the key is derived from the placement id, so a forged report for an unknown placement and one for a known
    placement get the same answer (no existence oracle); only a verified report learns whether its placement
    exists."""
    if report.placement_id != placement_id:
        raise ReportRefused(403, "report.placement_id: not the placement it was delivered for")
    if not report.verify(callback_token(settings, placement_id)):
        raise ReportRefused(403, "report.signature: not signed with this placement's report key")


def check_report(
    settings: Settings, p: Placement | None, report: proto.Report, *, placement_id: str, tenant: str | None = None
) -> None:
    """Raise ReportRefused unless `report` may be taken for placement `placement_id` (`p`, None if unknown) found
    in `tenant`'s mailbox (None: delivered by the callback). See the module docstring."""
    check_signature(settings, report, placement_id)
    if p is None:
        raise ReportRefused(404, f"no placement {placement_id!r}")
    if tenant is not None and tenant != p.tenant:
        raise ReportRefused(403, f"placement {p.id!r} is not tenant {tenant!r}'s: its reports go to its own mailbox")
    if report.kind is proto.ReportKind.FINAL and report.outcome is None:
        raise ReportRefused(422, "report.outcome: a final report must carry the attempt's outcome")


def take_report(session: Session, p: Placement, job: Job, report: proto.Report, via: str, now: datetime) -> bool:
    """Record a checked report on the row-locked placement `p` and its job (see the module docstring). Returns
    False when it was taken before (nothing changes). The caller commits. Raises ReportRefused(422) for a notice
    whose deadline lies beyond `NOTICE_HORIZON` of `now` (checked before anything is written or computed with
    it). Text is stored cleaned (`agent.bounded.clean_text`: no NUL, no control characters, no lone surrogates)."""
    deadline = notice_deadline(report, now)
    data = _cleaned(asdict(report))
    data.pop("signature")
    table = PlacementReport.__table__  # type: ignore[attr-defined]
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    row = {
        "placement_id": p.id,
        "seq": report.seq,
        "kind": report.kind.value,
        "via": via,
        "received_at": now,
        "data": json.loads(json.dumps(data, default=str)),
    }
    # RETURNING, not the row count: through psycopg 3 that read -1 for this INSERT ... ON CONFLICT DO NOTHING, so
    # on PostgreSQL every report looked taken before and none was ever applied (tests/poison found it)
    fresh = insert(table).values(**row).on_conflict_do_nothing(index_elements=["placement_id", "seq"])
    inserted = session.execute(fresh.returning(table.c.seq)).first()
    if inserted is None:
        return False
    p.last_report_at = max(now, p.last_report_at) if p.last_report_at else now
    session.add(p)
    if p.state not in LIVE:
        return True
    kind = report.kind
    if report.checkpointed is not None:
        _checkpointed(p, job, report.checkpointed)
    if kind is proto.ReportKind.STARTED:
        add_event(
            session,
            job,
            now,
            "agent_started",
            f"the agent started the attempt ({clean_text(report.detail, 500)})",
            placement_id=p.id,
        )
    elif kind is proto.ReportKind.NOTICE and report.notice is not None:
        _notice(session, p, job, report.notice, deadline or now + NOTICE_DEFAULT, now)
    elif kind is proto.ReportKind.FINAL and p.outcome is None:
        assert report.outcome is not None
        p.outcome = report.outcome.value
        p.exit_code = report.exit_code
        p.detail = clean_text(report.detail, 500)
        tail = clean_text(report.log_tail[-LOG_TAIL_CHARS:], LOG_TAIL_CHARS)
        add_event(
            session,
            job,
            now,
            "attempt_reported",
            f"the agent reports {report.outcome.value} (exit code {report.exit_code}) {p.detail}".strip(),
            placement_id=p.id,
            outcome=report.outcome.value,
            exit_code=report.exit_code,
            via=via,
            log_tail=tail,
        )
    session.add(p)
    session.add(job)
    return True


def wakes_loop(report: proto.Report) -> bool:
    """A report the loop should act on at once rather than at its next tick: a final report (the verdict, a
    preempted attempt to re-place) or a preempt notice (its final report follows within seconds)."""
    if report.kind is proto.ReportKind.FINAL:
        return True
    return report.kind is proto.ReportKind.NOTICE and report.notice is not None and report.notice.kind == "preempt"


def _checkpointed(p: Placement, job: Job, fraction: float) -> None:
    """Raise the placement's saved work to what a durable checkpoint of `fraction` of the job holds."""
    fraction = min(1.0, max(0.0, fraction))
    remaining = job.work_hours * (Decimal(1) - Decimal(str(fraction)))
    saved = max(Decimal("0"), p.work_hours_at_start - remaining).quantize(_HOURS)
    if p.checkpointed_work_hours is not None and saved <= p.checkpointed_work_hours:
        return
    p.checkpointed_work_hours = saved
    if job.current_placement_id == p.id and job.state == JobState.RUNNING.value:
        job.remaining_work_hours = max(Decimal("0"), p.work_hours_at_start - saved)


def notice_deadline(report: proto.Report, now: datetime) -> datetime | None:
    """The deadline of `report`'s notice in UTC, None without one (or unreadable: the default applies, as for a
    notice without a deadline); ReportRefused(422) when it lies beyond `NOTICE_HORIZON` of `now` either way, so
    no time at the calendar's ends (9999-12-31, year 10000 in UTC) ever reaches deadline arithmetic."""
    if report.notice is None or not report.notice.deadline:
        return None
    if parse_time(report.notice.deadline) is None:
        return None
    try:
        return bounded_time(report.notice.deadline, "report.notice.deadline", now, NOTICE_HORIZON)
    except HostileInput as exc:
        raise ReportRefused(422, str(exc)) from None


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value, len(value))
    if isinstance(value, dict):
        return {k: _cleaned(v) for k, v in value.items()}
    return value


def _notice(session: Session, p: Placement, job: Job, notice: proto.Notice, deadline: datetime, now: datetime) -> None:
    if notice.kind != "preempt":
        add_event(
            session, job, now, "rebalance_notice", f"{notice.source} warns of elevated reclaim risk", placement_id=p.id
        )
        return
    if p.notice_deadline_at is None or deadline < p.notice_deadline_at:
        p.notice_deadline_at = deadline
    add_event(
        session,
        job,
        now,
        "interruption_notice",
        f"{notice.source} will reclaim the instance by {deadline.isoformat(timespec='seconds')}; the agent is "
        "saving a final checkpoint, the job is re-placed from it",
        placement_id=p.id,
        deadline=deadline.isoformat(),
        via="agent",
    )


def parse_time(value: str | None) -> datetime | None:
    """An ISO 8601 time with a zone, as the agent writes them; None for a missing or unreadable one (not range
    checked: `notice_deadline` does that)."""
    if not value or not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else None
