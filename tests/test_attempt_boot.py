"""A real tick launches a job on each cloud adapter (AWS on moto EC2, GCP on tests/gcp_compute_fake.py, Azure on
tests/azure_compute_fake.py), and the instance is booted for real: the start-up script the adapter actually sent
(EC2 userData, the insert's `startup-script` metadata, the VM's customData) is run with `sh`
(tests/instance_boot.py). It fetches the agent's wheel through the URL the broker signed (moto presigned GET, GCS
V4 signed URL on the emulator, Azurite SAS), checks its SHA-256 and starts the real agent, which reads the spec the
broker wrote (with the instance's identity from tests/metadata_server.py), runs the numpy workload with the
`process` runtime and writes its checkpoint, its logs under the attempt prefix and a signed `final` report
(`succeeded`) into the tenant's mailbox, read here straight from the store. On AWS the job also gets a secret by
reference, resolved by the agent from moto's Secrets Manager: the workload receives it (its log shows the
redaction), and its value appears in no store object the attempt wrote, no user data, no database row and no API
answer.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from agent import protocol as proto
from broker.api.auth import callback_token
from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.store.tables import Placement
from providers.model import CapacityType
from tests.agent_fixtures import azure_container
from tests.agent_harness import TRAIN
from tests.azure_compute_fake import AzureComputeFake
from tests.builders import job_body
from tests.gcp_compute_fake import GcpComputeFake
from tests.instance_boot import Booted, aws_user_data, azure_custom_data, boot, gcp_startup_script
from tests.metadata_server import MetadataServer
from tests.moto_server import moto_client, running_moto_server
from tests.storage_emulators import AZURITE_ACCOUNT, AZURITE_KEY

pytest_plugins = ["tests.storage_emulators", "tests.agent_fixtures"]
pytestmark = pytest.mark.integration

STEPS, EVERY = 60, 20
MARKER = "ovs-marker-secret-value-7f3a9c1e5d"  # exists only in moto's Secrets Manager
SECRET_PREFIX = "arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/demo/"


def _job(accelerators: list[str], gpu_count: int = 1, **extra: Any) -> dict[str, Any]:
    env = {"TRAIN_STEPS": str(STEPS), "TRAIN_CHECKPOINT_EVERY": str(EVERY), "TRAIN_STEP_SECONDS": "0.005"}
    env.update(extra.pop("env", {}))
    return job_body(
        accelerators=accelerators,
        gpu_count=gpu_count,
        work_gpu_hours="2",
        max_total_usd="40",
        command=[sys.executable, str(TRAIN)],
        env=env,
        **extra,
    )


def _settings(tmp: Path, **overrides: Any) -> Settings:
    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    return Settings(
        database_url=f"sqlite:///{data / 'broker.store.db'}",
        data_dir=data,
        simulated=False,
        wait_value_usd_per_gpu_hour=0,
        agent_runtime={"aws": "process", "gcp": "process", "azure": "process"},
        agent_root=str(tmp / "instance"),
        agent_heartbeat_seconds=10,
        **overrides,
    )


def _api(rt: Runtime) -> TestClient:
    return TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})


def _placement(rt: Runtime, job_id: str) -> Placement:
    with Session(rt.engine) as s:
        [p] = s.exec(select(Placement).where(Placement.job_id == job_id)).all()
    return p


def _read_attempt(read: Any, list_keys: Any, rt: Runtime, p: Placement, bucket_prefix: str) -> dict[str, Any]:
    """The final report (verified with the placement's report key), the log and the checkpoint manifest."""
    key = callback_token(rt.settings, p.id)
    mailbox = f"{bucket_prefix}tenants/demo/mailbox/"
    finals = []
    for name in list_keys(mailbox + p.id + "-"):
        parsed = proto.parse_mailbox_entry_name(name[len(mailbox) :])
        assert parsed is not None and parsed[0] == p.id, name
        report = proto.Report.from_json(read(name))
        assert report.verify(key), f"{name}: not signed with the placement's report key"
        if report.kind is proto.ReportKind.FINAL:
            finals.append(report)
    attempt = f"{bucket_prefix}tenants/demo/jobs/{p.job_id}/attempts/{p.id}/"
    chunks = sorted(list_keys(attempt + "logs/"))
    log = b"".join(read(c) for c in chunks).decode(errors="replace")
    manifest = read(f"{bucket_prefix}tenants/demo/jobs/{p.job_id}/checkpoint/{proto.MANIFEST_NAME}")
    spec_left = list_keys(attempt + proto.SPEC_NAME)
    return {"finals": finals, "log": log, "manifest": manifest, "spec_left": spec_left, "chunks": chunks}


def _assert_succeeded(found: dict[str, Any], booted: Booted) -> None:
    assert len(found["finals"]) == 1, booted.agent_log()
    final = found["finals"][0]
    assert final.outcome is proto.Outcome.SUCCEEDED and final.exit_code == 0, (final, booted.agent_log())
    assert final.checkpointed == 1.0
    assert f"step {STEPS} loss" in found["log"], found["log"][-2000:]
    assert found["chunks"] and found["manifest"] is not None
    assert found["spec_left"] == [], "the agent deletes the spec once read"


# -- AWS -----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


def test_aws_launch_boots_the_agent_from_its_user_data_and_the_secret_never_leaks(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    ec2 = moto_client("ec2", "us-east-1", moto_url)
    s3 = moto_client("s3", "us-east-1", moto_url)
    s3.create_bucket(Bucket="ckpt-use1")
    secret = moto_client("secretsmanager", "us-east-1", moto_url).create_secret(
        Name="overspill/jobs/demo/wandb", SecretString=MARKER
    )
    assert secret["ARN"].startswith(SECRET_PREFIX)
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    settings = _settings(
        tmp_path,
        aws_regions=["us-east-1"],
        aws_instance_types=["g5.xlarge"],
        aws_endpoint_url=moto_url,
        aws_launch=True,
        aws_image_id=ami,
        checkpoint_stores={"aws/us-east-1": "s3://ckpt-use1/"},
        tenant_secret_prefixes={"demo": [SECRET_PREFIX]},
    )
    rt = build_runtime(settings)
    tick(rt, datetime.now(UTC))
    api = _api(rt)
    body = _job(
        ["A10G"],
        env={"TRAIN_PRINT_ENV": "WANDB_API_KEY"},
        secrets=[{"env": "WANDB_API_KEY", "source": "aws-secretsmanager", "ref": secret["ARN"]}],
    )
    job = api.post("/v1/jobs", json=body)
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    tick(rt, datetime.now(UTC))
    p = _placement(rt, job_id)
    assert (
        p.provider == "aws"
        and p.instance_id
        and p.attempt_uri == (f"s3://ckpt-use1/tenants/demo/jobs/{job_id}/attempts/{p.id}/")
    )
    user_data = aws_user_data(ec2, p.instance_id)
    assert user_data == p.user_data and "X-Amz-Signature=" in user_data
    assert f"--spec {p.attempt_uri}spec.json" in user_data or f"'{p.attempt_uri}spec.json'" in user_data
    wheel = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt-use1", Prefix="_agent/")["Contents"]]
    assert len(wheel) == 1 and wheel[0].endswith("-py3-none-any.whl")

    with MetadataServer() as metadata:
        booted = boot(user_data, tmp_path / "instance", {"OVERSPILL_METADATA_URL": metadata.url}, gpus=1)
        booted.wait()

    def read(key: str) -> bytes:
        return bytes(s3.get_object(Bucket="ckpt-use1", Key=key)["Body"].read())

    def list_keys(prefix: str) -> list[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket="ckpt-use1", Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    found = _read_attempt(read, list_keys, rt, p, "")
    _assert_succeeded(found, booted)
    assert "WANDB_API_KEY=[redacted]" in found["log"], "the workload received the secret (the agent masked it)"

    # the secret's value is nowhere the broker or the launch put anything
    everything = list_keys("")
    for key in everything:
        assert MARKER.encode() not in read(key), f"the secret value is in the store object {key}"
    assert MARKER not in user_data
    db = Path(settings.data_dir) / "broker.store.db"
    with sqlite3.connect(db) as conn:
        dump = "\n".join(conn.iterdump())
    assert secret["ARN"] in dump and MARKER not in dump
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events", "/v1/jobs"):
        answer = api.get(path)
        assert answer.status_code == 200 and MARKER not in answer.text, path
    assert MARKER not in booted.agent_log()


# -- GCP -----------------------------------------------------------------------------------------------------------


class GcpMarket:
    name = "gcp-prices"

    def offerings(self, now: datetime) -> list[Any]:
        from tests.test_provider_gcp import offering

        a = offering()
        return [dataclasses.replace(a, price=dataclasses.replace(a.price, observed_at=now))]


def _signing_key(path: Path) -> Path:
    """A service-account key JSON with a fresh RSA key: what signs GCS URLs (the emulator checks no signature)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    doc = {
        "type": "service_account",
        "project_id": "overspill-test",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "broker@overspill-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path.write_text(json.dumps(doc))
    return path


def test_gcp_launch_boots_the_agent_from_its_startup_script_metadata(
    gcs_endpoint: str, gcs_client: Any, tmp_path: Path
) -> None:
    from tests.test_provider_gcp import make_provider

    if gcs_client.lookup_bucket("ckpt-usc1") is None:
        gcs_client.create_bucket("ckpt-usc1")
    settings = _settings(
        tmp_path,
        checkpoint_stores={"gcp/us-central1": "gs://ckpt-usc1/"},
        gcs_endpoint=gcs_endpoint,
        gcs_signing_key_file=_signing_key(tmp_path / "sa.json"),
    )
    with GcpComputeFake() as fake:
        rt = build_runtime(settings)
        gcp = make_provider(fake)
        rt.providers[gcp.name] = gcp
        rt.offering_sources.append(GcpMarket())
        tick(rt, datetime.now(UTC))
        api = _api(rt)
        job = api.post("/v1/jobs", json=_job(["T4"], gpu_count=2))
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        tick(rt, datetime.now(UTC))
        p = _placement(rt, job_id)
        assert p.provider == "gcp" and p.instance_id
        script = gcp_startup_script(fake, p.instance_id)
    assert script == p.user_data and "X-Goog-Signature=" in script and "STORAGE_EMULATOR_HOST" in script
    bucket = gcs_client.bucket("ckpt-usc1")
    with MetadataServer() as metadata:
        booted = boot(script, tmp_path / "instance", {"OVERSPILL_METADATA_URL": metadata.url}, gpus=2)
        booted.wait()

    def read(key: str) -> bytes:
        return bytes(bucket.blob(key).download_as_bytes())

    def list_keys(prefix: str) -> list[str]:
        return [b.name for b in gcs_client.list_blobs("ckpt-usc1", prefix=prefix)]

    _assert_succeeded(_read_attempt(read, list_keys, rt, p, ""), booted)


# -- Azure ---------------------------------------------------------------------------------------------------------


class AzureMarket:
    name = "azure-prices"

    def offerings(self, now: datetime) -> list[Any]:
        from tests.test_provider_azure import offering

        a = offering(CapacityType.SPOT)
        return [dataclasses.replace(a, price=dataclasses.replace(a.price, observed_at=now))]


def test_azure_launch_boots_the_agent_from_its_custom_data(
    azurite_https: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_provider_azure import SUB, make_provider

    endpoint, cafile = azurite_https
    container = azure_container(endpoint, cafile, "ckpt-eastus")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", cafile)  # the broker's own client trusts Azurite's certificate
    connection = (
        f"DefaultEndpointsProtocol=https;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint};"
    )
    settings = _settings(
        tmp_path,
        checkpoint_stores={"azure/eastus": "az://ckpt-eastus/"},
        azure_storage_connection_string=connection,
    )
    with AzureComputeFake(SUB) as fake:
        rt = build_runtime(settings)
        azure = make_provider(fake)
        rt.providers[azure.name] = azure
        rt.offering_sources.append(AzureMarket())
        tick(rt, datetime.now(UTC))
        api = _api(rt)
        job = api.post("/v1/jobs", json=_job(["A100-80GB"]))
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        tick(rt, datetime.now(UTC))
        p = _placement(rt, job_id)
        assert p.provider == "azure" and p.instance_id
        script = azure_custom_data(fake, p.instance_id)
    assert script == p.user_data and "sig=" in script and f"OVERSPILL_AZURE_BLOB_ENDPOINT={endpoint}" in script
    with MetadataServer() as metadata:
        env = {"OVERSPILL_METADATA_URL": metadata.url, "SSL_CERT_FILE": cafile}
        booted = boot(script, tmp_path / "instance", env, gpus=1)
        booted.wait()

    def read(key: str) -> bytes:
        return bytes(container.get_blob_client(key).download_blob().readall())

    def list_keys(prefix: str) -> list[str]:
        return [b.name for b in container.list_blobs(name_starts_with=prefix)]

    _assert_succeeded(_read_attempt(read, list_keys, rt, p, ""), booted)
