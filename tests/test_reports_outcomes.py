"""Every outcome of a real attempt is classified through the tenant mailbox, on every cloud adapter, with no
callback URL: a real tick launches the job (AWS on moto EC2 + S3, GCP on tests/gcp_compute_fake.py + the GCS
emulator, Azure on tests/azure_compute_fake.py + Azurite), the start-up script the cloud was sent is run for real
(tests/instance_boot.py: the real agent, the `process` runtime, the numpy workload), and the next real tick reads the
agent's signed final report from the mailbox and turns it into the job's verdict:
- succeeded -> the job succeeded, the instance deleted;
- user_failed (the workload exits 3) -> the job failed for good, the log tail in the event;
- infra_failed (the job needs a GPU the instance does not have) -> retried elsewhere within `max_infra_retries`,
  the failing pool not tried again for the job, then failed with the reason.
A lost callback (the broker's public URL unreachable) never turns a failure into a success, nor does an instance
that ended without a final report.
"""

from __future__ import annotations

import contextlib
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
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.store.tables import Job, JobEvent, Placement
from providers.base import NotFound
from tests.agent_fixtures import azure_container
from tests.azure_compute_fake import AzureComputeFake
from tests.gcp_compute_fake import GcpComputeFake
from tests.instance_boot import Booted, aws_user_data, azure_custom_data, boot, gcp_startup_script
from tests.metadata_server import MetadataServer
from tests.moto_server import moto_client, running_moto_server
from tests.storage_emulators import AZURITE_ACCOUNT, AZURITE_KEY
from tests.test_attempt_boot import AzureMarket, GcpMarket, _api, _job, _settings, _signing_key

pytest_plugins = ["tests.storage_emulators", "tests.agent_fixtures"]
pytestmark = pytest.mark.integration


@dataclass
class Cloud:
    """One cloud adapter with its stand-ins, ready to launch jobs and boot their instances."""

    rt: Runtime
    api: TestClient
    accelerator: str
    gpus: int
    script_of: Callable[[str], str]  # instance id -> the start-up script the cloud was sent
    boot_env: dict[str, str]

    def submit(self, **extra: Any) -> str:
        answer = self.api.post("/v1/jobs", json=_job([self.accelerator], gpu_count=self.gpus, **extra))
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def launched(self, job_id: str) -> Placement:
        tick(self.rt, datetime.now(UTC))
        with Session(self.rt.engine) as s:
            live = s.exec(
                select(Placement).where(
                    Placement.job_id == job_id, Placement.state.in_(("launching", "queued", "running"))
                )  # type: ignore[attr-defined]
            ).all()
        assert len(live) == 1, live
        assert live[0].instance_id and live[0].attempt_uri
        return live[0]

    def run(self, p: Placement, *, gpus: int | None = None) -> Booted:
        """Boot the instance for real: its start-up script, the real agent, the workload; wait for the agent."""
        assert p.instance_id is not None
        script = self.script_of(p.instance_id)
        assert script == p.user_data
        root = Path(self.rt.settings.agent_root)
        shutil.rmtree(root, ignore_errors=True)  # a fresh instance (a test may boot several in turn)
        with MetadataServer() as metadata:
            env = {"OVERSPILL_METADATA_URL": metadata.url, **self.boot_env}
            booted = boot(script, root, env, gpus=self.gpus if gpus is None else gpus)
            booted.wait()
        return booted

    def verdict(self, job_id: str, p: Placement) -> tuple[Job, Placement, list[JobEvent]]:
        tick(self.rt, datetime.now(UTC))
        with Session(self.rt.engine) as s:
            job, placement = s.get(Job, job_id), s.get(Placement, p.id)
            events = list(s.exec(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)).all())  # type: ignore[arg-type]
        assert job is not None and placement is not None
        return job, placement, events

    def instance_gone(self, p: Placement) -> bool:
        provider = self.rt.provider(p.provider)
        assert provider is not None and p.instance_id is not None
        try:
            return provider.get(p.instance_id).released
        except NotFound:
            return True


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@contextlib.contextmanager
def aws(moto_url: str, tmp: Path, mp: pytest.MonkeyPatch, **overrides: Any) -> Iterator[Cloud]:
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        mp.setenv(k, v)
    ec2 = moto_client("ec2", "us-east-1", moto_url)
    s3 = moto_client("s3", "us-east-1", moto_url)
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket="ckpt-use1")
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    settings = _settings(
        tmp,
        aws_regions=["us-east-1"],
        aws_instance_types=overrides.pop("aws_instance_types", ["g5.xlarge"]),
        aws_endpoint_url=moto_url,
        aws_launch=True,
        aws_image_id=ami,
        checkpoint_stores={"aws/us-east-1": "s3://ckpt-use1/"},
        **overrides,
    )
    rt = build_runtime(settings)
    tick(rt, datetime.now(UTC))
    yield Cloud(rt, _api(rt), "A10G", 1, lambda iid: aws_user_data(ec2, iid), {})


@contextlib.contextmanager
def gcp(gcs_endpoint: str, gcs_client: Any, tmp: Path) -> Iterator[Cloud]:
    from tests.test_provider_gcp import make_provider

    if gcs_client.lookup_bucket("ckpt-usc1") is None:
        gcs_client.create_bucket("ckpt-usc1")
    settings = _settings(
        tmp,
        checkpoint_stores={"gcp/us-central1": "gs://ckpt-usc1/"},
        gcs_endpoint=gcs_endpoint,
        gcs_signing_key_file=_signing_key(tmp / "sa.json"),
    )
    with GcpComputeFake() as fake:
        rt = build_runtime(settings)
        provider = make_provider(fake)
        rt.providers[provider.name] = provider
        rt.offering_sources.append(GcpMarket())
        tick(rt, datetime.now(UTC))
        yield Cloud(rt, _api(rt), "T4", 2, lambda iid: gcp_startup_script(fake, iid), {})


@contextlib.contextmanager
def azure(azurite_https: tuple[str, str], tmp: Path, mp: pytest.MonkeyPatch) -> Iterator[Cloud]:
    from tests.test_provider_azure import SUB, make_provider

    endpoint, cafile = azurite_https
    azure_container(endpoint, cafile, "ckpt-eastus")
    mp.setenv("REQUESTS_CA_BUNDLE", cafile)
    connection = (
        f"DefaultEndpointsProtocol=https;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint};"
    )
    settings = _settings(
        tmp, checkpoint_stores={"azure/eastus": "az://ckpt-eastus/"}, azure_storage_connection_string=connection
    )
    with AzureComputeFake(SUB) as fake:
        rt = build_runtime(settings)
        provider = make_provider(fake)
        rt.providers[provider.name] = provider
        rt.offering_sources.append(AzureMarket())
        tick(rt, datetime.now(UTC))
        yield Cloud(rt, _api(rt), "A100-80GB", 1, lambda iid: azure_custom_data(fake, iid), {"SSL_CERT_FILE": cafile})


@pytest.fixture(params=["aws", "gcp", "azure"])
def cloud(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    if request.param == "aws":
        with aws(request.getfixturevalue("moto_url"), tmp_path, monkeypatch) as c:
            yield c
    elif request.param == "gcp":
        endpoint, client = request.getfixturevalue("gcs_endpoint"), request.getfixturevalue("gcs_client")
        with gcp(endpoint, client, tmp_path) as c:
            yield c
    else:
        with azure(request.getfixturevalue("azurite_https"), tmp_path, monkeypatch) as c:
            yield c


def test_success_through_the_mailbox_finishes_the_job_and_deletes_the_instance(cloud: Cloud, tmp_path: Path) -> None:
    assert cloud.rt.settings.public_url == "", "no callback URL: the mailbox is the only path"
    job_id = cloud.submit()
    p = cloud.launched(job_id)
    cloud.run(p)
    job, placement, events = cloud.verdict(job_id, p)
    assert placement.outcome == "succeeded" and placement.state == "succeeded" and job.state == "succeeded"
    assert [e.kind for e in events].count("attempt_reported") == 1
    assert placement.checkpointed_work_hours == placement.work_hours_at_start, "the final checkpoint holds it all"
    assert cloud.instance_gone(placement), "a finished instance is deleted, success included"


def test_a_user_failure_is_final_with_the_log_tail_in_the_event(cloud: Cloud, tmp_path: Path) -> None:
    job_id = cloud.submit(env={"TRAIN_FAIL_AT_STEP": "10"})
    p = cloud.launched(job_id)
    cloud.run(p)
    job, placement, events = cloud.verdict(job_id, p)
    assert placement.outcome == "user_failed" and placement.state == "failed"
    assert job.state == "failed" and "exit code 3" in job.wait_reason
    [failed] = [e for e in events if e.kind == "failed"]
    assert "step 9 loss" in failed.data["log_tail"], failed.data
    assert cloud.instance_gone(placement)
    tick(cloud.rt, datetime.now(UTC) + timedelta(minutes=10))
    with Session(cloud.rt.engine) as s:
        assert len(s.exec(select(Placement).where(Placement.job_id == job_id)).all()) == 1, "never retried"


def test_an_infrastructure_failure_past_the_retry_budget_fails_the_job_with_the_reason(
    cloud: Cloud, tmp_path: Path
) -> None:
    job_id = cloud.submit(max_infra_retries=0)
    p = cloud.launched(job_id)
    cloud.run(p, gpus=0)  # the instance has no GPU for the job: not the workload's fault
    job, placement, _ = cloud.verdict(job_id, p)
    assert placement.outcome == "infra_failed" and placement.state == "failed"
    assert placement.detail.startswith("InfraFailed:") and "GPU" in placement.detail
    assert job.state == "failed" and "max_infra_retries 0" in job.wait_reason and "GPU" in job.wait_reason
    assert cloud.instance_gone(placement)


def test_an_infrastructure_failure_is_retried_on_another_pool_then_fails_at_the_budget(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with aws(moto_url, tmp_path, monkeypatch, aws_instance_types=["g5.xlarge", "g5.2xlarge"]) as c:
        job_id = c.submit(max_infra_retries=1)
        first = c.launched(job_id)
        c.run(first, gpus=0)
        job, placement, events = c.verdict(job_id, first)
        assert placement.state == "failed" and job.state in ("pending", "running")
        assert any(e.kind == "failed" and "1 of max_infra_retries 1" in e.message for e in events)
        second = c.launched(job_id)
        assert second.offering_key != first.offering_key, "the failing pool is not tried again for this job"
        c.run(second, gpus=0)
        job, placement, _ = c.verdict(job_id, second)
        assert placement.state == "failed" and job.state == "failed"
        assert "2 infrastructure failures, over max_infra_retries 1" in job.wait_reason


def test_a_lost_callback_never_turns_a_failure_into_a_success(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the broker's public URL is unreachable from the instance: every callback is lost, the mailbox decides
    with aws(moto_url, tmp_path, monkeypatch, public_url="http://127.0.0.1:9") as c:
        job_id = c.submit(env={"TRAIN_FAIL_AT_STEP": "10"})
        p = c.launched(job_id)
        c.run(p)
        job, placement, _ = c.verdict(job_id, p)
        assert placement.outcome == "user_failed" and job.state == "failed"


def test_an_instance_that_ends_without_a_final_report_is_never_a_success(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with aws(moto_url, tmp_path, monkeypatch) as c:
        job_id = c.submit(max_infra_retries=0)
        p = c.launched(job_id)
        tick(c.rt, datetime.now(UTC))
        assert p.instance_id is not None
        ec2 = moto_client("ec2", "us-east-1", str(c.rt.settings.aws_endpoint_url))
        ec2.terminate_instances(InstanceIds=[p.instance_id.split(":")[-1]])  # the VM ends; no agent ever reported
        tick(c.rt, datetime.now(UTC) + timedelta(minutes=3))  # past the grace for a late report
        with Session(c.rt.engine) as s:
            job, placement = s.get(Job, job_id), s.get(Placement, p.id)
        assert job is not None and placement is not None
        assert placement.state == "failed" and "without the agent's final report" in placement.detail
        assert job.state == "failed"


def test_a_notice_mid_run_checkpoints_and_the_job_resumes_on_a_new_instance_bit_identical(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole attempt for real: AWS's documented spot notice reaches the running agent (tests/metadata_server.py),
    the workload checkpoints on the signal, the agent reports `preempted` with that checkpoint, the broker re-places
    the job with exactly the work the checkpoint did not save, and a second instance's agent resumes it to the
    weights of an uninterrupted run."""
    steps = 600
    env = {"TRAIN_STEPS": str(steps), "TRAIN_CHECKPOINT_EVERY": "100", "TRAIN_STEP_SECONDS": "0.02"}
    s3 = moto_client("s3", "us-east-1", moto_url)

    def final_weights(job_id: str) -> str:
        key = f"tenants/demo/jobs/{job_id}/checkpoint/{proto.MANIFEST_NAME}"
        manifest = parse_manifest(s3.get_object(Bucket="ckpt-use1", Key=key)["Body"].read())
        [final] = [f for f in manifest.files if f.path == "final.npy"]
        return final.sha256

    with aws(moto_url, tmp_path, monkeypatch) as c:
        # the reference: the same job run once, uninterrupted, under the agent
        reference_job = c.submit(env={**env, "TRAIN_STEP_SECONDS": "0"})
        reference_run = c.launched(reference_job)
        booted = c.run(reference_run)
        assert c.verdict(reference_job, reference_run)[0].state == "succeeded", booted.agent_log()
        reference = final_weights(reference_job)

        job_id = c.submit(env=env)
        first = c.launched(job_id)
        assert first.instance_id is not None and first.attempt_uri is not None
        logs = first.attempt_uri.removeprefix("s3://ckpt-use1/") + "logs/"

        def stored_log() -> bytes:
            keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt-use1", Prefix=logs).get("Contents", []))
            return b"".join(s3.get_object(Bucket="ckpt-use1", Key=k)["Body"].read() for k in keys)

        root = Path(c.rt.settings.agent_root)
        with MetadataServer() as metadata:
            booted = boot(c.script_of(first.instance_id), root, {"OVERSPILL_METADATA_URL": metadata.url}, gpus=1)
            deadline = time.monotonic() + 60
            while b"step 50 loss" not in stored_log():
                assert time.monotonic() < deadline, booted.agent_log()
                time.sleep(0.2)
            metadata.issue_aws_interruption(in_seconds=120)
            booted.wait()
        tick(c.rt, datetime.now(UTC))  # the mailbox's final report: preempted, from the checkpoint it names
        with Session(c.rt.engine) as s:
            warned, job = s.get(Placement, first.id), s.get(Job, job_id)
            kinds = [e.kind for e in s.exec(select(JobEvent).where(JobEvent.job_id == job_id)).all()]
        assert warned is not None and job is not None
        assert warned.outcome == "preempted" and warned.state == "preempted", booted.agent_log()
        assert "interruption_notice" in kinds and "attempt_reported" in kinds
        # the last checkpoint the agent stored (the one the workload wrote on the signal, or a later periodic one
        # before the agent stopped it): what its final report names and the next attempt resumes from
        saved_steps = int(re.findall(rb"the workload checkpointed at ([0-9]+)\.0", stored_log())[-1])
        assert 50 <= saved_steps < steps
        expected_left = (job.work_hours * (Decimal(1) - Decimal(saved_steps) / Decimal(steps))).quantize(
            Decimal("0.000001")
        )
        assert job.remaining_work_hours == expected_left, "re-budgeted on the reported progress"
        assert warned.saved_work_hours == warned.work_hours_at_start - expected_left
        assert c.instance_gone(warned)
        second = c.launched(job_id)
        assert second.id != first.id and second.work_hours_at_start == expected_left
        c.run(second)
        job, placement, _ = c.verdict(job_id, second)
        assert placement.outcome == "succeeded" and job.state == "succeeded"
    second_log = b"".join(
        s3.get_object(Bucket="ckpt-use1", Key=o["Key"])["Body"].read()
        for o in sorted(
            s3.list_objects_v2(
                Bucket="ckpt-use1",
                Prefix=second.attempt_uri.removeprefix("s3://ckpt-use1/") + "logs/",  # type: ignore[union-attr]
            )["Contents"],
            key=lambda o: o["Key"],
        )
    )
    assert f"resumed at step {saved_steps}".encode() in second_log
    assert final_weights(job_id) == reference, "the resumed run ends bit-identical to an uninterrupted one"
