"""Watch the provider's interruption notice from the instance's metadata server and hand each one to a callback.

- AWS (IMDSv2): `GET /latest/meta-data/spot/instance-action` answers 404 until the instance is to be stopped, then
  `{"action": "terminate|stop|hibernate", "time": "<UTC>"}`: a `preempt` notice with that deadline.
  `/latest/meta-data/events/recommendations/rebalance` answers `{"noticeTime": "<UTC>"}` when the risk is elevated:
  a `rebalance` notice (no deadline). Polled every 5 s, as AWS recommends.
- GCP: `GET /computeMetadata/v1/instance/preempted?wait_for_change=true` (header `Metadata-Flavor: Google`), a long
  poll that answers when the value changes; `TRUE` is a `preempt` notice. Google gives the guest about 30 s, so the
  deadline is 30 s after the change.
- Azure: Scheduled Events, `GET /metadata/scheduledevents?api-version=2020-07-01` (header `Metadata: true`), polled
  every second; a `Preempt` event (or `Terminate`) that names this VM (or names none) is a `preempt` notice with
  `NotBefore` as its deadline. `acknowledge()` POSTs `{"StartRequests": [{"EventId": ...}]}` so Azure may proceed
  at once (the agent calls it when the checkpoint is safe and the final report written).

Contract: `start()` runs the watcher in a daemon thread; `on_notice` is called from that thread once per distinct
notice (a rebalance, then a preempt, are two) and must be quick. Metadata errors are logged and polled again; the
watcher never raises. `stop()` ends it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

from agent import net
from agent.compat import UTC, parse_iso8601
from agent.identity import AwsIdentity, AzureIdentity, GcpIdentity, Identities, IdentityError
from agent.protocol import Notice, NoticeSource

log = logging.getLogger("overspill.agent.notices")
GCP_GRACE = timedelta(seconds=30)
AZURE_API = "2020-07-01"
DEFAULT_POLL = {NoticeSource.AWS: 5.0, NoticeSource.AZURE: 1.0, NoticeSource.GCP: 1.0}


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(text: str) -> datetime | None:
    try:
        return parse_iso8601(text).astimezone(UTC)
    except ValueError:
        pass
    try:
        return parsedate_to_datetime(text).astimezone(UTC)  # Azure: "Mon, 19 Sep 2016 18:29:47 GMT"
    except (TypeError, ValueError):
        return None


class NoticeWatcher:
    def __init__(
        self,
        source: NoticeSource,
        identities: Identities,
        on_notice: Callable[[Notice], None],
        *,
        poll_seconds: float | None = None,
    ) -> None:
        self.source = source
        self.identities = identities
        self.on_notice = on_notice
        self.poll = poll_seconds if poll_seconds is not None else DEFAULT_POLL.get(source, 5.0)
        self._stop = threading.Event()
        self._seen: set[str] = set()
        self.azure_events: list[str] = []  # EventIds of the Preempt events seen
        self.acknowledged: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"notices-{source.value}", daemon=True)

    def start(self) -> None:
        if self.source is not NoticeSource.NONE:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _emit(self, key: str, notice: Notice) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        log.warning("interruption notice: %s", notice)
        self.on_notice(notice)

    def _run(self) -> None:
        loop = {NoticeSource.AWS: self._aws, NoticeSource.GCP: self._gcp, NoticeSource.AZURE: self._azure}[self.source]
        errors = 0
        while not self._stop.is_set():
            try:
                loop()
                errors = 0
            except (net.NetError, IdentityError, ValueError) as exc:
                errors += 1
                if errors in (1, 10) or errors % 100 == 0:
                    log.warning("reading %s interruption notices failed (%d in a row): %s", self.source, errors, exc)
                self._stop.wait(min(10.0, self.poll * errors))

    # ------------------------------------------------------------------------------------------------------ AWS

    def _aws(self) -> None:
        aws: AwsIdentity = self.identities.aws
        while not self._stop.is_set():
            now = datetime.now(UTC)
            resp = aws.get("/latest/meta-data/spot/instance-action")
            if resp.status == 200:
                raw = json.loads(resp.body)
                deadline = _parse_time(str(raw.get("time", ""))) or now + timedelta(minutes=2)
                action = str(raw.get("action", "terminate"))
                self._emit(
                    f"aws-action-{action}-{raw.get('time')}",
                    Notice(NoticeSource.AWS, "preempt", _iso(now), _iso(deadline)),
                )
            elif resp.status != 404:
                raise net.status_error("AWS spot/instance-action", resp, aws.base)
            resp = aws.get("/latest/meta-data/events/recommendations/rebalance")
            if resp.status == 200:
                raw = json.loads(resp.body)
                self._emit(f"aws-rebalance-{raw.get('noticeTime')}", Notice(NoticeSource.AWS, "rebalance", _iso(now)))
            elif resp.status != 404:
                raise net.status_error("AWS events/recommendations/rebalance", resp, aws.base)
            self._stop.wait(self.poll)

    # ------------------------------------------------------------------------------------------------------ GCP

    def _gcp(self) -> None:
        gcp: GcpIdentity = self.identities.gcp
        etag = ""
        while not self._stop.is_set():
            url = gcp.url("instance/preempted")
            if etag:  # long poll until the value changes (Google holds the request open up to timeout_sec)
                url += f"?wait_for_change=true&timeout_sec=60&last_etag={etag}"
            resp = net.request("GET", url, headers=GcpIdentity.HEADERS, timeout=75, direct=True)
            if resp.status != 200:
                raise net.status_error("GCP instance/preempted", resp, url)
            etag = resp.header("etag") or etag or "0"
            if resp.text().strip().upper() == "TRUE":
                now = datetime.now(UTC)
                self._emit("gcp-preempted", Notice(NoticeSource.GCP, "preempt", _iso(now), _iso(now + GCP_GRACE)))
                self._stop.wait(self.poll)

    # ---------------------------------------------------------------------------------------------------- Azure

    def _events_url(self) -> str:
        return f"{self.identities.azure.base}/metadata/scheduledevents?api-version={AZURE_API}"

    def _azure(self) -> None:
        azure: AzureIdentity = self.identities.azure
        name = azure.vm_name()
        while not self._stop.is_set():
            url = self._events_url()
            resp = net.request("GET", url, headers=AzureIdentity.HEADERS, timeout=30, direct=True)
            if resp.status != 200:
                raise net.status_error("Azure scheduled events", resp, url)
            doc = json.loads(resp.body)
            for event in doc.get("Events", []) if isinstance(doc, dict) else []:
                if not isinstance(event, dict) or event.get("EventType") not in ("Preempt", "Terminate"):
                    continue
                resources = event.get("Resources") or []
                if name and resources and name not in resources:
                    continue
                now = datetime.now(UTC)
                deadline = _parse_time(str(event.get("NotBefore") or "")) or now + timedelta(seconds=30)
                event_id = str(event.get("EventId", ""))
                if event_id and event_id not in self.azure_events:
                    self.azure_events.append(event_id)
                self._emit(f"azure-{event_id}", Notice(NoticeSource.AZURE, "preempt", _iso(now), _iso(deadline)))
            self._stop.wait(self.poll)

    def acknowledge(self) -> None:
        """Tell Azure it may go ahead with the events seen (no-op elsewhere). Errors are logged, not raised."""
        todo = [e for e in self.azure_events if e not in self.acknowledged]
        if self.source is not NoticeSource.AZURE or not todo:
            return
        body = json.dumps({"StartRequests": [{"EventId": e} for e in todo]}).encode()
        url = self._events_url()
        try:
            resp = net.request(
                "POST", url, headers={**AzureIdentity.HEADERS, "Content-Type": "application/json"}, body=body,
                timeout=10, direct=True,
            )  # fmt: skip
        except net.NetError as exc:
            log.warning("acknowledging Azure scheduled events %s failed: %s", todo, exc)
            return
        if resp.status // 100 == 2:
            self.acknowledged += todo
        else:
            log.warning("acknowledging Azure scheduled events %s: HTTP %s", todo, resp.status)
