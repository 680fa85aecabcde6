"""Report destinations from a finance key: an S3 destination wrote to any bucket the broker can write to (its
checkpoint buckets included) and its errors told which buckets exist; a NUL in a destination path was a 500; a
`directory` destination on Lambda wrote to the container's ephemeral disk and reported success. S3 is a moto
server; the Lambda case goes through `broker.serverless.handler` with API Gateway and Scheduler events."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from broker import serverless
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import ReportRunRow, ReportScheduleRow
from tests.attacks.finance_parts import finance_client
from tests.conftest import MovableClock
from tests.moto_server import moto_client, running_moto_server
from tests.serverless_events import http_event, schedule_event

ALLOWED = {"demo": ["s3://finance-reports/demo/", "s3://gone-reports/demo/"], "acme": ["s3://finance-reports/acme/"]}


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.fixture
def s3rt(
    tmp_path: Path, make_runtime: Callable[..., Runtime], moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> Runtime:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = moto_client("s3", "us-east-1", moto_url)
    for bucket in ("finance-reports", "ckpt-use1"):  # the reports bucket and the broker's checkpoint bucket
        s3.create_bucket(Bucket=bucket)
        for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", []):  # the moto server is per module
            s3.delete_object(Bucket=bucket, Key=obj["Key"])
    return make_runtime(
        f"sqlite:///{tmp_path / 's3.db'}",
        simulated=False,
        reports_s3_endpoint_url=moto_url,
        report_destinations=ALLOWED,
    )


def _keys(moto_url: str, bucket: str) -> list[str]:
    listed = moto_client("s3", "us-east-1", moto_url).list_objects_v2(Bucket=bucket)
    return [o["Key"] for o in listed.get("Contents", [])]


def _s3_run(api: Any, bucket: str, prefix: str) -> Any:
    dest = {"type": "s3", "bucket": bucket, "prefix": prefix}
    return api.post("/v1/report-runs", json={"period": "2026-10", "format": "csv", "destination": dest})


@pytest.mark.integration
@pytest.mark.parametrize(
    ("bucket", "prefix"),
    [
        ("ckpt-use1", "overspill/job_victim"),  # the checkpoint bucket: overwrite a job's checkpoint
        ("finance-reports", "acme/monthly"),  # another tenant's reports
        ("finance-reports", ""),  # the bucket's root
        ("finance-reports", "demonstration"),  # shares the characters, not the folder
    ],
)
def test_s3_destination_outside_the_tenants_prefixes_is_refused(
    s3rt: Runtime, moto_url: str, clock: MovableClock, bucket: str, prefix: str
) -> None:
    api = finance_client(s3rt, clock())
    answer = _s3_run(api, bucket, prefix)
    tick(s3rt, clock())  # the control loop delivers whatever was queued
    assert _keys(moto_url, "ckpt-use1") == [] and _keys(moto_url, "finance-reports") == []
    assert answer.status_code == 422, answer.text
    assert "destination.bucket/prefix must lie under" in answer.json()["message"]
    schedule = api.post(
        "/v1/report-schedules",
        json={"name": "x", "cron": "0 6 1 * *", "destination": {"type": "s3", "bucket": bucket, "prefix": prefix}},
    )
    assert schedule.status_code == 422 and "destination.bucket/prefix" in schedule.json()["message"]


@pytest.mark.integration
def test_s3_answers_do_not_tell_which_buckets_exist(s3rt: Runtime, moto_url: str, clock: MovableClock) -> None:
    api = finance_client(s3rt, clock())
    refused = {bucket: _s3_run(api, bucket, "x").json()["message"] for bucket in ("ckpt-use1", "no-such-bucket-1")}
    gone = _s3_run(api, "gone-reports", "demo/monthly")  # allowed by the operator, but the bucket is not there
    tick(s3rt, clock())
    assert refused["ckpt-use1"] == refused["no-such-bucket-1"]  # an existing and a missing bucket look the same
    assert gone.status_code == 202, gone.text
    run = api.get(f"/v1/report-runs/{gone.json()['id']}").json()
    assert "delivery to the configured destination failed" in run["error"], run
    assert "NoSuchBucket" not in run["error"] and "does not exist" not in run["error"]
    delivered = _s3_run(api, "finance-reports", "demo/monthly")
    tick(s3rt, clock())
    assert _keys(moto_url, "finance-reports") == ["demo/monthly/overspill-costs-demo-2026-10.csv"]
    assert api.get(f"/v1/report-runs/{delivered.json()['id']}").json()["delivery_state"] == "delivered"


@pytest.mark.parametrize(
    ("destination", "field"),
    [
        ({"type": "directory", "path": "finance\x00/monthly"}, "destination.path"),
        ({"type": "directory", "path": "finance/\r\nmonthly"}, "destination.path"),
        ({"type": "directory", "path": "..\\..\\etc"}, "destination.path"),
        ({"type": "s3", "bucket": "finance-reports", "prefix": "demo/\x00x"}, "destination.prefix"),
        ({"type": "s3", "bucket": "finance-reports", "prefix": "/demo"}, "destination.prefix"),
        ({"type": "s3", "bucket": "finance-reports", "prefix": "demo/../acme"}, "destination.prefix"),
        ({"type": "s3", "bucket": "Finance_Reports"}, "destination.bucket"),
        ({"type": "webhook", "url": "https://hooks.example.com/\x00"}, "destination.url"),
    ],
)
def test_nul_and_traversal_in_a_destination_are_a_422_naming_the_field(
    tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock, destination: dict[str, str], field: str
) -> None:
    rt = make_runtime(f"sqlite:///{tmp_path / 'dest.db'}", simulated=False, reports_dir=tmp_path / "reports")
    api = finance_client(rt, clock())
    answer = api.post("/v1/report-runs", json={"period": "2026-10", "destination": destination})
    assert answer.status_code == 422 and field in answer.json()["message"], answer.text
    schedule = api.post("/v1/report-schedules", json={"name": "x", "cron": "0 6 1 * *", "destination": destination})
    assert schedule.status_code == 422 and field in schedule.json()["message"], schedule.text


@pytest.fixture
def lambda_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    for name in list(os.environ):
        if name.startswith("OVERSPILL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OVERSPILL_DATABASE_URL", f"sqlite:///{tmp_path / 'lambda.db'}")
    monkeypatch.setenv("OVERSPILL_DATA_DIR", str(tmp_path))
    serverless.reset()
    yield tmp_path
    serverless.reset()


def test_a_directory_destination_is_refused_on_lambda(lambda_env: Path) -> None:
    auth = {"Authorization": f"Bearer {DEV_API_KEY}"}
    dest = {"type": "directory", "path": "finance"}
    run = serverless.handler(
        http_event("POST", "/v1/report-runs", body={"period": "2026-10", "destination": dest}, headers=auth), None
    )
    written = sorted(p.name for p in lambda_env.rglob("*.csv"))
    assert written == []  # nothing on the container's disk
    assert run["statusCode"] == 422, run
    assert "not available in the serverless runtime" in json.loads(run["body"])["message"]
    made = serverless.handler(
        http_event("POST", "/v1/report-schedules", body={"name": "x", "cron": "0 6 1 * *", "destination": dest},
                   headers=auth),
        None,
    )  # fmt: skip
    assert made["statusCode"] == 422, made

    rt = serverless.container().runtime  # a schedule stored before the check (or from a non-Lambda broker)
    now = rt.clock()
    with Session(rt.engine) as s:
        s.add(
            ReportScheduleRow(
                id="rsc_old", tenant="demo", name="old", cron="0 6 1 * *", timezone="UTC", format="csv",
                period="previous_month", destination=dest, next_run_at=now - timedelta(minutes=1),
                created_at=now, updated_at=now,
            )
        )  # fmt: skip
        s.commit()
    serverless.handler(schedule_event("reports"), None)
    serverless.handler(schedule_event("tick"), None)
    with Session(rt.engine) as s:
        [stored] = s.exec(select(ReportRunRow)).all()
    assert sorted(p.name for p in lambda_env.rglob("*.csv")) == []
    assert stored.state == "failed" and "not available in the serverless runtime" in stored.error, stored.error
    assert datetime.now(UTC) - stored.created_at < timedelta(hours=1)
