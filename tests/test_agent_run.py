"""The real agent (run from its built wheel, as instances run it) with the `process` runtime and a real numpy training
workload, against moto S3, the GCS emulator, Azurite (HTTPS, managed-identity token) and a file store, with
tests/metadata_server.py issuing each provider's interruption notice mid-run.

Proves: the workload checkpoints on the notice, the agent uploads it and reports `preempted`; a second attempt
resumes from it and ends with weights bit-identical to an uninterrupted run; success, user failure and infra failure
are classified through the mailbox with no callback URL, and a lost callback changes nothing; logs are in the store,
in order, while the job runs and across a store outage; secrets never reach the spec, the logs, the reports or the
store.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from agent import protocol as p
from tests.agent_fixtures import azure_container
from tests.agent_harness import (
    EVERY,
    REPORT_KEY,
    STEPS,
    TRAIN,
    AzureReader,
    FileReader,
    FlakyProxy,
    GCSReader,
    Reader,
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
from tests.local_server import LocalServer
from tests.metadata_server import MetadataServer

pytest_plugins = ["tests.storage_emulators", "tests.agent_fixtures"]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, agent_wheel: Path) -> dict[str, Any]:
    """One uninterrupted run on a file store: the reference weights and everything it left."""
    tmp = tmp_path_factory.mktemp("baseline")
    reader = FileReader(tmp / "store")
    spec = make_spec(reader)
    run = start_agent(publish_spec(reader, spec), spec, tmp / "work", agent_env(agent_wheel))
    code = run.wait()
    weights = checkpoint_file(reader, spec, "final.npy")
    return {"reader": reader, "spec": spec, "code": code, "weights": weights, "run": run}


def _kinds(found: list[p.Report]) -> list[str]:
    return [r.kind.value for r in found]


def test_an_uninterrupted_run_succeeds_with_ordered_logs_and_signed_reports(baseline: dict[str, Any]) -> None:
    reader, spec, run = baseline["reader"], baseline["spec"], baseline["run"]
    assert baseline["code"] == 0, run.stderr()
    final = final_report(reader, spec)
    assert final.outcome is p.Outcome.SUCCEEDED and final.exit_code == 0
    assert final.checkpointed == 1.0 and final.progress == p.Progress(STEPS, STEPS, STEPS)
    found = reports(reader, spec)
    kinds = _kinds(found)
    assert kinds[0] == "started" and kinds[-1] == "final" and "progress" in kinds and "heartbeat" in kinds
    assert [r.seq for r in found] == sorted({r.seq for r in found})
    text = log_text(reader, spec)
    steps = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ") and "loss" in line]
    assert steps == list(range(1, STEPS + 1))  # every stdout line, in order
    assert text.index("step 10 loss") < text.index("step 10: stderr line") < text.index("step 11 loss")
    assert final.log_tail and final.log_tail in text and len(final.log_tail.encode()) <= 4096
    assert baseline["weights"] is not None and len(baseline["weights"]) > 128
    # the spec left the store once read, and its local copy is private
    assert reader.list("attempts/") == []
    local = run.work_dir / "agent" / p.SPEC_NAME
    assert stat.S_IMODE(local.stat().st_mode) == 0o600 and stat.S_IMODE(run.work_dir.stat().st_mode) == 0o700
    assert p.AttemptSpec.from_json(local.read_bytes()) == spec


# ------------------------------------------------------------------------------------ notices, resume, identity


@pytest.fixture
def aws_reader(s3_client: Any) -> S3Reader:
    if "agent-run" not in [b["Name"] for b in s3_client.list_buckets()["Buckets"]]:
        s3_client.create_bucket(Bucket="agent-run")
    return S3Reader(s3_client, "agent-run")


@pytest.fixture
def gcs_reader(gcs_client: Any) -> GCSReader:
    if gcs_client.lookup_bucket("agent-run") is None:
        gcs_client.create_bucket("agent-run")
    return GCSReader(gcs_client, "agent-run")


@pytest.fixture
def azure_reader(azurite_https: tuple[str, str]) -> AzureReader:
    endpoint, cafile = azurite_https
    return AzureReader(azure_container(endpoint, cafile, "agent-run"), endpoint)


def _store_env(provider: str, request: pytest.FixtureRequest) -> dict[str, str]:
    if provider == "aws":
        return {"AWS_ENDPOINT_URL_S3": request.getfixturevalue("s3_endpoint")}
    if provider == "gcp":
        return {"STORAGE_EMULATOR_HOST": request.getfixturevalue("gcs_endpoint")}
    endpoint, cafile = request.getfixturevalue("azurite_https")
    return {"OVERSPILL_AZURE_BLOB_ENDPOINT": endpoint, "SSL_CERT_FILE": cafile}


def _issue(provider: str, metadata: MetadataServer) -> str | None:
    if provider == "aws":
        metadata.issue_aws_interruption()
    elif provider == "gcp":
        metadata.issue_gcp_preemption()
    else:
        return metadata.issue_azure_preempt(not_before_seconds=40)
    return None


def _step_in_log(reader: Reader, spec: p.AttemptSpec, step: int) -> bool:
    text = b"".join(data for _, data in log_chunks(reader, spec)).decode(errors="replace")
    return f"step {step} loss" in text


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_notice_checkpoint_then_resume_ends_bit_identical(
    provider: str,
    request: pytest.FixtureRequest,
    metadata: MetadataServer,
    agent_wheel: Path,
    baseline: dict[str, Any],
    tmp_path: Path,
) -> None:
    reader: Reader = request.getfixturevalue(
        {"aws": "aws_reader", "gcp": "gcs_reader", "azure": "azure_reader"}[provider]
    )
    env = agent_env(agent_wheel, {"OVERSPILL_METADATA_URL": metadata.url, **_store_env(provider, request)})
    # slower steps (the weights do not depend on the pace) leave room for the notice mid-run
    first = make_spec(reader, notice=p.NoticeSpec(p.NoticeSource(provider)), env={"TRAIN_STEP_SECONDS": "0.02"})
    run = start_agent(publish_spec(reader, first), first, tmp_path / "a1", env, "--notice-poll-seconds", "0.3")
    # the log is in the store, in order, while the job runs
    wait_for(lambda: _step_in_log(reader, first, 20), 30, "step 20 in the stored log")
    assert run.proc.poll() is None
    if provider == "aws":  # a rebalance recommendation first: the workload checkpoints early and trains on
        metadata.issue_aws_rebalance()
        wait_for(
            lambda: any(r.notice and r.notice.kind == "rebalance" for r in reports(reader, first)), 10, "rebalance"
        )
        assert run.proc.poll() is None
    event_id = _issue(provider, metadata)
    assert run.wait(60) == 0, run.stderr()

    final = final_report(reader, first)
    assert final.outcome is p.Outcome.PREEMPTED, final.detail
    assert final.notice is not None and final.notice.source.value == provider and final.notice.deadline
    notices = [r for r in reports(reader, first) if r.kind is p.ReportKind.NOTICE and r.notice.kind == "preempt"]
    assert len(notices) == 1 and "SIGUSR1" in notices[0].detail
    text = log_text(reader, first)
    assert "notice preempt: checkpointed at step" in text
    saved = manifest(reader, first)
    assert saved is not None and 20 <= saved.checkpoint < STEPS and final.checkpointed == saved.checkpoint / STEPS
    assert checkpoint_file(reader, first, "final.npy") is None
    if provider == "azure":
        assert metadata.acknowledged == [event_id]

    second = make_spec(
        reader, job_id=first.job_id, checkpoint=replace(first.checkpoint, resume=True), env={"TRAIN_STEP_SECONDS": "0"}
    )
    run2 = start_agent(publish_spec(reader, second), second, tmp_path / "a2", env)
    assert run2.wait(60) == 0, run2.stderr()
    assert final_report(reader, second).outcome is p.Outcome.SUCCEEDED
    assert f"resumed at step {int(saved.checkpoint)}" in log_text(reader, second)
    resumed_weights = checkpoint_file(reader, second, "final.npy")
    assert resumed_weights is not None
    assert hashlib.sha256(resumed_weights).hexdigest() == hashlib.sha256(baseline["weights"]).hexdigest()


def test_sigterm_to_the_agent_is_a_preemption_with_a_checkpoint(agent_wheel: Path, tmp_path: Path) -> None:
    reader = FileReader(tmp_path / "store")
    spec = make_spec(reader)
    run = start_agent(publish_spec(reader, spec), spec, tmp_path / "w", agent_env(agent_wheel))
    wait_for(lambda: _step_in_log(reader, spec, 20), 30, "step 20")
    run.terminate()  # what the OS does when it shuts down
    assert run.wait(60) == 0, run.stderr()
    final = final_report(reader, spec)
    assert final.outcome is p.Outcome.PREEMPTED and final.notice is not None
    assert "notice preempt: checkpointed at step" in log_text(reader, spec)
    saved = manifest(reader, spec)
    assert saved is not None and 20 <= saved.checkpoint < STEPS


def test_a_workload_that_saves_and_exits_on_the_notice_has_its_checkpoint_in_the_log(
    agent_wheel: Path, tmp_path: Path
) -> None:
    """The workload checkpoints on the notice and exits at once, often before the agent's next look at its
    progress: the agent still logs the checkpoint it saved (a race seen in CI under load)."""
    reader = FileReader(tmp_path / "store")
    spec = make_spec(reader, env={"TRAIN_EXIT_ON_NOTICE": "1"})
    run = start_agent(publish_spec(reader, spec), spec, tmp_path / "w", agent_env(agent_wheel))
    wait_for(lambda: _step_in_log(reader, spec, 20), 30, "step 20")
    run.terminate()
    assert run.wait(60) == 0, run.stderr()
    assert final_report(reader, spec).outcome is p.Outcome.PREEMPTED
    saved = manifest(reader, spec)
    assert saved is not None and 20 <= saved.checkpoint < STEPS
    assert f"the workload checkpointed at {saved.checkpoint}" in log_text(reader, spec)


# -------------------------------------------------------------------------------------------- classification


def _run(
    reader: Reader, spec: p.AttemptSpec, work: Path, wheel: Path, extra_env: dict[str, str] | None = None
) -> p.Report:
    run = start_agent(publish_spec(reader, spec), spec, work, agent_env(wheel, extra_env))
    assert run.wait(60) == 0, run.stderr()
    return final_report(reader, spec)


def test_user_failure_through_the_mailbox_without_a_callback(agent_wheel: Path, tmp_path: Path) -> None:
    reader = FileReader(tmp_path / "store")
    spec = make_spec(reader, env={"TRAIN_FAIL_AT_STEP": str(EVERY + 10)})
    assert spec.callback_url is None
    final = _run(reader, spec, tmp_path / "w", agent_wheel)
    assert (final.outcome, final.exit_code) == (p.Outcome.USER_FAILED, 3)
    assert f"step {EVERY + 10}: loss is NaN, giving up" in final.log_tail
    assert manifest(reader, spec).checkpoint == EVERY  # the periodic checkpoint before the failure is kept


@pytest.mark.parametrize(
    ("command", "code"),
    [(["/nonexistent/train"], 127), ([str(TRAIN)], 126)],  # not found; not executable
)
def test_a_command_that_cannot_run_is_a_user_failure(
    command: list[str], code: int, agent_wheel: Path, tmp_path: Path
) -> None:
    reader = FileReader(tmp_path / "store")
    final = _run(reader, make_spec(reader, command=tuple(command)), tmp_path / "w", agent_wheel)
    assert (final.outcome, final.exit_code) == (p.Outcome.USER_FAILED, code)


def _fake_nvidia_smi(directory: Path, script: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    return f"{directory}:/usr/bin:/bin"


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        (None, "no NVIDIA driver"),  # no nvidia-smi at all
        ('echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2; exit 9',
         "the GPU driver does not work"),
        ('echo "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)"', "needs 2 GPU(s) but this host has 1"),
    ],
)  # fmt: skip
def test_missing_gpu_driver_is_an_infra_failure(
    script: str | None, expect: str, agent_wheel: Path, tmp_path: Path
) -> None:
    reader = FileReader(tmp_path / "store")
    path = _fake_nvidia_smi(tmp_path / "bin", script) if script else "/usr/bin:/bin"
    spec = make_spec(reader, gpu_count=2)
    final = _run(reader, spec, tmp_path / "w", agent_wheel, {"PATH": path})
    assert final.outcome is p.Outcome.INFRA_FAILED and expect in final.detail
    assert "started" not in _kinds(reports(reader, spec))


def test_the_workload_sees_exactly_its_gpus(agent_wheel: Path, tmp_path: Path) -> None:
    reader = FileReader(tmp_path / "store")
    listing = "".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}{i}{i})"\n' for i in range(4))
    path = _fake_nvidia_smi(tmp_path / "bin", listing)
    spec = make_spec(reader, gpu_count=2, env={"TRAIN_STEPS": "3", "TRAIN_PRINT_ENV": "CUDA_VISIBLE_DEVICES"})
    final = _run(reader, spec, tmp_path / "w", agent_wheel, {"PATH": path})
    assert final.outcome is p.Outcome.SUCCEEDED
    assert "CUDA_VISIBLE_DEVICES=0,1\n" in log_text(reader, spec)


class _Callbacks(LocalServer):
    """A broker stand-in for the callback: records each POST and answers `status`."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.posts: list[tuple[str, str, bytes]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.posts.append((self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(owner.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._serve(Handler)


@pytest.mark.parametrize("broker", ["recording", "failing", "unreachable"])
def test_a_lost_callback_never_turns_a_failure_into_a_success(broker: str, agent_wheel: Path, tmp_path: Path) -> None:
    reader = FileReader(tmp_path / "store")
    with _Callbacks(202 if broker == "recording" else 500) as callbacks:
        url = callbacks.url if broker != "unreachable" else "http://127.0.0.1:9"
        spec = make_spec(reader, env={"TRAIN_FAIL_AT_STEP": "5"}, callback_url=f"{url}/v1/placements/x/reports")
        final = _run(reader, spec, tmp_path / "w", agent_wheel)
        assert (final.outcome, final.exit_code) == (p.Outcome.USER_FAILED, 3)
        mailbox = reports(reader, spec)
        assert _kinds(mailbox)[-1] == "final"
        if broker != "unreachable":
            assert [path for path, _, _ in callbacks.posts] == ["/v1/placements/x/reports"] * len(mailbox)
            assert {ctype for _, ctype, _ in callbacks.posts} == {"application/json"}
            assert [p.Report.from_json(body) for _, _, body in callbacks.posts] == mailbox  # the same signed reports


# ----------------------------------------------------------------------------------------------------- logs


def test_logs_stay_in_order_across_a_store_outage(
    s3_endpoint: str, aws_reader: S3Reader, metadata: MetadataServer, agent_wheel: Path, tmp_path: Path
) -> None:
    with FlakyProxy(s3_endpoint) as proxy:
        env = agent_env(agent_wheel, {"OVERSPILL_METADATA_URL": metadata.url, "AWS_ENDPOINT_URL_S3": proxy.url})
        spec = make_spec(aws_reader, env={"TRAIN_STEPS": "200"})
        run = start_agent(publish_spec(aws_reader, spec), spec, tmp_path / "w", env)
        wait_for(lambda: _step_in_log(aws_reader, spec, 20), 30, "step 20")
        proxy.down = True
        time.sleep(1.5)
        stored_during = len(log_chunks(aws_reader, spec))
        proxy.down = False
        assert run.wait(60) == 0, run.stderr()
    assert proxy.refused > 0
    text = log_text(aws_reader, spec)  # contiguous offsets: nothing lost, nothing reordered
    steps = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ") and "loss" in line]
    assert steps == list(range(1, 201))
    assert len(log_chunks(aws_reader, spec)) > stored_during
    assert final_report(aws_reader, spec).outcome is p.Outcome.SUCCEEDED


# -------------------------------------------------------------------------------------------------- secrets


def test_secrets_never_reach_the_spec_the_logs_the_reports_or_the_store(
    s3_endpoint: str, aws_reader: S3Reader, metadata: MetadataServer, agent_wheel: Path, tmp_path: Path
) -> None:
    from tests.moto_server import moto_client

    secret = "s3cr3t-Value-" + os.urandom(6).hex()
    sm: Any = moto_client("secretsmanager", "us-east-1", s3_endpoint)
    sm.create_secret(Name=f"agent/{secret[-6:]}", SecretString=json.dumps({"password": secret}))
    refs = (p.SecretRef("DB_PASSWORD", p.SecretSource.AWS_SECRETS_MANAGER, f"agent/{secret[-6:]}", "password"),)
    spec = make_spec(aws_reader, secrets=refs, env={"TRAIN_STEPS": "20", "TRAIN_PRINT_ENV": "DB_PASSWORD"})
    assert secret not in spec.to_json().decode()
    env = agent_env(agent_wheel, {"OVERSPILL_METADATA_URL": metadata.url, "AWS_ENDPOINT_URL": s3_endpoint})
    run = start_agent(publish_spec(aws_reader, spec), spec, tmp_path / "w", env)
    assert run.wait(60) == 0, run.stderr()
    final = final_report(aws_reader, spec)
    assert final.outcome is p.Outcome.SUCCEEDED
    text = log_text(aws_reader, spec)
    assert "DB_PASSWORD=[redacted]\n" in text  # the workload printed it; the agent masked it
    for key in aws_reader.list(""):
        data = aws_reader.get(key) or b""
        assert secret.encode() not in data, f"the secret leaked into {key}"
    for path in run.work_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the secret is on disk in {path}"
    assert secret not in run.stderr()
    assert REPORT_KEY not in text and REPORT_KEY not in run.stderr()


def test_report_key_never_reaches_the_workload(agent_wheel: Path, tmp_path: Path) -> None:
    reader = FileReader(tmp_path / "store")
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nprint('\\n'.join(f'{k}={v}' for k, v in sorted(os.environ.items())))\n")
    spec = make_spec(reader, command=(sys.executable, str(probe)))
    final = _run(reader, spec, tmp_path / "w", agent_wheel, {"AWS_SECRET_ACCESS_KEY": "agent-own-credential"})
    assert final.outcome is p.Outcome.SUCCEEDED
    text = log_text(reader, spec)
    assert REPORT_KEY not in text and "agent-own-credential" not in text and "PYTHONPATH" not in text
    seen = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("["))
    assert seen[p.ENV_CHECKPOINT_DIR] == str(tmp_path / "w" / "checkpoint")
    assert seen[p.ENV_PROGRESS_FILE].endswith("/run/progress.json") and seen[p.ENV_JOB_ID] == spec.job_id
    assert p.ENV_RESUME not in seen
