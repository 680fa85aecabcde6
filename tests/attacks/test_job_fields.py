"""Attacks through a job's `env`, `secrets` and `registry_secret`: reading another tenant's secrets (a reference
outside the tenant's operator-configured prefixes, or climbing out of it with `..`), overriding the agent's own
variables (`OVERSPILL_CHECKPOINT_URI`...), NUL bytes and huge values, and options or shell syntax smuggled in values
(`--privileged`, `$(...)`, `; rm`): the API refuses the first ones with a 422 naming the field, and the others are
harmless because nothing is a shell string: the values travel as JSON in the spec and reach the workload as one
environment variable or one argument each, which the real agent shows (the process runtime, the values echoed back
literally and nothing executed).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker.agent_side.attempt_spec import build_spec
from broker.api.schemas import JobCreate
from broker.config.settings import Settings
from broker.runtime import Runtime
from broker.services.jobs import new_id, spec_of
from broker.store.tables import Job
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import admin_api

pytest_plugins = ["tests.agent_fixtures"]

PREFIX = "arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/demo/"
OTHER = "arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/other/"


@pytest.fixture
def api(db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock) -> TestClient:
    rt = make_runtime(db_url, tenant_secret_prefixes={"demo": [PREFIX, "projects/p/secrets/demo-"]})
    return admin_api(rt)


def _secret(ref: str, env: str = "TOKEN", source: str = "aws-secretsmanager") -> dict[str, str]:
    return {"env": env, "source": source, "ref": ref}


def test_secret_ref_outside_the_tenants_prefix_is_refused_naming_secrets_i_ref(api: TestClient) -> None:
    ok = api.post("/v1/jobs", json=job_body(secrets=[_secret(PREFIX + "wandb-AbC")]))
    assert ok.status_code == 202, ok.text
    for i, ref in enumerate(
        (
            OTHER + "db-password",  # another tenant's
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:prod/root",  # outside every prefix
            PREFIX,  # the prefix itself names no secret
            PREFIX + "x/../../other/db",  # climbing out
            "projects/p/secrets/demo-x/versions/../../other",
        )
    ):
        source = "gcp-secretmanager" if ref.startswith("projects/") else "aws-secretsmanager"
        body = job_body(secrets=[_secret(PREFIX + "fine", "A"), _secret(ref, "B", source)])
        for route in ("/v1/jobs", "/v1/quotes"):
            answer = api.post(route, json=body)
            assert answer.status_code == 422, (i, route, answer.text)
            assert answer.json()["message"].startswith("secrets[1].ref: "), answer.json()["message"]
    registry = api.post("/v1/jobs", json=job_body(registry_secret={"source": "aws-secretsmanager", "ref": OTHER + "r"}))
    assert registry.status_code == 422 and registry.json()["message"].startswith("registry_secret.ref: ")


def test_secrets_of_a_tenant_without_prefixes_are_refused_saying_how_to_allow_them(
    db_url: str, make_runtime: Callable[..., Runtime]
) -> None:
    api = admin_api(make_runtime(db_url))
    answer = api.post("/v1/jobs", json=job_body(secrets=[_secret(PREFIX + "x")]))
    assert answer.status_code == 422
    message = answer.json()["message"]
    assert message.startswith("secrets[0].ref: ") and "OVERSPILL_TENANT_SECRET_PREFIXES" in message


@pytest.mark.parametrize(
    "name", ["OVERSPILL_CHECKPOINT_URI", "OVERSPILL_RESUME", "overspill_notice_file", "1BAD", "A-B", "A B", "X" * 129]
)
def test_env_names_of_the_agent_or_not_names_at_all_are_refused(api: TestClient, name: str) -> None:
    answer = api.post("/v1/jobs", json=job_body(env={name: "x"}))
    assert answer.status_code == 422, answer.text
    message = answer.json()["message"]
    assert message.startswith("env: ") and ("OVERSPILL_" in message or "must be a letter" in message), message
    secret = api.post("/v1/jobs", json=job_body(secrets=[_secret(PREFIX + "k", env=name)]))
    assert secret.status_code == 422 and secret.json()["message"].startswith("secrets.0.env: "), secret.text


def test_nul_huge_and_too_many_values_are_refused(api: TestClient) -> None:
    for env, what in (
        ({"A": "x\x00y"}, "NUL"),
        ({"A": "x" * (32 * 1024 + 1)}, "over 32768"),
        ({f"V{i}": "x" for i in range(129)}, "at most 128"),
        ({f"V{i}": "x" * 30000 for i in range(10)}, "over 262144"),
    ):
        answer = api.post("/v1/jobs", json=job_body(env=env))
        assert answer.status_code == 422, what
        assert answer.json()["message"].startswith("env: ") and what in answer.json()["message"], answer.text
    twice = api.post("/v1/jobs", json=job_body(env={"TOKEN": "1"}, secrets=[_secret(PREFIX + "k")]))
    assert twice.status_code == 422 and "secrets[0].env" in twice.json()["message"]
    too_many = [_secret(PREFIX + f"k{i}", env=f"S{i}") for i in range(33)]
    assert api.post("/v1/jobs", json=job_body(secrets=too_many)).status_code == 422
    for shm in ("0", "-1", "1025", "NaN"):
        assert api.post("/v1/jobs", json=job_body(shm_size_gb=shm)).status_code == 422, shm
    for retries in (-1, 21):
        assert api.post("/v1/jobs", json=job_body(max_infra_retries=retries)).status_code == 422


HOSTILE = ["--privileged", "-v", "/:/host", "$(touch {pwned})", "; touch {pwned}", "`touch {pwned}`", "a\nb"]


def test_option_and_shell_values_are_data_all_the_way_to_the_workload(
    api: TestClient, tmp_path: Path, agent_wheel: Path
) -> None:
    from tests.agent_harness import FileReader, agent_env, final_report, log_text, publish_spec, start_agent

    pwned = tmp_path / "pwned"
    values = [v.format(pwned=pwned) for v in HOSTILE]
    printer = "import os, sys; print(repr(sys.argv[1:])); print(repr([os.environ['H%d' % i] for i in range(7)]))"
    body = job_body(command=[sys.executable, "-c", printer, *values], env={f"H{i}": v for i, v in enumerate(values)})
    answer = api.post("/v1/jobs", json=body)
    assert answer.status_code == 202, answer.text
    assert answer.json()["spec"]["env"]["H0"] == "--privileged"  # stored and shown as given: it is data
    job = Job(id=new_id("job"), tenant="demo", team="t", project="p", name="n", state="pending",
              spec=JobCreate(**body).model_dump(mode="json"))  # fmt: skip
    reader = FileReader(tmp_path / "store")
    spec = build_spec(
        Settings(agent_runtime={"aws": "process"}),
        spec_of(job),
        job_id=job.id,
        placement_id="plc1",
        provider_name="aws",
        provider=object(),
        checkpoint_uri=reader.uri("ckpt/"),
        resume=False,
        attempt_prefix=reader.uri("attempts/plc1/"),
        mailbox_uri=reader.uri("mailbox/"),
    )
    spec = replace(spec, gpu_count=0)  # this host has no GPU driver; the values are the point here
    run = start_agent(publish_spec(reader, spec), spec, tmp_path / "work", agent_env(agent_wheel))
    assert run.wait() == 0, run.stderr()
    assert final_report(reader, spec).outcome.value == "succeeded", run.stderr()
    lines = log_text(reader, spec).splitlines()
    assert lines.count(repr(values)) == 2, lines  # every argument and every variable arrived whole and literal
    assert not pwned.exists(), "no value was ever run by a shell"
