"""Tick step: read the instance agents' reports from the tenants' mailboxes in the checkpoint stores.

The agent writes every signed report to `<store>tenants/<tenant>/mailbox/<placement>-<seq>-<kind>.json`
(agent/protocol.py), the one path to the broker that needs no inbound reachability. Each tick, `read_mailboxes`:
1. finds the mailboxes that matter: one per (store, tenant) of the live placements that run the agent (those with
   an `attempt_uri`), so one list call per store and tenant, however many placements share it;
2. lists each, in name order (one placement's reports in the order they were made), and for each entry reads it,
   checks it (`broker.services.agent_reports.check_report`: a known placement of this mailbox's tenant, signed
   with that placement's key) and takes it once under the placement's and its job's row locks
   (`take_report`), then deletes it. A report the callback already brought is only deleted;
3. refuses what does not follow the contract (a name it never makes, an oversized body, an unknown placement,
   another tenant's placement: all known before the body is parsed; then a body that is not a report, nested
   deeper than a report is or holding out-of-range values, `agent.bounded.load_json`, or a bad signature): logged,
   never applied, and deleted so it cannot pile up. An entry whose placement another replica holds locked is left
   for the next tick.
4. guards each entry with the step's bulkhead (`broker.services.bulkhead`): an unexpected error on one entry is logged
   with its name, counted, and the step goes on with the next entry and the next mailbox; an entry that fails
   `tick_item_quarantine_after` ticks in a row is moved aside to `quarantine/<name>` in its mailbox (which the step
   never reads) and left there for an operator.
With several tick replicas, each reads the mailboxes of its shards' live placements (`broker.store.shards`) and takes
only the entries of placements in its shards; the others are left to the replica holding theirs (a straggler of
a placement that ended waits until that replica next lists the mailbox).
A store that cannot be listed is logged and tried again next tick: the reports wait there. The verdicts the final
reports carry are applied by the sync step, which runs next (broker.loop.sync).
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlmodel import Session, col, select

from agent import protocol as proto
from broker.agent_side import checkpoint_layout as layout
from broker.config.checkpoint_stores import CheckpointRefused
from broker.loop.common import bind_job, in_scope, locked
from broker.runtime import Runtime
from broker.services.agent_reports import LIVE, ReportRefused, check_report, parse_report, take_report
from broker.services.bulkhead import Bulkhead, Record, bulkhead
from broker.store.tables import Job, Placement
from providers.storage import StorageError
from providers.storage.base import ObjectStore
from providers.storage.small import put_object

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 64 * 1024


def read_mailboxes(rt: Runtime, now: datetime) -> int:
    """Returns the number of reports taken (each counted once, whichever tick or path took it)."""
    with Session(rt.engine) as session:
        rows = session.exec(
            select(Placement.tenant, Placement.attempt_uri).where(  # type: ignore[call-overload]
                col(Placement.state).in_(LIVE), col(Placement.attempt_uri).is_not(None), in_scope(rt, Placement.id)
            )
        ).all()
    boxes: dict[str, str] = {}
    for tenant, attempt_uri in rows:
        prefix = _mailbox_of(rt, tenant, attempt_uri)
        if prefix is not None:
            boxes[prefix] = tenant
    with bulkhead(rt, "read_mailboxes", now) as bh:
        return _read(rt, boxes, now, bh)


QUARANTINE = "quarantine/"


def _read(rt: Runtime, boxes: dict[str, str], now: datetime, bh: Bulkhead) -> int:
    taken = 0
    for prefix, tenant in sorted(boxes.items()):
        try:
            store = rt.checkpoint_stores.store(prefix)
            names = sorted(info.key for info in store.list(""))
        except (StorageError, CheckpointRefused, ValueError) as exc:
            log.warning("listing the mailbox %s failed (its reports wait for the next tick): %s", prefix, exc)
            continue
        for name in names:
            bind_job(None)
            key = prefix + name
            if name.startswith(QUARANTINE) or bh.skip(key) or not _ours(rt, name):
                continue
            try:
                with bh.item(key, _aside(store, prefix, name), passes=(StorageError,)):
                    taken += _take(rt, store, prefix, tenant, name, now)
            except StorageError as exc:
                log.warning("reading the report %s%s failed (retried next tick): %s", prefix, name, exc)
    return taken


def _aside(store: ObjectStore, prefix: str, name: str) -> Record:
    """The bulkhead's record for a mailbox entry: once quarantined, moved to `quarantine/<name>` in its mailbox."""

    def record(exc: BaseException, quarantined: bool) -> None:
        if not quarantined:
            return
        info = store.stat(name)
        if info is not None and info.size <= MAX_REPORT_BYTES:
            put_object(store, QUARANTINE + name, b"".join(store.open_read(name, version=info.version)))
        store.delete(name)
        log.warning("moved the mailbox entry %s%s aside to %s%s%s", prefix, name, prefix, QUARANTINE, name)

    return record


def _ours(rt: Runtime, name: str) -> bool:
    """The entry's placement is in this tick's shards (a name that does not parse is anyone's to refuse)."""
    parsed = proto.parse_mailbox_entry_name(name)
    return rt.shards is None or parsed is None or rt.shards.holds(parsed[0])


def _mailbox_of(rt: Runtime, tenant: str, attempt_uri: str) -> str | None:
    """The tenant's mailbox in the store holding `attempt_uri` (the longest configured store prefix under it)."""
    stores = [s for s in rt.checkpoint_stores.by_location.values() if attempt_uri.startswith(s)]
    if not stores:
        return None
    try:
        return layout.mailbox_prefix(max(stores, key=len), tenant)
    except ValueError:
        return None


def _take(rt: Runtime, store: ObjectStore, prefix: str, tenant: str, name: str, now: datetime) -> int:
    parsed = proto.parse_mailbox_entry_name(name)
    if parsed is None:
        return _refuse(store, prefix, name, "not a report name this contract makes")
    placement_id, seq, _ = parsed
    info = store.stat(name)
    if info is None:
        return 0  # deleted meanwhile (another replica took it)
    if info.size > MAX_REPORT_BYTES:
        return _refuse(store, prefix, name, f"{info.size} bytes, over the {MAX_REPORT_BYTES} byte limit of a report")
    with Session(rt.engine) as session:  # who may write here is known before a byte of the body is parsed
        owner = session.exec(select(Placement.tenant).where(Placement.id == placement_id)).first()
    if owner is None:
        return _refuse(store, prefix, name, f"no placement {placement_id!r}")
    if owner != tenant:
        return _refuse(store, prefix, name, f"placement {placement_id!r} is not tenant {tenant!r}'s")
    data = b"".join(store.open_read(name, version=info.version))
    if len(data) > MAX_REPORT_BYTES:
        return _refuse(store, prefix, name, f"over the {MAX_REPORT_BYTES} byte limit of a report")
    try:
        report = parse_report(data)
        if report.seq != seq:
            raise ReportRefused(403, f"report.seq {report.seq} is not the {seq} its name says")
        with Session(rt.engine, expire_on_commit=False) as session:
            known = session.get(Placement, placement_id)
            check_report(rt.settings, known, report, placement_id=placement_id, tenant=tenant)
            p = session.exec(locked(select(Placement).where(Placement.id == placement_id))).first()
            if p is None:
                return 0  # another replica holds it: next tick
            job = session.exec(select(Job).where(Job.id == p.job_id).with_for_update()).one()
            bind_job(job, p)
            took = take_report(session, p, job, report, "mailbox", now)
            session.commit()
    except ReportRefused as exc:
        return _refuse(store, prefix, name, str(exc))
    store.delete(name)
    return int(took)


def _refuse(store: ObjectStore, prefix: str, name: str, why: str) -> int:
    log.warning("refused the mailbox entry %s%s: %s; deleting it, never applied", prefix, name, why)
    try:
        store.delete(name)
    except (StorageError, ValueError) as exc:
        log.warning("deleting the refused entry %s%s failed: %s", prefix, name, exc)
    return 0
