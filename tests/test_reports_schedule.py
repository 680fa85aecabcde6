"""Report schedules: CRUD and validation over the API, cron in a time zone run by the tick's `run_due_reports`
exactly once per slot (also with a second replica), delivery to a directory, S3 (moto server), email (aiosmtpd)
and a webhook, a crashed run resumed, and `overspill report run` from the command line."""

from __future__ import annotations

import email.message
import hashlib
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select
from typer.testing import CliRunner

from broker.api.auth import Role, create_key
from broker.app import create_app
from broker.cli.main import app as cli_app
from broker.config.settings import DEV_API_KEY
from broker.finance.reports.runs import (
    MAX_DELIVERY_ATTEMPTS,
    STALE_AFTER,
    deliver_pending_reports,
    next_fire,
    run_due_reports,
)
from broker.runtime import Runtime
from broker.store.tables import ReportRunRow, ReportScheduleRow
from tests.conftest import MovableClock
from tests.finance_data import seed_ledger
from tests.finance_sinks import SmtpSink, WebhookSink
from tests.moto_server import moto_client, running_moto_server

OCT = datetime(2026, 10, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    with SmtpSink() as sink:
        yield sink


@pytest.fixture
def frt(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, smtp: SmtpSink, tmp_path: Path
) -> Runtime:
    clock.now = datetime(2026, 10, 20, 12, 0, tzinfo=UTC)
    rt = make_runtime(
        db_url,
        simulated=False,
        smtp_host="127.0.0.1",
        smtp_port=smtp.port,
        reports_dir=tmp_path / "reports",
        webhook_allowed_networks=["127.0.0.0/8"],  # the local receiver stands for a public one
        report_destinations={"demo": ["s3://finops-reports/overspill/"]},
    )
    seed_ledger(rt.engine, "demo", OCT, days=31, entries=400)
    return rt


@pytest.fixture
def api(frt: Runtime) -> TestClient:
    c = TestClient(create_app(runtime=frt))
    c.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
    return c


def _runs(rt: Runtime) -> list[ReportRunRow]:
    with Session(rt.engine) as s:
        return list(s.exec(select(ReportRunRow).order_by(ReportRunRow.created_at, ReportRunRow.id)).all())


def test_next_fire_follows_the_schedules_time_zone() -> None:
    at = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert next_fire("0 6 1 * *", "Europe/Paris", at) == datetime(2026, 12, 1, 5, 0, tzinfo=UTC)  # CET = UTC+1
    summer = datetime(2026, 6, 15, tzinfo=UTC)
    assert next_fire("0 6 1 * *", "Europe/Paris", summer) == datetime(2026, 7, 1, 4, 0, tzinfo=UTC)  # CEST
    assert next_fire("30 7 * * 1", "America/New_York", at) == datetime(2026, 11, 30, 12, 30, tzinfo=UTC)  # a Monday
    with pytest.raises(ValueError, match="timezone"):
        next_fire("0 6 1 * *", "Mars/Olympus", at)
    with pytest.raises(ValueError, match="cron"):
        next_fire("61 * * * *", "UTC", at)


def test_schedule_crud_roles_and_validation(frt: Runtime, api: TestClient, clock: MovableClock) -> None:
    finance = {
        "Authorization": f"Bearer {create_key(frt.engine, tenant='demo', role=Role.FINANCE, name='f', now=clock())}"
    }
    made = api.post(
        "/v1/report-schedules",
        json={"name": "monthly pdf", "cron": "0 6 1 * *", "timezone": "Europe/Paris", "format": "pdf",
              "destination": {"type": "directory", "path": "finance"}},
        headers=finance,
    )  # fmt: skip
    assert made.status_code == 201, made.text
    s = made.json()
    assert s["next_run_at"] == "2026-11-01T05:00:00Z" and s["period"] == "previous_month"  # 06:00 CET
    changed = api.patch(f"/v1/report-schedules/{s['id']}", json={"cron": "0 7 * * *"}, headers=finance).json()
    assert changed["next_run_at"] == "2026-10-21T05:00:00Z"  # 07:00 CEST, the zone kept
    assert [x["id"] for x in api.get("/v1/report-schedules").json()["items"]] == [s["id"]]
    other = {"Authorization": f"Bearer {create_key(frt.engine, tenant='x', role=Role.FINANCE, name='f', now=clock())}"}
    assert api.get(f"/v1/report-schedules/{s['id']}", headers=other).status_code == 404
    submitter = {
        "Authorization": f"Bearer {create_key(frt.engine, tenant='demo', role=Role.SUBMITTER, name='s', now=clock())}"
    }
    assert api.post("/v1/report-schedules", json={}, headers=submitter).status_code == 403
    for body, field in [
        ({"name": "x", "cron": "not a cron"}, "cron"),
        ({"name": "x", "cron": "0 6 1 * *", "timezone": "Nowhere/City"}, "timezone"),
        ({"name": "x", "cron": "0 6 1 * *", "format": "docx"}, "format"),
        ({"name": "x", "cron": "0 6 1 * *", "destination": {"type": "s3"}}, "bucket"),
        ({"name": "x", "cron": "0 6 1 * *", "destination": {"type": "email", "to": ["x"]}}, "destination.to"),
    ]:
        r = api.post("/v1/report-schedules", json=body)
        assert r.status_code == 422 and field in r.json()["message"], (body, r.json())
    assert api.delete(f"/v1/report-schedules/{s['id']}").status_code == 204
    assert api.get(f"/v1/report-schedules/{s['id']}").status_code == 404


def test_due_schedule_runs_once_per_slot_and_delivers_to_a_directory(
    frt: Runtime, api: TestClient, clock: MovableClock, make_runtime: Callable[..., Runtime], db_url: str
) -> None:
    s = api.post(
        "/v1/report-schedules",
        json={"name": "monthly csv", "cron": "0 6 1 * *", "timezone": "Europe/Paris", "format": "csv",
              "destination": {"type": "directory", "path": "finance/monthly"}},
    ).json()  # fmt: skip
    assert run_due_reports(frt, datetime(2026, 11, 1, 4, 59, tzinfo=UTC)) == 0
    fire = datetime(2026, 11, 1, 5, 0, 30, tzinfo=UTC)
    replica = make_runtime(db_url, simulated=False, reports_dir=frt.settings.reports_dir)
    assert run_due_reports(frt, fire) == 1
    assert run_due_reports(replica, fire) == 0  # the slot is taken
    [queued] = _runs(frt)
    assert (queued.state, queued.delivery_state, queued.delivered_to) == ("delivering", "pending", "")
    assert deliver_pending_reports(frt, fire) == 1  # the tick's next step
    assert deliver_pending_reports(replica, fire) == 0  # delivered once
    [run] = _runs(frt)
    assert (run.schedule_id, run.state, run.scheduled_for) == (
        s["id"],
        "succeeded",
        datetime(2026, 11, 1, 5, 0, tzinfo=UTC),
    )
    assert (run.period_start_at, run.period_end_at) == (OCT, datetime(2026, 11, 1, tzinfo=UTC))
    target = Path(run.delivered_to)
    assert target == frt.settings.resolved_reports_dir / "finance/monthly/overspill-costs-demo-2026-10.csv"
    assert hashlib.sha256(target.read_bytes()).hexdigest() == run.sha256 and run.entries == 400
    assert api.get("/v1/report-schedules/" + s["id"]).json()["next_run_at"] == "2026-12-01T05:00:00Z"
    manual = api.post("/v1/report-runs", json={"period": "2026-10", "format": "csv"}).json()
    assert manual["sha256"] == run.sha256  # re-running the period gives the same report


@pytest.mark.integration
def test_delivery_to_s3_email_and_webhook(
    frt: Runtime, api: TestClient, moto_url: str, smtp: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    frt.settings.reports_s3_endpoint_url = moto_url
    s3 = moto_client("s3", "us-east-1", moto_url)
    s3.create_bucket(Bucket="finops-reports")
    for obj in s3.list_objects_v2(Bucket="finops-reports").get("Contents", []):  # the moto server is per module
        s3.delete_object(Bucket="finops-reports", Key=obj["Key"])
    sent = api.post(
        "/v1/report-runs",
        json={"period": "2026-10", "format": "focus",
              "destination": {"type": "s3", "bucket": "finops-reports", "prefix": "overspill/monthly"}},
    )  # fmt: skip
    assert sent.status_code == 202 and sent.json()["delivery_state"] == "pending", sent.text  # queued, not sent
    mailed = api.post(
        "/v1/report-runs",
        json={"period": "2026-10", "format": "pdf", "destination": {"type": "email", "to": ["cfo@example.com"]}},
    ).json()
    assert smtp.messages == [] and s3.list_objects_v2(Bucket="finops-reports").get("KeyCount") == 0
    assert deliver_pending_reports(frt, frt.clock()) == 2  # the control loop delivers them

    sent = api.get(f"/v1/report-runs/{sent.json()['id']}").json()
    assert (sent["state"], sent["delivery_state"], sent["delivery_attempts"]) == ("succeeded", "delivered", 1)
    assert sent["delivered_to"] == "s3://finops-reports/overspill/monthly/overspill-costs-demo-2026-10.focus.csv"
    obj = s3.get_object(Bucket="finops-reports", Key="overspill/monthly/overspill-costs-demo-2026-10.focus.csv")
    assert hashlib.sha256(obj["Body"].read()).hexdigest() == sent["sha256"]

    mailed = api.get(f"/v1/report-runs/{mailed['id']}").json()
    assert mailed["state"] == "succeeded" and mailed["delivered_to"] == "cfo@example.com"
    [msg] = smtp.messages
    assert msg["To"] == "cfo@example.com"
    assert isinstance(msg, email.message.Message)
    [attachment] = [p for p in msg.walk() if p.get_filename()]
    assert attachment.get_filename() == "overspill-costs-demo-2026-10.pdf"
    assert hashlib.sha256(attachment.get_payload(decode=True)).hexdigest() == mailed["sha256"]

    with WebhookSink() as hook:
        posted = api.post(
            "/v1/report-runs",
            json={"period": "2026-10", "format": "html",
                  "destination": {"type": "webhook", "url": hook.url + "/in?token=s3cr3t"}},
        ).json()  # fmt: skip
        assert deliver_pending_reports(frt, frt.clock()) == 1
        hook.status = 503
        failed = api.post(
            "/v1/report-runs",
            json={"period": "2026-10", "format": "csv", "destination": {"type": "webhook", "url": hook.url}},
        ).json()
        assert deliver_pending_reports(frt, frt.clock()) == 0
        retried = api.get(f"/v1/report-runs/{failed['id']}").json()
        assert (retried["state"], retried["delivery_state"]) == ("delivering", "pending")
        assert "503" in retried["error"] and "retried" in retried["error"]
        for _ in range(MAX_DELIVERY_ATTEMPTS - 1):
            deliver_pending_reports(frt, frt.clock())
        assert deliver_pending_reports(frt, frt.clock()) == 0  # given up: not tried again
    [(path, headers, body), *tries] = hook.requests
    assert len(tries) == MAX_DELIVERY_ATTEMPTS
    assert path == "/in?token=s3cr3t" and headers["X-Overspill-Filename"] == "overspill-costs-demo-2026-10.html"
    posted = api.get(f"/v1/report-runs/{posted['id']}").json()
    assert hashlib.sha256(body).hexdigest() == posted["sha256"]
    assert posted["delivered_to"] == hook.url  # scheme and host only: the token stays out of the record
    failed = api.get(f"/v1/report-runs/{failed['id']}").json()
    assert failed["state"] == "failed" and failed["delivery_state"] == "failed" and "503" in failed["error"]
    assert failed["sha256"] and failed["delivery_attempts"] == MAX_DELIVERY_ATTEMPTS  # produced, not delivered


def test_a_run_left_running_by_a_crash_is_finished(frt: Runtime, clock: MovableClock) -> None:
    with Session(frt.engine) as s:
        s.add(
            ReportScheduleRow(
                id="rsc_crash", tenant="demo", name="n", cron="0 6 1 * *", timezone="UTC", format="csv",
                period="previous_month", destination={}, next_run_at=datetime(2027, 1, 1, 6, tzinfo=UTC),
                created_at=clock(), updated_at=clock(),
            )
        )  # fmt: skip
        s.add(
            ReportRunRow(
                id="rpt_crash", tenant="demo", schedule_id="rsc_crash",
                scheduled_for=datetime(2026, 11, 1, 6, tzinfo=UTC),
                format="csv", period_start_at=OCT, period_end_at=datetime(2026, 11, 1, tzinfo=UTC), state="running",
                created_at=clock(),
            )
        )  # fmt: skip
        s.commit()
    assert run_due_reports(frt, clock() + timedelta(minutes=1)) == 0  # maybe still running elsewhere
    assert run_due_reports(frt, clock() + STALE_AFTER + timedelta(minutes=1)) == 1
    [run] = _runs(frt)
    assert run.state == "succeeded" and run.entries == 400 and run.content


def test_cli_report_run_writes_the_file(
    frt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    monkeypatch.setenv("OVERSPILL_DATABASE_URL", db_url)
    monkeypatch.setenv("OVERSPILL_SIMULATED", "false")
    monkeypatch.setenv("OVERSPILL_DATA_DIR", str(tmp_path))
    out = tmp_path / "out"
    command = ["report", "run", "--period", "2026-10", "--format", "pdf", "--out", str(out)]
    result = CliRunner().invoke(cli_app, command, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    pdf = out / "overspill-costs-demo-2026-10.pdf"
    assert pdf.read_bytes().startswith(b"%PDF") and "400 ledger entries" in result.output
    assert ": October 2026, data as of 2026-1" in result.output, result.output  # the period for people
    again = CliRunner().invoke(cli_app, [*command, "--json"])
    assert again.exit_code == 0 and hashlib.sha256(pdf.read_bytes()).hexdigest() in again.output
    made = json.loads(again.stdout)
    assert made["period_title"] == "October 2026" and made["data_as_of"].startswith("2026-1")
    bad = CliRunner().invoke(cli_app, ["report", "run", "--period", "October", "--format", "pdf"])
    assert bad.exit_code != 0 and "--period" in bad.output
