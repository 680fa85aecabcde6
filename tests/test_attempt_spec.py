"""The attempt spec the launch step writes for the agent, and where: its content per provider (runtime, notice,
registry login, callback, report key), its confinement (the tenant's attempt prefix in the store its instance uses,
the nearest of the provider when the target region has none; secret references re-checked), the start-up script the
provider receives, and what happens without a store (the pool is not launchable, quoted `no_checkpoint_store`) or
when the store fails (the placement waits, is never launched without its spec, and fails over after three tries).

Driven through `tick()` with a scripted cloud that says its instances run the agent, on local file stores."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlmodel import Session, select

from agent import protocol as proto
from broker.agent_side.attempt_spec import build_spec, registry_auth
from broker.agent_side.publish import agent_wheel
from broker.api.auth import callback_token
from broker.config.checkpoint_stores import CheckpointRefused, CheckpointStores
from broker.config.settings import Settings
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import Job, JobEvent, Placement
from providers.model import SecretReference
from tests.builders import job_body, spec
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, admin_api, attach

PREFIX = "arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/demo/"


class AgentCloud(ScriptedCloud):
    """A scripted cloud whose instances would run the agent (as AWS's do)."""

    boots_agent: ClassVar[bool] = True
    notice_source: ClassVar[str] = "aws"


def _build(settings: Settings, provider: object = None, **job: Any) -> proto.AttemptSpec:
    return build_spec(
        settings,
        spec(tenant="demo", image="ghcr.io/acme/train:1.0", command=("python", "train.py"), gpu_count=2, **job),
        job_id="job-1",
        placement_id="plc-1",
        provider_name="aws",
        provider=provider or AgentCloud,
        checkpoint_uri="s3://b/tenants/demo/jobs/job-1/checkpoint",
        resume=True,
        attempt_prefix="s3://b/tenants/demo/jobs/job-1/attempts/plc-1/",
        mailbox_uri="s3://b/tenants/demo/mailbox/",
    )


def test_spec_carries_the_job_and_the_broker_side_of_the_protocol() -> None:
    settings = Settings(public_url="https://broker.example/", agent_heartbeat_seconds=30)
    secret = SecretReference("WANDB_API_KEY", "aws-secretsmanager", PREFIX + "wandb-AbC", "key")
    built = _build(
        _with(settings, demo=[PREFIX]),
        env={"A": "1", "B": "--privileged"},
        secrets=(secret,),
        shm_size_gb=Decimal("2.5"),
    )
    assert built.runtime is proto.Runtime.DOCKER, "docker unless the operator configures another runtime"
    assert built.command == ("python", "train.py") and built.image == "ghcr.io/acme/train:1.0"
    assert built.checkpoint.uri.endswith("/checkpoint/") and built.checkpoint.resume
    assert built.logs_uri == "s3://b/tenants/demo/jobs/job-1/attempts/plc-1/logs/"
    assert built.mailbox_uri == "s3://b/tenants/demo/mailbox/"
    assert built.report_key == callback_token(settings, "plc-1") and len(bytes.fromhex(built.report_key)) == 32
    assert built.callback_url == "https://broker.example/v1/placements/plc-1/reports"
    assert built.notice.source is proto.NoticeSource.AWS and built.heartbeat_seconds == 30
    assert built.gpu_count == 2 and built.shm_size_gb == "2.5" and built.env == {"A": "1", "B": "--privileged"}
    assert built.secrets == (
        proto.SecretRef("WANDB_API_KEY", proto.SecretSource.AWS_SECRETS_MANAGER, secret.ref, "key"),
    )
    assert proto.AttemptSpec.from_json(built.to_json()) == built  # the agent reads back exactly this

    plain = _build(Settings(agent_runtime={"aws": "process"}), provider=object())
    assert plain.callback_url is None and plain.shm_size_gb is None and plain.runtime is proto.Runtime.PROCESS
    assert plain.notice.source is proto.NoticeSource.NONE  # a provider with no notice of its own (libcloud)


def _with(settings: Settings, **prefixes: list[str]) -> Settings:
    return settings.model_copy(update={"tenant_secret_prefixes": prefixes})


def test_secret_references_are_checked_again_when_the_spec_is_built() -> None:
    secret = SecretReference("K", "aws-secretsmanager", PREFIX + "k")
    with pytest.raises(ValueError, match=r"secrets\[0\]\.ref: .* may reference no secrets"):
        _build(Settings(), secrets=(secret,))
    elsewhere = _with(Settings(), demo=["projects/p/secrets/demo-"])
    with pytest.raises(ValueError, match=r"secrets\[0\]\.ref: .*not under one of tenant 'demo'"):
        _build(elsewhere, secrets=(secret,))
    climbing = SecretReference("K", "gcp-secretmanager", "projects/p/secrets/demo-x/versions/../../other")
    with pytest.raises(ValueError, match=r"secrets\[0\]\.ref"):
        _build(elsewhere, secrets=(climbing,))
    with pytest.raises(ValueError, match=r"registry_secret\.ref"):
        _build(elsewhere, registry_secret=SecretReference("", "gcp-secretmanager", "projects/p/secrets/other"))


@pytest.mark.parametrize(
    ("image", "kind", "server"),
    [
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1", proto.RegistryAuthKind.ECR, None),
        ("europe-docker.pkg.dev/p/r/train:1", proto.RegistryAuthKind.GCP, None),
        ("gcr.io/p/train:1", proto.RegistryAuthKind.GCP, None),
        ("acmeregistry.azurecr.io/train:1", proto.RegistryAuthKind.ACR, None),
        ("ghcr.io/acme/train:1", proto.RegistryAuthKind.NONE, ""),
        ("ubuntu:24.04", proto.RegistryAuthKind.NONE, ""),
        ("evil.dkr.ecr.us-east-1.amazonaws.com.attacker.io/x:1", proto.RegistryAuthKind.NONE, ""),
    ],
)
def test_registry_login_follows_the_image_host(image: str, kind: proto.RegistryAuthKind, server: str | None) -> None:
    auth = registry_auth(image, None)
    assert auth.kind is kind
    assert auth.server == (image.split("/")[0] if server is None else server)


def test_a_registry_secret_wins_over_the_host() -> None:
    ref = SecretReference("", "azure-keyvault", "https://acme-kv.vault.azure.net/secrets/registry")
    auth = registry_auth("registry.acme.internal:5000/train:1", ref)
    assert auth.kind is proto.RegistryAuthKind.SECRET and auth.server == "registry.acme.internal:5000"
    assert auth.secret is not None and auth.secret.ref == ref.ref and auth.secret.source.value == "azure-keyvault"
    assert registry_auth("ubuntu", ref).server == "docker.io"


def test_the_store_an_instance_uses_is_its_regions_or_its_providers_nearest(tmp_path: Path) -> None:
    root = tmp_path / "stores"
    places = ["aws/us-east-2", "aws/us-west-2", "aws/eu-west-1", "gcp/us-central1"]
    stores = CheckpointStores.from_settings(
        Settings(
            data_dir=tmp_path / "data", checkpoint_stores={p: f"file://{root}/{p.replace('/', '-')}/" for p in places}
        )
    )
    assert stores.for_launch("aws", "us-west-2") == (("aws", "us-west-2"), f"file://{root}/aws-us-west-2/")
    assert stores.for_launch("aws", "us-east-1")[0] == ("aws", "us-east-2")  # type: ignore[index]
    assert stores.for_launch("aws", "eu-central-1")[0] == ("aws", "eu-west-1")  # type: ignore[index]
    assert stores.for_launch("aws", "ap-south-1")[0] == ("aws", "eu-west-1")  # nothing shared: first by name
    assert stores.for_launch("azure", "eastus") is None
    assert stores.providers_with_stores() == {"aws", "gcp"}
    store = stores.broker_store(f"file://{root}/aws-us-west-2/", "_agent/")
    assert store.uri("x").endswith("/aws-us-west-2/_agent/x")
    with pytest.raises(CheckpointRefused):
        stores.broker_store(f"file://{root}/aws-us-west-2/", "tenants/")
    with pytest.raises(CheckpointRefused):
        stores.broker_store(f"file://{root}/aws-us-west-2/tenants/demo/", "_agent/")


# -- through the loop ----------------------------------------------------------------------------------------------


@pytest.fixture
def stores_dir(tmp_path: Path) -> Path:
    return tmp_path.parent / f"{tmp_path.name}-stores"


def _runtime(make_runtime: Callable[..., Runtime], db_url: str, clock: MovableClock, **settings: Any) -> Runtime:
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0, **settings)
    attach(rt, AgentCloud("aws", clock, zones=("us-east-1a",), region="us-east-1"))
    tick(rt, clock())
    return rt


def _placements(rt: Runtime, job_id: str) -> list[Placement]:
    with Session(rt.engine) as s:
        return list(s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.id)).all())


def _events(rt: Runtime, job_id: str, kind: str) -> list[JobEvent]:
    with Session(rt.engine) as s:
        return list(s.exec(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)).all())


def test_launch_writes_the_spec_in_the_nearest_store_and_boots_with_the_agent(
    make_runtime: Callable[..., Runtime], db_url: str, clock: MovableClock, stores_dir: Path
) -> None:
    west = stores_dir / "usw2"
    west.mkdir(parents=True)
    rt = _runtime(make_runtime, db_url, clock, checkpoint_stores={"aws/us-west-2": f"file://{west}/"})
    cloud = rt.providers["aws"]
    api = admin_api(rt)
    job_id = api.post("/v1/jobs", json=job_body(env={"A": "1"}, shm_size_gb="8")).json()["id"]
    tick(rt, clock.advance(minutes=1))
    [p] = _placements(rt, job_id)
    attempt = f"file://{west}/tenants/demo/jobs/{job_id}/attempts/{p.id}/"
    assert p.attempt_uri == attempt and p.instance_id is not None
    [request] = cloud.requests  # type: ignore[attr-defined]
    assert request.user_data == p.user_data and f"{attempt}spec.json" in request.user_data
    wheel = agent_wheel()
    assert (
        wheel.sha256 in request.user_data and f"file://{west}/_agent/{wheel.sha256}/{wheel.name}" in request.user_data
    )
    assert (west / "_agent" / wheel.sha256 / wheel.name).read_bytes() == wheel.data
    written = proto.AttemptSpec.from_json((west / f"tenants/demo/jobs/{job_id}/attempts/{p.id}/spec.json").read_bytes())
    assert written.placement_id == p.id and written.env == {"A": "1"} and written.shm_size_gb == "8"
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
    assert job is not None and written.checkpoint.uri == job.checkpoint_uri
    assert job.checkpoint_uri == f"file://{west}/tenants/demo/jobs/{job_id}/checkpoint/"  # the nearest aws store
    assert (job.checkpoint_provider, job.checkpoint_region) == ("aws", "us-west-2")
    assert not written.checkpoint.resume
    [event] = _events(rt, job_id, "attempt_spec_written")
    assert event.data["attempt_uri"] == attempt


def test_without_a_store_for_the_provider_its_pools_are_not_launchable(
    make_runtime: Callable[..., Runtime], db_url: str, clock: MovableClock, stores_dir: Path
) -> None:
    (stores_dir / "g").mkdir(parents=True)
    rt = _runtime(make_runtime, db_url, clock, checkpoint_stores={"gcp/us-central1": f"file://{stores_dir}/g/"})
    plain = ScriptedCloud("scripted", clock)  # runs no agent: needs no store
    plain.prices = {z: Decimal("20") for z in plain.zones}
    attach(rt, plain)
    tick(rt, clock.advance(minutes=1))
    api = admin_api(rt)
    quote = api.post("/v1/quotes", json=job_body()).json()
    rejected = {r["provider"]: r for r in quote["rejections"]}
    assert rejected["aws"]["reason"] == "no_checkpoint_store", quote
    assert "OVERSPILL_CHECKPOINT_STORES" in rejected["aws"]["message"]
    assert {c["offering"]["provider"] for c in quote["candidates"]} == {"scripted"}
    job_id = api.post("/v1/jobs", json=job_body()).json()["id"]
    tick(rt, clock.advance(minutes=1))
    [p] = _placements(rt, job_id)
    assert p.provider == "scripted" and p.attempt_uri is None and p.user_data is None


def test_a_store_failure_keeps_the_placement_waiting_and_never_launches_without_its_spec(
    make_runtime: Callable[..., Runtime], db_url: str, clock: MovableClock, stores_dir: Path
) -> None:
    store = stores_dir / "use1"
    store.mkdir(parents=True)
    (store / "tenants").write_text("not a directory: every write under tenants/ fails")
    rt = _runtime(make_runtime, db_url, clock, checkpoint_stores={"aws/us-east-1": f"file://{store}/"})
    cloud = rt.providers["aws"]
    job_id = admin_api(rt).post("/v1/jobs", json=job_body()).json()["id"]
    tick(rt, clock.advance(minutes=1))
    [p] = _placements(rt, job_id)
    assert p.state == "launching" and p.instance_id is None and p.user_data is None
    assert cloud.requests == []  # type: ignore[attr-defined]
    assert len(_events(rt, job_id, "attempt_spec_failed")) == 1
    (store / "tenants").unlink()  # the store is back
    tick(rt, clock.advance(minutes=1))
    [p] = _placements(rt, job_id)
    assert p.instance_id is not None and p.user_data is not None and len(cloud.requests) == 1  # type: ignore[attr-defined]


def test_after_three_store_failures_the_launch_fails_over(
    make_runtime: Callable[..., Runtime], db_url: str, clock: MovableClock, stores_dir: Path
) -> None:
    store = stores_dir / "use1"
    store.mkdir(parents=True)
    (store / "tenants").write_text("x")
    rt = _runtime(make_runtime, db_url, clock, checkpoint_stores={"aws/us-east-1": f"file://{store}/"})
    job_id = admin_api(rt).post("/v1/jobs", json=job_body()).json()["id"]
    for _ in range(3):
        tick(rt, clock.advance(minutes=1))
    first = _placements(rt, job_id)[0]
    assert first.state == "failed" and first.detail.startswith("AttemptStoreUnavailable:")
    assert rt.providers["aws"].requests == []  # type: ignore[attr-defined]


def test_a_secret_no_longer_allowed_pauses_the_job_before_any_launch(
    make_runtime: Callable[..., Runtime], db_url: str, clock: MovableClock, stores_dir: Path
) -> None:
    store = stores_dir / "use1"
    store.mkdir(parents=True)
    rt = _runtime(
        make_runtime,
        db_url,
        clock,
        checkpoint_stores={"aws/us-east-1": f"file://{store}/"},
        tenant_secret_prefixes={"demo": [PREFIX]},
    )
    body = job_body(secrets=[{"env": "K", "source": "aws-secretsmanager", "ref": PREFIX + "k"}])
    job_id = admin_api(rt).post("/v1/jobs", json=body).json()["id"]
    rt.settings.tenant_secret_prefixes = {}  # the operator withdrew the prefix
    tick(rt, clock.advance(minutes=1))
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
    assert job is not None and job.state == "paused" and "secrets[0].ref" in job.wait_reason
    assert rt.providers["aws"].requests == []  # type: ignore[attr-defined]
    assert not list(store.rglob("spec.json"))
