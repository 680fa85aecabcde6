"""The instance start-up script carries the job's container, command, checkpoint location and resume flag."""

from __future__ import annotations

import shlex
from decimal import Decimal

from providers.base import LaunchRequest
from providers.model import Tags
from providers.startup import container_env, startup_script
from tests.builders import offering, spec


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


def test_env_tells_the_container_where_and_whether_to_resume() -> None:
    fresh = container_env(_request())
    assert fresh["OVERSPILL_RESUME"] == "0" and fresh["OVERSPILL_CHECKPOINT_URI"] == "s3://ckpt/job-1/"
    assert fresh["OVERSPILL_CHECKPOINT_INTERVAL_SECONDS"] == "900"
    resumed = container_env(_request(resume="gs://moved/job-1/"))
    assert resumed["OVERSPILL_RESUME"] == "1" and resumed["OVERSPILL_CHECKPOINT_URI"] == "gs://moved/job-1/"


def test_script_runs_the_container_with_the_command_quoted() -> None:
    script = startup_script(_request())
    run = next(line for line in script.splitlines() if line.startswith("docker run"))
    argv = shlex.split(run)
    assert argv[-4:] == ["python", "train.py", "--lr", "3e-4; rm -rf /"]
    assert "ghcr.io/acme/train:1.0" in argv and "OVERSPILL_JOB_ID=job-1" in argv


def test_script_reports_exit_status_and_always_powers_off_with_a_callback() -> None:
    import dataclasses
    import subprocess

    req = dataclasses.replace(_request(), callback_url="https://broker.example/", callback_token="tok-1")
    script = startup_script(req)
    assert "https://broker.example/v1/placements/plc-1/exit" in script
    assert "X-Overspill-Callback-Token: tok-1" in script
    assert script.rstrip().endswith("shutdown -h now")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_without_a_callback_only_success_powers_off() -> None:
    import subprocess

    script = startup_script(_request())
    assert 'if [ "$rc" -eq 0 ]; then shutdown -h now; fi' in script and "curl" not in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_azure_instances_relay_scheduled_events() -> None:
    import dataclasses
    import subprocess

    from tests.builders import offering

    req = dataclasses.replace(
        _request(), offering=offering(provider="azure"), callback_url="https://b.example", callback_token="t"
    )
    script = startup_script(req)
    assert "metadata/scheduledevents" in script and "/v1/placements/plc-1/scheduled-events" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "scheduledevents" not in startup_script(dataclasses.replace(req, offering=offering(provider="aws")))
