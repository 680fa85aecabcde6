"""A job's output through the API (`GET /v1/jobs/{id}/logs`) and the CLI (`overspill logs JOB [-f]`), read from the
log chunks the real agent stores: a real tick launches the job on AWS (moto EC2 + S3), its start-up script is run
for real (tests/instance_boot.py) and the numpy workload prints while the log is read over a real HTTP server
(uvicorn), while it runs, followed to its end, and after its instance is gone; always in order, the same bytes as the
chunks in the store.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import uvicorn
from sqlmodel import Session
from typer.testing import CliRunner

from broker.api.auth import Role, create_key
from broker.api.routes import logs as logs_route
from broker.app import create_app
from broker.cli.main import app as cli
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import Placement
from tests.instance_boot import aws_user_data, boot
from tests.metadata_server import MetadataServer
from tests.moto_server import moto_client
from tests.test_reports_outcomes import aws, moto_url  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


def serve(rt: Runtime) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(runtime=rt), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


def test_logs_are_readable_while_running_followed_to_the_end_and_after_the_instance_is_gone(
    moto_url: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logs_route, "FOLLOW_POLL_SECONDS", 0.2)
    with aws(moto_url, tmp_path, monkeypatch) as c:
        # 20 s of work: the agent ships a chunk every 5 s, so the first read lands well before the end even on a
        # loaded machine (at 8 s of work a slow first upload once let the whole run finish first)
        env = {"TRAIN_STEPS": "400", "TRAIN_STEP_SECONDS": "0.05", "TRAIN_CHECKPOINT_EVERY": "100"}
        job_id = c.submit(env=env)
        p = c.launched(job_id)
        assert p.instance_id is not None
        ec2 = moto_client("ec2", "us-east-1", moto_url)
        server = serve(c.rt)
        url = next(server)
        runner = CliRunner()
        cli_env = {"OVERSPILL_URL": url}
        # before the agent has written anything: an empty log, the attempt still running
        empty = c.api.get(f"/v1/jobs/{job_id}/logs")
        assert empty.status_code == 200 and empty.content == b""
        assert empty.headers["X-Overspill-Attempt"] == p.id and empty.headers["X-Overspill-Attempt-Ended"] == "false"
        with MetadataServer() as metadata:
            script, root = aws_user_data(ec2, p.instance_id), Path(c.rt.settings.agent_root)
            booted = boot(script, root, {"OVERSPILL_METADATA_URL": metadata.url}, gpus=1)
            # while it runs: some of the log, in order from the start
            deadline = time.monotonic() + 60
            while True:
                early = c.api.get(f"/v1/jobs/{job_id}/logs")
                if b"step 5 loss" in early.content:
                    break
                assert time.monotonic() < deadline, "no log while the job runs"
                time.sleep(0.2)
            assert early.headers["X-Overspill-Attempt-Ended"] == "false"
            assert b"step 400 loss" not in early.content
            # follow from here to the end, through the CLI, while the agent finishes and ticks take its verdict
            start = int(early.headers["X-Overspill-Next-Offset"])
            followed: dict[str, object] = {}

            def follow() -> None:
                result = runner.invoke(cli, ["logs", job_id, "-f", "--offset", str(start)], env=cli_env)
                followed["exit"], followed["out"] = result.exit_code, result.stdout_bytes

            follower = threading.Thread(target=follow)
            follower.start()
            booted.wait()
        for _ in range(3):
            tick(c.rt, datetime.now(UTC))
        with Session(c.rt.engine) as s:
            row = s.get(Placement, p.id)
        assert row is not None and row.state == "succeeded"
        follower.join(timeout=30)
        assert not follower.is_alive(), "follow ends once the attempt has ended"
        assert c.instance_gone(row)
        # after the instance is gone: the whole log, the same bytes as the chunks in the store, in order
        s3 = moto_client("s3", "us-east-1", moto_url)
        prefix = f"{p.attempt_uri.removeprefix('s3://ckpt-use1/')}logs/"  # type: ignore[union-attr]
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt-use1", Prefix=prefix)["Contents"])
        stored = b"".join(s3.get_object(Bucket="ckpt-use1", Key=k)["Body"].read() for k in keys)
        whole = c.api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": p.id})
        assert whole.status_code == 200 and whole.content == stored
        assert whole.headers["X-Overspill-Attempt-Ended"] == "true"
        assert whole.headers["X-Overspill-Next-Offset"] == str(len(stored))
        lines = [ln for ln in stored.decode().splitlines() if ln.startswith("step ") and " loss" in ln]
        steps = [int(ln.split()[1]) for ln in lines]
        assert steps == sorted(steps) and steps[-1] == 400
        assert followed["exit"] == 0 and early.content + followed["out"] == stored  # type: ignore[operator]
        rest = c.api.get(f"/v1/jobs/{job_id}/logs", params={"offset": 100})
        assert rest.content == stored[100:]
        tail = c.api.get(f"/v1/jobs/{job_id}/logs", params={"tail": 4096})  # what the console's job page shows
        assert tail.content == stored[-4096:] and b"step 400 loss" in tail.content
        printed = runner.invoke(cli, ["logs", job_id], env=cli_env)
        assert printed.exit_code == 0 and printed.stdout_bytes == stored
        # another tenant sees no such job; an attempt of another job is no attempt of this one
        other = create_key(c.rt.engine, tenant="rival", role=Role.ADMIN, name="r", now=datetime.now(UTC))
        assert c.api.get(f"/v1/jobs/{job_id}/logs", headers={"Authorization": f"Bearer {other}"}).status_code == 404
        assert c.api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": "plc_other"}).status_code == 404
        next(server, None)
