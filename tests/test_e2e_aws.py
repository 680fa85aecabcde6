"""The broker end to end on AWS (a moto server): a job is placed on spot through the real EC2 API, a spot
interruption warning arrives through EventBridge -> SQS, the placement is marked preempted and the job re-placed,
and the reclaimed instance does not stay billing (the orphan sweep terminates it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.store.tables import Placement
from providers.aws import ensure_interruption_queue, parse_instance_ref
from tests.builders import job_body
from tests.moto_server import moto_client, running_moto_server

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.mark.integration
def test_spot_job_interrupted_and_replaced_on_aws(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    ec2 = moto_client("ec2", REGION, moto_url)
    sqs = moto_client("sqs", REGION, moto_url)
    events = moto_client("events", REGION, moto_url)
    queue_url = ensure_interruption_queue(events, sqs, "overspill-e2e")
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    moto_client("s3", REGION, moto_url).create_bucket(Bucket="e2e-ckpt")  # the agent's spec, logs and reports
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'aws.db'}",
        data_dir=tmp_path,
        simulated=False,
        aws_regions=[REGION],
        aws_instance_types=["g5.xlarge"],
        aws_endpoint_url=moto_url,
        aws_launch=True,
        aws_image_id=ami,
        aws_interruption_queue_url=queue_url,
        orphan_grace_seconds=0,
        orphan_sweep_seconds=0,
        checkpoint_stores={"aws/us-east-1": "s3://e2e-ckpt/"},
    )
    rt = build_runtime(settings)
    tick(rt, datetime.now(UTC))
    api = TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    job = api.post("/v1/jobs", json=job_body(accelerators=["A10G"], work_gpu_hours="3")).json()
    tick(rt, datetime.now(UTC))
    tick(rt, datetime.now(UTC))
    placed = api.get(f"/v1/jobs/{job['id']}").json()
    assert placed["state"] == "running", placed
    first = placed["placement"]
    assert first["provider"] == "aws" and first["capacity_type"] == "spot" and first["instance_id"]
    region, ec2_id = parse_instance_ref(first["instance_id"])
    raw = ec2.describe_instances(InstanceIds=[ec2_id])["Reservations"][0]["Instances"][0]
    assert raw["InstanceLifecycle"] == "spot"
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}["overspill:job"] == job["id"]

    events.put_events(
        Entries=[
            {
                "Source": "aws.ec2",
                "DetailType": "EC2 Spot Instance Interruption Warning",
                "Detail": json.dumps({"instance-id": ec2_id, "instance-action": "terminate"}),
                "Resources": [f"arn:aws:ec2:{region}a:instance/{ec2_id}"],
            }
        ]
    )
    warned_at = datetime.now(UTC)
    tick(rt, warned_at)
    # the instance runs the agent: it is left alone (the sweep included) to save its final checkpoint until the
    # notice's deadline (two minutes), then the job is re-placed from the checkpoint the agent last reported
    with Session(rt.engine) as s:
        [warned] = s.exec(select(Placement).where(Placement.job_id == job["id"])).all()
    assert warned.state == "running" and warned.notice_deadline_at is not None
    assert ec2.describe_instances(InstanceIds=[ec2_id])["Reservations"][0]["Instances"][0]["State"]["Name"] == "running"
    tick(rt, warned.notice_deadline_at + timedelta(seconds=61))
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement).where(Placement.job_id == job["id"]).order_by(Placement.id)).all()
    assert placements[0].state == "preempted"
    assert len(placements) == 2 and placements[1].zone != placements[0].zone  # the warned zone is avoided
    kinds = [e["kind"] for e in api.get(f"/v1/jobs/{job['id']}/events").json()["items"]]
    assert "interruption_notice" in kinds
    tick(rt, warned.notice_deadline_at + timedelta(seconds=62))
    state = ec2.describe_instances(InstanceIds=[ec2_id])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")
