"""The instance start-up script installs and starts the agent and nothing else: the wheel's URL and SHA-256, the
spec's URI and the endpoint variables, every value quoted; the job's image, command and environment are in the spec,
never in the script. (tests/test_attempt_boot.py executes the scripts the cloud adapters really sent.) Slurm, which
runs no agent, still tells its batch job where its checkpoint is (`container_env`)."""

from __future__ import annotations

import shlex
import subprocess
from decimal import Decimal

import pytest

from providers.base import LaunchRequest
from providers.model import Tags
from providers.startup import container_env, startup_script
from tests.builders import offering, spec

SHA = "ab" * 32


def _request(resume: str | None = None) -> LaunchRequest:
    return LaunchRequest(
        offering=offering(),
        launch_token="tok",
        tags=Tags("b", "job-1", "plc-1"),
        spec=spec(
            image="ghcr.io/acme/train:1.0",
            command=("python", "train.py", "--lr", "3e-4; rm -rf /"),
            checkpoint_uri="s3://ckpt/job-1/",
        ),
        remaining_work_hours=Decimal("3"),
        resume_from=resume,
        checkpoint_interval_hours=Decimal("0.25"),
    )


def test_env_tells_a_job_without_agent_where_and_whether_to_resume() -> None:
    fresh = container_env(_request())
    assert fresh["OVERSPILL_RESUME"] == "0" and fresh["OVERSPILL_CHECKPOINT_URI"] == "s3://ckpt/job-1/"
    assert fresh["OVERSPILL_CHECKPOINT_INTERVAL_SECONDS"] == "900"
    resumed = container_env(_request(resume="gs://moved/job-1/"))
    assert resumed["OVERSPILL_RESUME"] == "1" and resumed["OVERSPILL_CHECKPOINT_URI"] == "gs://moved/job-1/"


def test_script_starts_the_agent_with_its_spec_and_endpoints_only() -> None:
    url = "https://ckpt.s3.amazonaws.com/_agent/x/overspill_agent.whl?X-Amz-Signature=abc&X-Amz-Date=1"
    spec_uri = "s3://ckpt/tenants/acme/jobs/job-1/attempts/plc-1/spec.json"
    script = startup_script(
        wheel_url=url,
        wheel_sha256=SHA,
        spec_uri=spec_uri,
        env={"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:5000"},
        root="/mnt/ssd/agent",
    )
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    run = next(line for line in script.splitlines() if line.startswith("nohup setsid"))
    argv = shlex.split(run.split(">>")[0])
    assert argv[2:8] == ["python3", "-m", "agent", "run", "--spec", spec_uri]
    assert argv[8:] == ["--work-dir", "/mnt/ssd/agent/work"]
    assert shlex.quote(url) in script and SHA in script
    assert "export AWS_ENDPOINT_URL_S3=http://127.0.0.1:5000" in script
    for absent in ("docker", "train.py", "ghcr.io", "rm -rf"):
        assert absent not in script


def test_script_refuses_a_malformed_digest_or_variable_name() -> None:
    with pytest.raises(ValueError):
        startup_script(wheel_url="x", wheel_sha256="nothex", spec_uri="s3://b/k")
    with pytest.raises(ValueError):
        startup_script(wheel_url="x", wheel_sha256=SHA, spec_uri="s3://b/k", env={"BAD NAME": "1"})
