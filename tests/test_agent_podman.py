"""The real agent with the `podman` runtime: the training workload in a real image (mmdebstrap + python3-numpy,
tests/container_images.py) pulled from a local TLS registry that requires a login (tests/registry.py), with the
registry credentials in a moto Secrets Manager secret and the store on moto S3.

Proves in a container what tests/test_agent_run.py proves for a process: a GCP notice mid-run makes the workload
checkpoint, a second attempt resumes and ends bit-identical to an uninterrupted container run; and classifies a wrong
registry password and a missing image as infra_failed, a failing workload as user_failed.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent import protocol as p
from tests.agent_harness import (
    STEPS,
    S3Reader,
    agent_env,
    checkpoint_file,
    final_report,
    log_chunks,
    log_text,
    make_spec,
    manifest,
    publish_spec,
    reports,
    start_agent,
    wait_for,
)
from tests.container_images import containers_conf, podman, podman_ready, train_image
from tests.metadata_server import MetadataServer
from tests.moto_server import moto_client
from tests.registry import PASSWORD, USER, LoginRegistry, registry_ready

pytest_plugins = ["tests.storage_emulators", "tests.agent_fixtures"]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry() -> Iterator[LoginRegistry]:
    reason = podman_ready() or registry_ready()
    if reason:
        pytest.skip(reason)
    with LoginRegistry() as reg:
        yield reg


@pytest.fixture(scope="module")
def image(registry: LoginRegistry) -> Iterator[str]:
    """The training image, pushed to the login-protected registry and absent from podman's local store."""
    ref = registry.push(train_image(), f"acme/train:{uuid.uuid4().hex[:8]}")
    podman("rmi", "--ignore", ref)
    yield ref
    podman("rmi", "--ignore", ref, check=False)  # what the agent pulled


@pytest.fixture(scope="module")
def creds(s3_endpoint: str) -> dict[str, str]:
    """Secrets Manager holding the registry login, a wrong one, and a bucket for everything else."""
    sm: Any = moto_client("secretsmanager", "us-east-1", s3_endpoint)
    tag = uuid.uuid4().hex[:6]
    sm.create_secret(Name=f"registry/{tag}", SecretString=json.dumps({"username": USER, "password": PASSWORD}))
    sm.create_secret(Name=f"registry-bad/{tag}", SecretString=json.dumps({"username": USER, "password": "wrong"}))
    return {"good": f"registry/{tag}", "bad": f"registry-bad/{tag}"}


@pytest.fixture
def reader(s3_client: Any) -> S3Reader:
    if "agent-podman" not in [b["Name"] for b in s3_client.list_buckets()["Buckets"]]:
        s3_client.create_bucket(Bucket="agent-podman")
    return S3Reader(s3_client, "agent-podman")


def _spec(reader: S3Reader, image: str, registry: LoginRegistry, secret: str, **overrides: Any) -> p.AttemptSpec:
    auth = p.RegistryAuth(
        p.RegistryAuthKind.SECRET, registry.host, p.SecretRef("REGISTRY", p.SecretSource.AWS_SECRETS_MANAGER, secret)
    )
    overrides.setdefault("command", ("python3", "/app/train.py"))
    return make_spec(reader, runtime=p.Runtime.PODMAN, image=image, registry=auth, **overrides)


def _env(wheel: Path, metadata: MetadataServer, s3_endpoint: str, registry: LoginRegistry) -> dict[str, str]:
    return agent_env(
        wheel,
        {
            "OVERSPILL_METADATA_URL": metadata.url,
            "AWS_ENDPOINT_URL": s3_endpoint,
            "CONTAINERS_CONF": str(containers_conf()),
            "OVERSPILL_REGISTRY_CERT_DIR": str(registry.cert_dir / registry.host),
        },
    )


def _run(spec: p.AttemptSpec, reader: S3Reader, env: dict[str, str], work: Path, *args: str) -> p.Report:
    run = start_agent(publish_spec(reader, spec), spec, work, env, *args)
    assert run.wait(180) == 0, run.stderr()
    return final_report(reader, spec)


def test_training_in_a_pulled_container_checkpoints_on_notice_and_resumes_bit_identical(
    image: str, registry: LoginRegistry, creds: dict[str, str], reader: S3Reader, metadata: MetadataServer,
    s3_endpoint: str, agent_wheel: Path, tmp_path: Path,
) -> None:  # fmt: skip
    env = _env(agent_wheel, metadata, s3_endpoint, registry)
    first = _spec(
        reader,
        image,
        registry,
        creds["good"],
        notice=p.NoticeSpec(p.NoticeSource.GCP),
        env={"TRAIN_STEP_SECONDS": "0.02"},
    )
    run = start_agent(publish_spec(reader, first), first, tmp_path / "c1", env)
    wait_for(lambda: b"step 20 loss" in b"".join(d for _, d in log_chunks(reader, first)), 120, "step 20 in the log")
    metadata.issue_gcp_preemption()
    assert run.wait(60) == 0, run.stderr()
    final = final_report(reader, first)
    assert final.outcome is p.Outcome.PREEMPTED, final.detail
    text = log_text(reader, first)
    assert f"logging in to {registry.host} as {USER}" in text and f"pulling {image}" in text
    assert "notice preempt: checkpointed at step" in text
    saved = manifest(reader, first)
    assert saved is not None and 20 <= saved.checkpoint < STEPS
    assert PASSWORD not in text and PASSWORD not in run.stderr()
    private = [f for f in (run.work_dir / "agent").rglob("*") if f.is_file()]
    assert all(PASSWORD.encode() not in f.read_bytes() for f in private)  # logged out once the image was pulled

    second = _spec(
        reader, image, registry, creds["good"], job_id=first.job_id, checkpoint=replace(first.checkpoint, resume=True)
    )
    assert _run(second, reader, env, tmp_path / "c2").outcome is p.Outcome.SUCCEEDED
    assert f"resumed at step {int(saved.checkpoint)}" in log_text(reader, second)

    reference = _spec(reader, image, registry, creds["good"])
    assert _run(reference, reader, env, tmp_path / "c3").outcome is p.Outcome.SUCCEEDED
    resumed, uninterrupted = (
        checkpoint_file(reader, second, "final.npy"),
        checkpoint_file(reader, reference, "final.npy"),
    )
    assert resumed is not None and uninterrupted is not None
    assert hashlib.sha256(resumed).hexdigest() == hashlib.sha256(uninterrupted).hexdigest()
    assert podman("ps", "-a", "--filter", f"name=ovs-{first.placement_id}", "-q") == ""  # nothing left behind


def test_a_wrong_registry_password_is_an_infra_failure(
    image: str, registry: LoginRegistry, creds: dict[str, str], reader: S3Reader, metadata: MetadataServer,
    s3_endpoint: str, agent_wheel: Path, tmp_path: Path,
) -> None:  # fmt: skip
    env = _env(agent_wheel, metadata, s3_endpoint, registry)
    spec = _spec(reader, image, registry, creds["bad"])
    final = _run(spec, reader, env, tmp_path / "w")
    assert final.outcome is p.Outcome.INFRA_FAILED and "registry login" in final.detail
    assert "started" not in [r.kind.value for r in reports(reader, spec)]
    assert "wrong" not in final.detail


def test_a_missing_image_is_an_infra_failure_after_retries(
    image: str, registry: LoginRegistry, creds: dict[str, str], reader: S3Reader, metadata: MetadataServer,
    s3_endpoint: str, agent_wheel: Path, tmp_path: Path,
) -> None:  # fmt: skip
    env = _env(agent_wheel, metadata, s3_endpoint, registry)
    spec = _spec(reader, f"{registry.host}/acme/no-such-image:1", registry, creds["good"])
    final = _run(spec, reader, env, tmp_path / "w", "--retry-attempts", "2")
    assert final.outcome is p.Outcome.INFRA_FAILED and "after 2 attempts" in final.detail


def test_a_failing_workload_in_a_container_is_a_user_failure(
    image: str, registry: LoginRegistry, creds: dict[str, str], reader: S3Reader, metadata: MetadataServer,
    s3_endpoint: str, agent_wheel: Path, tmp_path: Path,
) -> None:  # fmt: skip
    env = _env(agent_wheel, metadata, s3_endpoint, registry)
    failing = _spec(reader, image, registry, creds["good"], env={"TRAIN_FAIL_AT_STEP": "5"})
    final = _run(failing, reader, env, tmp_path / "w1")
    assert (final.outcome, final.exit_code) == (p.Outcome.USER_FAILED, 3) and "loss is NaN" in final.log_tail
    missing = _spec(reader, image, registry, creds["good"], command=("/no/such/binary",))
    final = _run(missing, reader, env, tmp_path / "w2")
    assert final.outcome is p.Outcome.USER_FAILED and "not found" in final.detail


def test_the_docker_runtime_through_a_docker_cli_shim(
    image: str, registry: LoginRegistry, creds: dict[str, str], reader: S3Reader, metadata: MetadataServer,
    s3_endpoint: str, agent_wheel: Path, tmp_path: Path,
) -> None:  # fmt: skip
    """The docker code path (DOCKER_CONFIG for the login, `--gpus` syntax, no --cert-dir) with a `docker` that is
    podman underneath (lab-notes-3.md): podman reads the login where docker would keep it."""
    shim = tmp_path / "docker"
    shim.write_text('#!/bin/sh\n[ -n "${DOCKER_CONFIG:-}" ] && export REGISTRY_AUTH_FILE="$DOCKER_CONFIG/config.json"\n'
                    'exec podman "$@"\n')  # fmt: skip
    shim.chmod(0o755)
    registries = tmp_path / "registries.conf"  # docker has no --cert-dir: trust the test registry's TLS as docker
    registries.write_text(f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n')
    env = _env(agent_wheel, metadata, s3_endpoint, registry)
    env["CONTAINERS_REGISTRIES_CONF"] = str(registries)
    spec = replace(_spec(reader, image, registry, creds["good"], env={"TRAIN_STEPS": "5"}), runtime=p.Runtime.DOCKER)
    final = _run(spec, reader, env, tmp_path / "w", "--runtime-binary", str(shim))
    assert final.outcome is p.Outcome.SUCCEEDED, final.detail
    assert "step 5 loss" in log_text(reader, spec)
    assert not (tmp_path / "w" / "agent" / "registry" / "config.json").exists()  # logged out after the pull
