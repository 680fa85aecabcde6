"""Watching an agent-run job (issue 31, point 7), on moto EC2 + S3 with signed agent reports (the agent itself is
not booted: its reports and log chunks are written as it writes them):
- the reported progress and the last durable checkpoint are fields of the job, and the work left comes from the
  progress instead of the clock;
- a preempt notice and a final report wake the loop at once: the job is re-placed within seconds, not at the next
  tick (the interval here is an hour);
- `logs -f` follows the job across its attempts with a marker line per attempt, `--attempt N` reads attempt N,
  `attempts` lists them.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import uvicorn
from sqlmodel import Session, select
from typer.testing import CliRunner

from agent import protocol as proto
from broker.api.auth import callback_token
from broker.app import create_app
from broker.cli import watch
from broker.cli.main import app
from broker.loop.runner import wait_and_wake
from broker.loop.tick import tick
from broker.store.tables import Job, Placement
from overspill.client import BrokerClient
from tests.test_attempt_boot import _api
from tests.test_reports_mailbox import BUCKET, Launched, _body, launch
from tests.test_reports_mailbox import moto_url as moto_url

pytestmark = pytest.mark.integration


def _post(at: Launched, p: Placement, report: proto.Report) -> None:
    answer = at.api.post(f"/v1/placements/{p.id}/reports", json=_body(report))
    assert answer.status_code == 200 and answer.json() == {"taken": True}, answer.text


def _report(at: Launched, p: Placement, kind: proto.ReportKind, seq: int, **fields: object) -> proto.Report:
    r = proto.Report(p.id, seq, kind, at.now.isoformat(), **fields)  # type: ignore[arg-type]
    return r.signed(callback_token(at.rt.settings, p.id))


def _write_log(at: Launched, p: Placement, offset: int, text: bytes) -> None:
    assert p.attempt_uri is not None
    prefix = p.attempt_uri.removeprefix(f"s3://{BUCKET}/")
    at.s3.put_object(Bucket=BUCKET, Key=f"{prefix}{proto.LOGS_DIR}{proto.log_chunk_name(offset)}", Body=text)


def _placements(at: Launched) -> list[Placement]:
    with Session(at.rt.engine) as s:
        return list(s.exec(select(Placement).where(Placement.job_id == at.job_id)).all())


def _job(at: Launched) -> Job:
    with Session(at.rt.engine) as s:
        job = s.get(Job, at.job_id)
        assert job is not None
        return job


@contextlib.contextmanager
def _serving(at: Launched) -> Iterator[str]:
    """The broker's API for `at.rt` on a real uvicorn server (the CLI speaks HTTP)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(runtime=at.rt), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


def _notice(at: Launched) -> proto.Notice:
    return proto.Notice(proto.NoticeSource.AWS, "preempt", at.now.isoformat(), None)


@pytest.fixture
def at(moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Launched]:
    launched = launch(moto_url, tmp_path, monkeypatch, instance_types=["g5.xlarge", "g5.2xlarge"])
    yield launched
    launched.api.close()


def test_progress_and_the_last_durable_checkpoint_are_fields_of_the_job(at: Launched) -> None:
    before = at.api.get(f"/v1/jobs/{at.job_id}").json()
    assert before["progress"] is None and before["checkpoint"] is None
    work = Decimal(before["work_hours"])
    _post(
        at,
        at.placement,
        _report(
            at, at.placement, proto.ReportKind.PROGRESS, 5, progress=proto.Progress(600, 1000, 500), checkpointed=0.5
        ),
    )
    job = at.api.get(f"/v1/jobs/{at.job_id}").json()
    assert job["progress"]["done"] == 600 and job["progress"]["total"] == 1000 and job["progress"]["fraction"] == 0.6
    assert job["progress"]["reported_at"]
    assert job["checkpoint"] == {
        "fraction": 0.5,
        "work_hours": str((work / 2).quantize(Decimal("0.001"))),
        "units": 500.0,
        "placement_id": at.placement.id,
    }
    # the work left is what the progress says (40 % of the work), not the clock's countdown from the start
    assert Decimal(job["remaining_work_hours"]) == (work * Decimal("0.4")).quantize(Decimal("0.001"))
    [listed] = at.api.get("/v1/jobs").json()["items"]
    assert listed["progress"] == job["progress"] and listed["checkpoint"] == job["checkpoint"]
    # a heartbeat carrying newer progress moves it on
    _post(
        at, at.placement, _report(at, at.placement, proto.ReportKind.HEARTBEAT, 6, progress=proto.Progress(900, 1000))
    )
    job = at.api.get(f"/v1/jobs/{at.job_id}").json()
    assert job["progress"]["fraction"] == 0.9 and job["checkpoint"]["fraction"] == 0.5
    assert job["checkpoint"]["units"] is None, "that report names no checkpoint position"
    assert Decimal(job["remaining_work_hours"]) == (work * Decimal("0.1")).quantize(Decimal("0.001"))
    # the CLI shows them: `status` and the `jobs` table
    with _serving(at) as url:
        env = {"OVERSPILL_URL": url, "COLUMNS": "250"}
        status = CliRunner().invoke(app, ["status", at.job_id], env=env)
        assert status.exit_code == 0, status.output
        assert "900/1000 (90%)" in status.stdout and "50% of the work" in status.stdout
        listed = CliRunner().invoke(app, ["jobs"], env=env)
        assert listed.exit_code == 0 and "900/1000 (90%)" in listed.stdout, listed.stdout


def test_a_final_report_wakes_the_loop_and_the_job_is_re_placed_at_once(at: Launched) -> None:
    stop = threading.Event()
    woke: list[int] = []
    waiter = threading.Thread(target=lambda: woke.append(wait_and_wake(at.rt, stop, time.monotonic() + 3600)))
    waiter.start()
    try:
        first = at.placement
        _post(at, first, _report(at, first, proto.ReportKind.NOTICE, 1, notice=_notice(at)))
        # the final report comes by the mailbox only (no callback): the loop reads it while the notice runs
        final = _report(at, first, proto.ReportKind.FINAL, 2, outcome=proto.Outcome.PREEMPTED, checkpointed=0.5)
        at.post_mailbox(final)
        started = time.monotonic()
        while time.monotonic() - started < 20:
            job = _job(at)
            if job.current_placement_id not in (None, first.id) or job.state == "pending":
                break
            time.sleep(0.05)
        took = time.monotonic() - started
    finally:
        stop.set()
        waiter.join(timeout=30)
    [p] = [x for x in _placements(at) if x.id == first.id]
    assert p.state == "preempted", "the final report was taken without waiting for the hour-long tick"
    job = _job(at)
    assert job.current_placement_id != first.id, job
    assert took < 10, took
    assert woke and woke[0] >= 1


def test_logs_follow_the_job_across_its_attempts(at: Launched, capsys: pytest.CaptureFixture[str]) -> None:
    first = at.placement
    _write_log(at, first, 0, b"attempt one\n")
    follower_client = BrokerClient("http://testserver")
    follower_client._http = _api(at.rt)  # the app in-process, its own connection for the follower's thread
    out = io.BytesIO()
    capsys.readouterr()
    codes: list[int] = []
    follower = threading.Thread(target=lambda: codes.append(watch.follow_job(follower_client, at.job_id, out)))
    follower.start()
    deadline = time.monotonic() + 30
    while out.getvalue() != b"attempt one\n":
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    _post(at, first, _report(at, first, proto.ReportKind.NOTICE, 1, notice=_notice(at)))
    _post(at, first, _report(at, first, proto.ReportKind.FINAL, 2, outcome=proto.Outcome.PREEMPTED, checkpointed=0.5))
    tick(at.rt, at.now)
    [second] = [p for p in _placements(at) if p.id != first.id]
    assert second.attempt_uri, "re-placed on EC2, where the agent runs"
    _write_log(at, second, 0, b"attempt two\n")
    time.sleep(1.5)
    assert follower.is_alive(), "-f follows the job into its next attempt"
    _post(at, second, _report(at, second, proto.ReportKind.FINAL, 3, outcome=proto.Outcome.SUCCEEDED, exit_code=0))
    tick(at.rt, at.now)
    assert _job(at).state == "succeeded"
    follower.join(timeout=60)
    assert not follower.is_alive() and codes == [0], "-f ends once the job is over"
    assert out.getvalue() == b"attempt one\nattempt two\n"
    said = capsys.readouterr().err
    assert f"==> attempt 1 on aws/{first.zone}" in said and f"({first.id}) <==" in said
    assert f"==> attempt 2 on aws/{second.zone}" in said and f"({second.id}) <==" in said
    assert said.index("attempt 1 on") < said.index("attempt 2 on") < said.index(f"job {at.job_id} succeeded")
    client = BrokerClient("http://testserver")
    client._http = at.api
    attempts = client.attempts(at.job_id)
    assert [(a["number"], a["placement_id"]) for a in attempts] == [(1, first.id), (2, second.id)]
    assert attempts[0]["end_reason"].startswith("preempted") and attempts[1]["has_log"]
    # an earlier attempt by number, through the CLI's reader and the route
    earlier = io.BytesIO()
    assert watch.read_attempt(client, at.job_id, "1", earlier) == 0 and earlier.getvalue() == b"attempt one\n"
    page = at.api.get(f"/v1/jobs/{at.job_id}/logs", params={"attempt": "1"})
    assert page.text == "attempt one\n" and page.headers["X-Overspill-Attempt"] == first.id
    latest = at.api.get(f"/v1/jobs/{at.job_id}/logs")
    assert latest.text == "attempt two\n" and latest.headers["X-Overspill-Attempt"] == second.id
