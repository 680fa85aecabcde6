"""A spot notice on one cloud, the job resumed on another, with real parts all the way (issue 14, "Prove it").

One broker runtime holds two clouds: AWS (moto EC2 + S3, checkpoint store `aws/us-east-1` -> s3://ckpt-use1/) and
GCP (tests/gcp_compute_fake.py + the GCS emulator, store `gcp/us-central1` -> gs://ckpt-usc1/). The job accepts an
A10G (AWS g5.xlarge, spot, almost free on moto) or an A100 (GCP a2-highgpu-1g spot at $0.42/h), one GPU.

What moves the second attempt to GCP is the broker's own rule, not the test: AWS is configured with one instance type
in one zone (the AWS feed's pools outside us-east-1a are not offered, as if the account had one usable zone), so
the first attempt goes there, the cheapest pool. Its preemption blocklists `aws/us-east-1/us-east-1a` for a while
(`sync._preempted`), which leaves GCP as the only pool the broker may place the job on.

The chain: AWS's documented spot notice (tests/metadata_server.py) mid-run -> the agent signals the numpy workload,
which checkpoints -> the agent stores that checkpoint in S3 and reports `preempted` naming it (tenant mailbox, no
callback URL) -> the broker re-budgets the remaining work from that progress and re-places the job on GCP -> its
staging step (broker/loop/stage.py) copies the checkpoint S3 -> GCS, MANIFEST.json last -> the GCP start-up script
boots the real agent, which restores the checkpoint and resumes -> the final weights equal an uninterrupted run's,
bit for bit. The ledger charges each placement exactly its own run time at its own pool's price: nothing for the
staging wait between the two, nothing after either verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from agent import protocol as proto
from agent.checkpoints import parse_manifest
from broker.finance.ledger import LEDGER_QUANTUM
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.store.tables import CostEntryRow, Job, JobEvent, Placement
from providers.base import NotFound
from providers.model import Offering, hours_between
from tests.gcp_compute_fake import GcpComputeFake
from tests.instance_boot import Booted, aws_user_data, boot, gcp_startup_script
from tests.metadata_server import MetadataServer
from tests.moto_server import moto_client, running_moto_server
from tests.test_attempt_boot import _api, _job, _settings, _signing_key

pytest_plugins = ["tests.storage_emulators", "tests.agent_fixtures"]
pytestmark = pytest.mark.integration

AWS_ZONE = "us-east-1a"
GCP_PRICE = Decimal("0.42")
STEPS = 600
ENV = {"TRAIN_STEPS": str(STEPS), "TRAIN_CHECKPOINT_EVERY": "100", "TRAIN_STEP_SECONDS": "0.02"}


@dataclass
class OneZone:
    """The AWS price feed limited to one zone: the account's only usable zone for this test."""

    feed: Any
    zone: str

    @property
    def name(self) -> str:
        return str(self.feed.name)

    def offerings(self, now: datetime) -> list[Offering]:
        return [o for o in self.feed.offerings(now) if o.zone == self.zone]


class GcpA100Market:
    """GCP's spot A100 pool (a2-highgpu-1g, one GPU) in us-central1, priced now."""

    name = "gcp-prices"

    def offerings(self, now: datetime) -> list[Offering]:
        from tests.test_provider_gcp import offering

        a = offering("a2-highgpu-1g")
        assert a.accelerator_count == 1 and a.price.hourly_usd == GCP_PRICE
        return [dataclasses.replace(a, price=dataclasses.replace(a.price, observed_at=now))]


@dataclass
class TwoClouds:
    rt: Runtime
    api: TestClient
    s3: Any
    gcs: Any
    script_of: Callable[[Placement], str]

    def submit(self, accelerators: list[str], env: dict[str, str]) -> str:
        answer = self.api.post("/v1/jobs", json=_job(accelerators, gpu_count=1, env=env))
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def live(self, job_id: str) -> Placement | None:
        with Session(self.rt.engine) as s:
            live = s.exec(
                select(Placement).where(
                    Placement.job_id == job_id, Placement.state.in_(("launching", "queued", "running"))
                )  # type: ignore[attr-defined]
            ).all()
        assert len(live) <= 1, live
        return live[0] if live and live[0].instance_id else None

    def launched(self, job_id: str, *, ticks: int = 5) -> Placement:
        """Tick until the job has a launched placement (staging may take a tick of its own), at most `ticks`."""
        for _ in range(ticks):
            tick(self.rt, datetime.now(UTC))
            p = self.live(job_id)
            if p is not None:
                assert p.attempt_uri
                return p
        raise AssertionError(f"{job_id} not launched after {ticks} ticks: {self.events(job_id)}")

    def events(self, job_id: str) -> list[JobEvent]:
        with Session(self.rt.engine) as s:
            return list(s.exec(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)).all())  # type: ignore[arg-type]

    def get(self, job_id: str, placement_id: str) -> tuple[Job, Placement]:
        with Session(self.rt.engine) as s:
            job, p = s.get(Job, job_id), s.get(Placement, placement_id)
        assert job is not None and p is not None
        return job, p

    def read(self, uri: str) -> bytes:
        if uri.startswith("s3://"):
            bucket, key = uri.removeprefix("s3://").split("/", 1)
            return bytes(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        bucket, key = uri.removeprefix("gs://").split("/", 1)
        return bytes(self.gcs.bucket(bucket).blob(key).download_as_bytes())

    def keys(self, uri: str) -> list[str]:
        """The URIs of the objects under the prefix `uri`, sorted."""
        if uri.startswith("s3://"):
            bucket, prefix = uri.removeprefix("s3://").split("/", 1)
            found = self.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
            return sorted(f"s3://{bucket}/{o['Key']}" for o in found)
        bucket, prefix = uri.removeprefix("gs://").split("/", 1)
        return sorted(f"gs://{bucket}/{b.name}" for b in self.gcs.list_blobs(bucket, prefix=prefix))

    def log(self, p: Placement) -> bytes:
        assert p.attempt_uri is not None
        return b"".join(self.read(k) for k in self.keys(p.attempt_uri + proto.LOGS_DIR))

    def final_weights(self, store: str, job_id: str) -> str:
        manifest = parse_manifest(self.read(f"{store}tenants/demo/jobs/{job_id}/checkpoint/{proto.MANIFEST_NAME}"))
        [final] = [f for f in manifest.files if f.path == "final.npy"]
        return final.sha256

    def instance_gone(self, p: Placement) -> bool:
        provider = self.rt.provider(p.provider)
        assert provider is not None and p.instance_id is not None
        try:
            return provider.get(p.instance_id).released
        except NotFound:
            return True

    def boot(self, p: Placement, metadata: MetadataServer) -> Booted:
        root = Path(self.rt.settings.agent_root)
        shutil.rmtree(root, ignore_errors=True)  # a fresh instance
        script = self.script_of(p)
        assert script == p.user_data
        return boot(script, root, {"OVERSPILL_METADATA_URL": metadata.url}, gpus=1)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@contextlib.contextmanager
def two_clouds(moto_url: str, gcs_endpoint: str, gcs: Any, tmp: Path, mp: pytest.MonkeyPatch) -> Iterator[TwoClouds]:
    from tests.test_provider_gcp import make_provider

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        mp.setenv(k, v)
    ec2 = moto_client("ec2", "us-east-1", moto_url)
    s3 = moto_client("s3", "us-east-1", moto_url)
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket="ckpt-use1")
    if gcs.lookup_bucket("ckpt-usc1") is None:
        gcs.create_bucket("ckpt-usc1")
    settings = _settings(
        tmp,
        aws_regions=["us-east-1"],
        aws_instance_types=["g5.xlarge"],
        aws_endpoint_url=moto_url,
        aws_launch=True,
        aws_image_id=str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]),
        checkpoint_stores={"aws/us-east-1": "s3://ckpt-use1/", "gcp/us-central1": "gs://ckpt-usc1/"},
        gcs_endpoint=gcs_endpoint,
        gcs_signing_key_file=_signing_key(tmp / "sa.json"),
    )
    with GcpComputeFake() as fake:
        rt = build_runtime(settings)
        provider = make_provider(fake)
        rt.providers[provider.name] = provider
        [aws_feed] = [i for i, src in enumerate(rt.offering_sources) if src.name == "aws"]
        rt.offering_sources[aws_feed] = OneZone(rt.offering_sources[aws_feed], AWS_ZONE)
        rt.offering_sources.append(GcpA100Market())
        tick(rt, datetime.now(UTC))

        def script_of(p: Placement) -> str:
            assert p.instance_id is not None
            if p.provider == "aws":
                return aws_user_data(ec2, p.instance_id)
            return gcp_startup_script(fake, p.instance_id)

        yield TwoClouds(rt, _api(rt), s3, gcs, script_of)


def _entries(rt: Runtime, placement_id: str) -> list[CostEntryRow]:
    with Session(rt.engine) as s:
        return list(s.exec(select(CostEntryRow).where(CostEntryRow.placement_id == placement_id)).all())


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _assert_charged_only_what_ran(rt: Runtime, p: Placement, hourly: Decimal) -> None:
    """`p`'s compute (wasted included: it ran, it was lost) is exactly its run time at its pool's price, and no
    entry of its own covers a second outside [started, ended]."""
    assert p.started_at is not None and p.ended_at is not None
    started, ended = _utc(p.started_at), _utc(p.ended_at)
    assert p.hourly_usd == hourly
    rows = [r for r in _entries(rt, p.id) if r.kind != "egress"]
    assert rows, f"{p.id} ran and was never charged"
    for r in rows:
        assert started <= _utc(r.period_start_at) <= _utc(r.period_end_at) <= ended, (r.kind, r.period_start_at)
    ran = [r for r in rows if r.kind in ("compute", "wasted")]
    assert all(r.hourly_usd == hourly for r in ran)
    assert sum((r.usd for r in ran), Decimal(0)) == (hourly * hours_between(started, ended)).quantize(LEDGER_QUANTUM)
    assert p.cost_usd == sum((r.usd for r in rows), Decimal(0))


def test_a_spot_notice_on_aws_resumes_the_job_on_gcp_bit_identical_and_charged_only_for_what_ran(
    moto_url: str, gcs_endpoint: str, gcs_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with two_clouds(moto_url, gcs_endpoint, gcs_client, tmp_path, monkeypatch) as c:
        assert c.rt.settings.public_url == "", "no callback URL: the mailbox is the only path"
        # the reference: the same workload once, uninterrupted, under the agent (on AWS: it accepts only the A10G)
        reference_job = c.submit(["A10G"], {**ENV, "TRAIN_STEP_SECONDS": "0"})
        reference_run = c.launched(reference_job)
        with MetadataServer() as metadata:
            c.boot(reference_run, metadata).wait()
        tick(c.rt, datetime.now(UTC))
        assert c.get(reference_job, reference_run.id)[0].state == "succeeded"
        reference = c.final_weights("s3://ckpt-use1/", reference_job)

        job_id = c.submit(["A10G", "A100"], ENV)
        first = c.launched(job_id)
        assert (first.provider, first.zone) == ("aws", AWS_ZONE), "the cheapest pool first"
        aws_hourly = first.hourly_usd
        assert aws_hourly < GCP_PRICE
        with MetadataServer() as metadata:
            booted = c.boot(first, metadata)
            deadline = time.monotonic() + 60
            while b"step 50 loss" not in c.log(first):
                assert time.monotonic() < deadline, booted.agent_log()
                time.sleep(0.2)
            metadata.issue_aws_interruption(in_seconds=120)
            booted.wait()
        verdict_at = datetime.now(UTC)
        tick(c.rt, verdict_at)  # the mailbox's final report: preempted, from the checkpoint it names
        job, warned = c.get(job_id, first.id)
        assert warned.outcome == "preempted" and warned.state == "preempted", booted.agent_log()
        kinds = [e.kind for e in c.events(job_id)]
        assert "interruption_notice" in kinds and "attempt_reported" in kinds
        assert c.instance_gone(warned)
        # the checkpoint the workload wrote on the signal (or a later periodic one before the agent stopped it)
        saved_steps = int(re.findall(rb"the workload checkpointed at ([0-9]+)\.0", c.log(first))[-1])
        assert 50 <= saved_steps < STEPS
        source = f"s3://ckpt-use1/tenants/demo/jobs/{job_id}/checkpoint/"
        assert parse_manifest(c.read(source + proto.MANIFEST_NAME)).checkpoint == saved_steps
        expected_left = (job.work_hours * (Decimal(1) - Decimal(saved_steps) / Decimal(STEPS))).quantize(
            Decimal("0.000001")
        )
        assert job.remaining_work_hours == expected_left, "re-budgeted on the reported progress"
        assert warned.saved_work_hours == warned.work_hours_at_start - expected_left

        second = c.launched(job_id)
        assert second.id != first.id and (second.provider, second.region) == ("gcp", "us-central1")
        assert second.work_hours_at_start == expected_left
        job, _ = c.get(job_id, second.id)
        target = f"gs://ckpt-usc1/tenants/demo/jobs/{job_id}/checkpoint/"
        assert job.checkpoint_uri == target, "the job resumes from the copy next to its new pool"
        [staged] = [e for e in c.events(job_id) if e.kind == "checkpoint_staged"]
        assert staged.data.get("placement_id") == second.id
        # the copy is the source object for object, and its MANIFEST.json (the commit mark) was written last
        copied = {k.removeprefix(target): c.read(k) for k in c.keys(target)}
        assert copied == {k.removeprefix(source): c.read(k) for k in c.keys(source)}
        blobs = {
            b.name.removeprefix(target.removeprefix("gs://ckpt-usc1/")): b
            for b in gcs_client.list_blobs("ckpt-usc1", prefix=target.removeprefix("gs://ckpt-usc1/"))
        }
        manifest_at = blobs.pop(proto.MANIFEST_NAME).time_created
        assert blobs and all(b.time_created <= manifest_at for b in blobs.values()), "MANIFEST.json copied last"

        with MetadataServer() as metadata:
            booted = c.boot(second, metadata)
            booted.wait()
        tick(c.rt, datetime.now(UTC))
        job, done = c.get(job_id, second.id)
        assert done.outcome == "succeeded" and job.state == "succeeded", booted.agent_log()
        assert c.instance_gone(done)
        assert f"resumed at step {saved_steps}".encode() in c.log(second)
        assert c.final_weights("gs://ckpt-usc1/", job_id) == reference, "bit-identical to an uninterrupted run"

        # the ledger: each placement its own run time x its own pool's price, nothing between or after
        _, warned = c.get(job_id, first.id)
        assert warned.ended_at is not None and _utc(warned.ended_at) <= verdict_at
        assert done.started_at is not None and _utc(done.started_at) >= _utc(staged.at), "no charge for staging"
        _assert_charged_only_what_ran(c.rt, warned, aws_hourly)
        _assert_charged_only_what_ran(c.rt, done, GCP_PRICE)
        [egress] = [r for r in _entries(c.rt, done.id) if r.kind == "egress"]
        assert egress.provider == "aws", "the sender pays the transfer"
        with Session(c.rt.engine) as s:
            rows = s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id)).all()
            assert {r.placement_id for r in rows} == {first.id, second.id}
            total = sum((r.usd for r in rows), Decimal(0))
        assert job.spent_usd == total
        before = {r.id for r in rows}
        tick(c.rt, datetime.now(UTC) + timedelta(minutes=10))  # long after both verdicts
        with Session(c.rt.engine) as s:
            after = {r.id for r in s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id)).all()}
        assert after == before, "nothing charged after the verdicts"
