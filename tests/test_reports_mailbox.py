"""The broker takes the instance agent's reports from the tenant mailbox (the tick's `read_mailboxes` step) and from
the callback (`POST /v1/placements/{id}/reports`), each once by (placement, seq), and refuses what its placement did
not sign. A real tick launches a job on AWS (moto EC2 and S3); the reports are written here into the real mailbox
in moto S3, signed with the placement's key exactly as the agent signs them (agent/protocol.py), or forged.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from agent import protocol as proto
from broker.api.auth import Role, callback_token, create_key
from broker.loop import sync as sync_module
from broker.loop.interrupts import sweep_orphans
from broker.loop.mailbox import read_mailboxes
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.store.tables import Job, JobEvent, Placement, PlacementReport
from providers.base import NotFound
from tests.agent_harness import TRAIN
from tests.builders import job_body
from tests.moto_server import moto_client, running_moto_server
from tests.test_attempt_boot import _api, _settings

pytestmark = pytest.mark.integration

BUCKET = "ckpt-use1"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@dataclass
class Launched:
    rt: Runtime
    api: TestClient
    s3: Any
    ec2: Any
    job_id: str
    placement: Placement
    now: datetime

    def key(self) -> str:
        return callback_token(self.rt.settings, self.placement.id)

    def report(self, kind: proto.ReportKind, seq: int, *, key: str | None = None, **fields: Any) -> proto.Report:
        r = proto.Report(self.placement.id, seq, kind, self.now.isoformat(), **fields)
        return r.signed(key or self.key())

    def post_mailbox(self, report: proto.Report, tenant: str = "demo", name: str | None = None) -> str:
        key = f"tenants/{tenant}/mailbox/{name or proto.mailbox_entry_name(report)}"
        self.s3.put_object(Bucket=BUCKET, Key=key, Body=report.to_json())
        return key

    def mailbox(self, tenant: str = "demo") -> list[str]:
        answer = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"tenants/{tenant}/mailbox/")
        return [o["Key"] for o in answer.get("Contents", [])]

    def row(self) -> tuple[Placement, Job]:
        with Session(self.rt.engine) as s:
            p = s.get(Placement, self.placement.id)
            assert p is not None
            job = s.get(Job, p.job_id)
            assert job is not None
            return p, job

    def ec2_state(self) -> str:
        assert self.placement.instance_id is not None
        ec2_id = self.placement.instance_id.split(":")[-1]
        return str(
            self.ec2.describe_instances(InstanceIds=[ec2_id])["Reservations"][0]["Instances"][0]["State"]["Name"]
        )

    def events(self, kind: str) -> list[JobEvent]:
        with Session(self.rt.engine) as s:
            return list(s.exec(select(JobEvent).where(JobEvent.job_id == self.job_id, JobEvent.kind == kind)).all())


def launch(moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **job: Any) -> Launched:
    """A job launched on moto EC2 by a real tick, its instance running (the agent itself is not booted here)."""
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    ec2 = moto_client("ec2", "us-east-1", moto_url)
    s3 = moto_client("s3", "us-east-1", moto_url)
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=BUCKET)
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    settings = _settings(
        tmp_path,
        aws_regions=["us-east-1"],
        aws_instance_types=job.pop("instance_types", ["g5.xlarge"]),
        aws_endpoint_url=moto_url,
        aws_launch=True,
        aws_image_id=ami,
        checkpoint_stores={"aws/us-east-1": f"s3://{BUCKET}/"},
        orphan_grace_seconds=0,
        orphan_sweep_seconds=0,
    )
    rt = build_runtime(settings)
    now = datetime.now(UTC)
    tick(rt, now)
    api = _api(rt)
    body = job_body(accelerators=["A10G"], command=[sys.executable, str(TRAIN)], work_gpu_hours="2", **job)
    answer = api.post("/v1/jobs", json=body)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    tick(rt, now)
    with Session(rt.engine) as s:
        [p] = s.exec(select(Placement).where(Placement.job_id == job_id)).all()
    assert p.instance_id and p.attempt_uri
    launched = Launched(rt, api, s3, ec2, job_id, p, now)
    tick(rt, now + timedelta(seconds=1))  # moto's instance is running: the placement records its start
    assert launched.row()[0].state == "running"
    return launched


def test_progress_reports_set_real_progress_once_and_never_go_back(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = launch(moto_url, tmp_path, monkeypatch)
    _, job = at.row()
    total = job.work_hours
    half = at.report(proto.ReportKind.PROGRESS, 20, progress=proto.Progress(600, 1000, 500), checkpointed=0.5)
    quarter = at.report(proto.ReportKind.PROGRESS, 10, progress=proto.Progress(300, 1000, 250), checkpointed=0.25)
    at.post_mailbox(half)
    assert read_mailboxes(at.rt, at.now) == 1
    assert at.mailbox() == [], "a taken report is deleted from the mailbox"
    p, job = at.row()
    assert p.checkpointed_work_hours == total / 2 and job.remaining_work_hours == total / 2
    assert p.last_report_at is not None
    # the older report arrives late, and the newer one again (by the callback): neither changes anything
    at.post_mailbox(quarter)
    assert read_mailboxes(at.rt, at.now) == 1  # recorded (it is a report the agent made), but progress never goes back
    again = at.api.post(f"/v1/placements/{at.placement.id}/reports", json=_body(half))
    assert again.status_code == 200 and again.json() == {"taken": False}
    p, job = at.row()
    assert p.checkpointed_work_hours == total / 2 and job.remaining_work_hours == total / 2
    with Session(at.rt.engine) as s:
        seqs = sorted(r.seq for r in s.exec(select(PlacementReport)).all())
    assert seqs == [10, 20]
    # a heartbeat is recorded as the agent's latest sign of life
    beat = at.report(proto.ReportKind.HEARTBEAT, 30, checkpointed=0.5)
    later = at.now + timedelta(minutes=5)
    at.post_mailbox(beat)
    assert read_mailboxes(at.rt, later) == 1
    assert at.row()[0].last_report_at == later
    # an instance whose agent still reports is never swept, even with its placement ended on paper; once it has
    # been silent for two heartbeats (20 s here), it is an orphan like any other
    _set_state(at, "stopped")
    sweep_orphans(at.rt, later + timedelta(seconds=19))
    assert at.ec2_state() == "running"
    sweep_orphans(at.rt, later + timedelta(seconds=21))
    assert at.ec2_state() in ("shutting-down", "terminated")


def test_a_final_report_applies_once_whichever_path_brings_it_first(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = launch(moto_url, tmp_path, monkeypatch)
    final = at.report(proto.ReportKind.FINAL, 50, outcome=proto.Outcome.SUCCEEDED, exit_code=0, checkpointed=1.0)
    # the callback first, then the mailbox copy
    first = at.api.post(f"/v1/placements/{at.placement.id}/reports", json=_body(final))
    assert first.status_code == 200 and first.json() == {"taken": True}
    at.post_mailbox(final)
    report = tick(at.rt, at.now + timedelta(seconds=2))
    assert report.count("read_mailboxes") == 0 and at.mailbox() == []
    p, job = at.row()
    assert p.state == "succeeded" and job.state == "succeeded" and p.outcome == "succeeded"
    assert len(at.events("attempt_reported")) == 1 and len(at.events("finished")) == 1
    # the instance is deleted once the agent reported, success included
    assert at.ec2_state() in ("shutting-down", "terminated")


def test_the_agents_verdict_stands_when_the_instance_is_already_gone(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = launch(moto_url, tmp_path, monkeypatch)
    at.post_mailbox(at.report(proto.ReportKind.FINAL, 7, outcome=proto.Outcome.SUCCEEDED, exit_code=0))
    assert read_mailboxes(at.rt, at.now) == 1
    # the VM is gone by the time sync looks (deleted by its own shutdown, or long terminated): the cloud answers
    # NotFound, which for an unreported instance means "disappeared"; the agent's report decides
    real = sync_module.observe_instances

    def gone(rt: Runtime, placements: list[Placement]) -> dict[str, Any]:
        views = real(rt, placements)
        return {**views, at.placement.instance_id: NotFound("no such instance", provider="aws")}

    monkeypatch.setattr(sync_module, "observe_instances", gone)
    sync_module.sync_instances(at.rt, at.now + timedelta(seconds=5))
    p, job = at.row()
    assert p.state == "succeeded" and job.state == "succeeded"


def test_forged_unsigned_and_other_tenant_reports_are_refused_and_never_applied(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = launch(moto_url, tmp_path, monkeypatch)
    pid = at.placement.id
    win = {"outcome": proto.Outcome.SUCCEEDED, "exit_code": 0, "checkpointed": 1.0}
    forged = at.report(proto.ReportKind.FINAL, 1, key="ab" * 32, **win)
    unsigned = proto.Report(pid, 2, proto.ReportKind.FINAL, at.now.isoformat(), **win)  # type: ignore[arg-type]
    genuine = at.report(proto.ReportKind.FINAL, 3, **win)
    tampered = proto.Report.from_json(genuine.to_json().replace(b'"exit_code":0', b'"exit_code":1'))
    renamed = at.report(proto.ReportKind.FINAL, 4, **win)
    at.post_mailbox(forged)
    at.post_mailbox(unsigned)
    at.post_mailbox(tampered, name=proto.mailbox_entry_name(genuine))
    at.post_mailbox(renamed, name=f"{pid}-{5:020d}-final.json")  # the name says another seq than the body
    at.post_mailbox(genuine, name="junk.json")
    at.s3.put_object(Bucket=BUCKET, Key=f"tenants/demo/mailbox/{pid}-{6:020d}-final.json", Body=b" " * 70_000)
    # a genuine report copied into another tenant's mailbox, which is read because that tenant runs a job too
    other_key = create_key(at.rt.engine, tenant="rival", role=Role.ADMIN, name="t", now=at.now)
    other = at.api.post(
        "/v1/jobs",
        json=job_body(accelerators=["A10G"], command=["true"], work_gpu_hours="1"),
        headers={"Authorization": f"Bearer {other_key}"},
    )
    assert other.status_code == 202, other.text
    tick(at.rt, at.now + timedelta(seconds=2))  # launches rival's job, whose mailbox the step then lists
    at.post_mailbox(genuine, tenant="rival")
    assert read_mailboxes(at.rt, at.now + timedelta(seconds=3)) == 0
    assert at.mailbox() == [] and at.mailbox("rival") == [], "refused entries are deleted, never applied"
    tick(at.rt, at.now + timedelta(seconds=4))
    p, job = at.row()
    assert p.state == "running" and job.state == "running" and p.outcome is None and p.last_report_at is None
    with Session(at.rt.engine) as s:
        assert s.exec(select(PlacementReport)).all() == []
    # the callback refuses the same, naming why
    url = f"/v1/placements/{pid}/reports"
    assert at.api.post(url, json=_body(forged)).status_code == 403
    assert at.api.post(url, json=_body(unsigned)).status_code == 403
    assert at.api.post(url, json=_body(tampered)).status_code == 403
    # another placement's genuine report is refused as a forgery, whether the path's placement exists or not
    assert at.api.post("/v1/placements/pl_nope/reports", json=_body(genuine)).status_code == 403
    bad_token = at.api.post(url, json=_body(genuine), headers={"X-Overspill-Callback-Token": "abc"})
    assert bad_token.status_code == 403
    malformed = at.api.post(url, json={**_body(genuine), "kind": "victory"})
    assert malformed.status_code == 422 and "report" in malformed.text
    assert at.row()[0].outcome is None
    # and the genuine one, by the callback, with the right token, is taken
    ok = at.api.post(url, json=_body(genuine), headers={"X-Overspill-Callback-Token": at.key()})
    assert ok.status_code == 200 and ok.json() == {"taken": True}


def test_a_notice_leaves_the_instance_alone_until_the_final_checkpoint_lands(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = launch(moto_url, tmp_path, monkeypatch)
    _, job = at.row()
    total = job.work_hours
    deadline = at.now + timedelta(minutes=2)
    notice = proto.Notice(proto.NoticeSource.AWS, "preempt", at.now.isoformat(), deadline.isoformat())
    at.post_mailbox(at.report(proto.ReportKind.PROGRESS, 1, checkpointed=0.25))
    at.post_mailbox(at.report(proto.ReportKind.NOTICE, 2, notice=notice))
    tick(at.rt, at.now + timedelta(seconds=5))
    p, job = at.row()
    assert p.state == "running" and job.state == "running" and p.notice_deadline_at == deadline
    assert len(at.events("interruption_notice")) == 1
    # the placement ended on paper elsewhere would not matter: the sweep never kills a warned instance
    _set_state(at, "stopped")
    sweep_orphans(at.rt, at.now + timedelta(minutes=1))
    assert at.ec2_state() == "running"
    _set_state(at, "running")
    # the agent's final report: preempted, with the checkpoint the workload saved on the signal
    at.post_mailbox(
        at.report(proto.ReportKind.FINAL, 3, outcome=proto.Outcome.PREEMPTED, checkpointed=0.75, notice=notice)
    )
    tick(at.rt, at.now + timedelta(seconds=30))
    p, job = at.row()
    assert p.state == "preempted" and p.saved_work_hours == Decimal("0.75") * total
    assert job.remaining_work_hours == total / 4
    assert job.state in ("pending", "running") and job.current_placement_id != p.id
    with Session(at.rt.engine) as s:
        placements = s.exec(select(Placement).where(Placement.job_id == at.job_id)).all()
    if job.state == "running":
        [again] = [x for x in placements if x.id != p.id]
        assert again.work_hours_at_start == total / 4, "re-placed with the work the checkpoint did not save"


def test_a_warned_instance_is_replaced_from_its_last_checkpoint_once_the_deadline_passes(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = launch(moto_url, tmp_path, monkeypatch)
    _, job = at.row()
    deadline = at.now + timedelta(minutes=2)
    notice = proto.Notice(proto.NoticeSource.AWS, "preempt", at.now.isoformat(), deadline.isoformat())
    at.post_mailbox(at.report(proto.ReportKind.PROGRESS, 1, checkpointed=0.5))
    at.post_mailbox(at.report(proto.ReportKind.NOTICE, 2, notice=notice))
    tick(at.rt, deadline)  # the deadline, but the upload grace has not passed: still left alone
    assert at.row()[0].state == "running"
    tick(at.rt, deadline + timedelta(seconds=61))
    p, job = at.row()
    assert p.state == "preempted" and job.remaining_work_hours == job.work_hours / 2


def _set_state(at: Launched, state: str) -> None:
    with Session(at.rt.engine) as s:
        row = s.get(Placement, at.placement.id)
        assert row is not None
        row.state = state
        s.add(row)
        s.commit()


def _body(report: proto.Report) -> dict[str, Any]:
    return dict(json.loads(report.to_json()))
