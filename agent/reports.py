"""Deliver the agent's signed reports to the broker through a path that needs no inbound reachability.

Every report is signed with the attempt's `report_key` (`protocol.Report.signed`), written first to a spool
directory on local disk, then:
- to the tenant's mailbox in the store (`mailbox_uri` + `protocol.mailbox_entry_name`), which the broker's sync step
  reads: retried in order with backoff until the store takes it (the mailbox is the source of truth; a report stays
  on disk until then, and a restarted agent sends what its spool still holds);
- and, when the spec has a `callback_url`, POSTed there once as JSON (`Content-Type: application/json`) for a faster
  path. A failed POST is only logged: the broker applies each report once, by placement and `seq`, whichever path
  brings it first, and a lost callback can never change what the mailbox says.

`seq` is the agent's clock in microseconds, bumped past the previous report's, so it only grows for one placement,
also across an agent restart (the last value is kept in the spool).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from agent import net
from agent.compat import UTC
from agent.protocol import Report, ReportKind, mailbox_entry_name
from agent.stores import Store, StoreError

log = logging.getLogger("overspill.agent.reports")


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Reporter:
    def __init__(
        self,
        *,
        placement_id: str,
        key_hex: str,
        store: Store,
        mailbox_prefix: str,
        spool_dir: Path,
        callback_url: str | None = None,
        callback_timeout: float = 5.0,
    ) -> None:
        self.placement_id = placement_id
        self._key = key_hex
        self.store = store
        self.prefix = mailbox_prefix
        self.spool = spool_dir
        self.spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.callback_url = callback_url
        self.callback_timeout = callback_timeout
        self._lock = threading.Condition()
        self._seq = self._load_seq()
        self._closing = False
        self._abandon = False  # set when close() gives up: the mailbox loop stops retrying
        self._callbacks: queue.Queue[Report | None] = queue.Queue()
        self._mailbox = threading.Thread(target=self._mailbox_loop, name="report-mailbox", daemon=True)
        self._mailbox.start()
        self._callback = threading.Thread(target=self._callback_loop, name="report-callback", daemon=True)
        if callback_url:
            self._callback.start()

    def _load_seq(self) -> int:
        try:
            return int((self.spool / "seq").read_text())
        except (OSError, ValueError):
            return 0

    def send(self, kind: ReportKind, **fields: Any) -> Report:
        """Sign and queue a report; returns it (with its seq). Never blocks on the network."""
        with self._lock:
            self._seq = max(time.time_ns() // 1000, self._seq + 1)
            report = Report(placement_id=self.placement_id, seq=self._seq, kind=kind, at=utc_now_iso(), **fields)
            report = report.signed(self._key)
            name = mailbox_entry_name(report)
            tmp = self.spool / (name + ".tmp")
            tmp.write_bytes(report.to_json())
            os.replace(tmp, self.spool / name)
            (self.spool / "seq.tmp").write_text(str(self._seq))
            os.replace(self.spool / "seq.tmp", self.spool / "seq")
            self._lock.notify_all()
        if self.callback_url:
            self._callbacks.put(report)
        return report

    def _pending(self) -> list[Path]:
        return sorted(p for p in self.spool.iterdir() if p.name.endswith(".json"))

    def _mailbox_loop(self) -> None:
        delay = 0.5
        while True:
            with self._lock:
                while not (pending := self._pending()):
                    if self._closing:
                        return
                    self._lock.wait(1.0)
            path = pending[0]
            data = path.read_bytes()
            try:
                self.store.put(self.prefix + path.name, data, content_type="application/json")
            except StoreError as exc:
                log.warning("mailbox write of %s failed, kept on disk, retrying in %.1fs: %s", path.name, delay, exc)
                with self._lock:
                    if self._closing and self._abandon:
                        return
                    self._lock.wait(delay)
                delay = min(60.0, delay * 2)
                continue
            delay = 0.5
            path.unlink()

    def _callback_loop(self) -> None:
        assert self.callback_url
        while (report := self._callbacks.get()) is not None:
            try:
                resp = net.request(
                    "POST",
                    self.callback_url,
                    headers={"Content-Type": "application/json"},
                    body=report.to_json(),
                    timeout=self.callback_timeout,
                )
                if resp.status >= 300:
                    log.info("callback for report %s: HTTP %s (the mailbox has it anyway)", report.seq, resp.status)
            except net.NetError as exc:
                log.info("callback for report %s failed (the mailbox has it anyway): %s", report.seq, exc)

    def close(self, timeout: float) -> bool:
        """Deliver what is queued to the mailbox within `timeout`; True when nothing is left on disk."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._callbacks.put(None)
        self._mailbox.join(max(0.0, deadline - time.monotonic()))
        if self.callback_url:
            self._callback.join(max(0.0, min(self.callback_timeout + 1, deadline - time.monotonic())))
        with self._lock:
            self._abandon = True
            self._lock.notify_all()
        return not self._pending()
