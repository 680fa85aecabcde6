"""Run the real agent as the instances do (`PYTHONPATH=<the built wheel> python3 -m agent run --spec URI`) and read
what it left in the store with independent clients (boto3, google-cloud-storage, azure-storage-blob, plain files).

Used by tests/test_agent_run.py, tests/test_agent_podman.py and benchmarks/agent_bench.py. `FlakyProxy` sits in front
of a store to take it down and bring it back mid-run.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from agent import protocol as p
from agent.checkpoints import parse_manifest
from tests.local_server import QuietHTTPServer

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "tests" / "workloads" / "train.py"
REPORT_KEY = "5e" * 32
STEPS, EVERY = 120, 30  # the training job's length and checkpoint period in the tests (~1.5 s of training)


class Reader(Protocol):
    """Test-side access to one bucket/container/directory, through the official SDK, never the agent's code."""

    def uri(self, key: str) -> str: ...
    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes | None: ...
    def list(self, prefix: str) -> list[str]: ...


@dataclass
class FileReader:
    root: Path

    def uri(self, key: str) -> str:
        return f"file://{self.root}/{key}"

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def get(self, key: str) -> bytes | None:
        path = self.root / key
        return path.read_bytes() if path.is_file() else None

    def list(self, prefix: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()
                      and str(p.relative_to(self.root)).startswith(prefix))  # fmt: skip


@dataclass
class S3Reader:
    client: Any
    bucket: str

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except self.client.exceptions.NoSuchKey:
            return None

    def list(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@dataclass
class GCSReader:
    client: Any
    bucket: str

    def uri(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.client.bucket(self.bucket).blob(key).upload_from_string(data)

    def get(self, key: str) -> bytes | None:
        blob = self.client.bucket(self.bucket).blob(key)
        return bytes(blob.download_as_bytes()) if blob.exists() else None

    def list(self, prefix: str) -> list[str]:
        return sorted(b.name for b in self.client.list_blobs(self.bucket, prefix=prefix))


@dataclass
class AzureReader:
    container: Any  # azure.storage.blob.ContainerClient
    endpoint: str  # the account endpoint, e.g. https://127.0.0.1:P/devstoreaccount1

    def uri(self, key: str) -> str:
        return f"{self.endpoint}/{self.container.container_name}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.container.upload_blob(key, data, overwrite=True)

    def get(self, key: str) -> bytes | None:
        blob = self.container.get_blob_client(key)
        return bytes(blob.download_blob().readall()) if blob.exists() else None

    def list(self, prefix: str) -> list[str]:
        return sorted(b.name for b in self.container.list_blobs(name_starts_with=prefix))


def make_spec(reader: Reader, **overrides: Any) -> p.AttemptSpec:
    """A spec for one attempt of the numpy training job, every location inside `reader`'s bucket."""
    placement = overrides.pop("placement_id", f"pl{uuid.uuid4().hex[:12]}")
    job = overrides.pop("job_id", f"job{uuid.uuid4().hex[:8]}")
    env = {"TRAIN_STEPS": str(STEPS), "TRAIN_CHECKPOINT_EVERY": str(EVERY), "TRAIN_STEP_SECONDS": "0.01"}
    env.update(overrides.pop("env", {}))
    spec = p.AttemptSpec(
        job_id=job,
        placement_id=placement,
        tenant="acme",
        command=(sys.executable, str(TRAIN)),
        runtime=p.Runtime.PROCESS,
        checkpoint=p.CheckpointSpec(uri=reader.uri(f"checkpoints/{job}/")),
        logs_uri=reader.uri(f"logs/{job}/{placement}/"),
        mailbox_uri=reader.uri("mailbox/acme/"),
        report_key=REPORT_KEY,
        env=env,
        heartbeat_seconds=1,
    )
    return replace(spec, **overrides)


def key_of(reader: Reader, uri: str) -> str:
    return uri[len(reader.uri("")) :]


def publish_spec(reader: Reader, spec: p.AttemptSpec) -> str:
    """Write the spec where the broker would and return its URI."""
    key = key_of(reader, spec.logs_uri).replace("logs/", "attempts/", 1) + p.SPEC_NAME
    reader.put(key, spec.to_json())
    return reader.uri(key)


@dataclass
class AgentRun:
    spec: p.AttemptSpec
    proc: subprocess.Popen[bytes]
    work_dir: Path
    stderr_path: Path
    started: float = field(default_factory=time.monotonic)

    def wait(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the agent did not finish in {timeout}s:\n{self.stderr()}") from None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-6000:]

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)


def agent_env(wheel: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What a start-up script gives the agent: PATH, the wheel, and the endpoint overrides of the test."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    env["PYTHONPATH"] = str(wheel)
    env.update(extra or {})
    return env


def start_agent(
    spec_uri: str,
    spec: p.AttemptSpec,
    work_dir: Path,
    env: dict[str, str],
    *args: str,
    python: str = sys.executable,
) -> AgentRun:
    work_dir.parent.mkdir(parents=True, exist_ok=True)
    stderr_path = work_dir.parent / f"{work_dir.name}-agent.log"
    with stderr_path.open("wb") as err:
        proc = subprocess.Popen(
            [python, "-m", "agent", "run", "--spec", spec_uri, "--work-dir", str(work_dir),
             "--log-flush-seconds", "0.3", "--retry-base-seconds", "0.2", "--drain-seconds", "30", *args],
            stdout=err, stderr=subprocess.STDOUT, env=env, cwd="/",
        )  # fmt: skip
    return AgentRun(spec, proc, work_dir, stderr_path)


def reports(reader: Reader, spec: p.AttemptSpec) -> list[p.Report]:
    """This placement's reports from the mailbox, in name order, each verified against the report key."""
    prefix = key_of(reader, spec.mailbox_uri)
    found = []
    for key in reader.list(prefix + spec.placement_id + "-"):
        data = reader.get(key)
        assert data is not None
        report = p.Report.from_json(data)
        assert report.verify(spec.report_key), f"bad signature on {key}"
        assert p.parse_mailbox_entry_name(key[len(prefix) :]) == (spec.placement_id, report.seq, report.kind.value)
        found.append(report)
    return found


def final_report(reader: Reader, spec: p.AttemptSpec) -> p.Report:
    finals = [r for r in reports(reader, spec) if r.kind is p.ReportKind.FINAL]
    assert len(finals) == 1, f"expected one final report, got {len(finals)}"
    return finals[0]


def log_chunks(reader: Reader, spec: p.AttemptSpec) -> list[tuple[int, bytes]]:
    prefix = key_of(reader, spec.logs_uri)
    chunks = []
    for key in reader.list(prefix):
        offset = p.parse_log_chunk_name(key[len(prefix) :])
        assert offset is not None, key
        data = reader.get(key)
        assert data is not None
        chunks.append((offset, data))
    return chunks


def log_text(reader: Reader, spec: p.AttemptSpec, *, contiguous: bool = True) -> str:
    """The attempt's log as a reader rebuilds it (chunks in name order); checks offsets leave no gap."""
    chunks = log_chunks(reader, spec)
    if contiguous:
        at = 0
        for offset, data in chunks:
            assert offset == at, f"log chunk at {offset}, expected {at}"
            at += len(data)
    return b"".join(data for _, data in chunks).decode("utf-8", errors="replace")


def manifest(reader: Reader, spec: p.AttemptSpec) -> Any:
    data = reader.get(key_of(reader, spec.checkpoint.uri) + p.MANIFEST_NAME)
    return parse_manifest(data) if data is not None else None


def checkpoint_file(reader: Reader, spec: p.AttemptSpec, name: str) -> bytes | None:
    m = manifest(reader, spec)
    if m is None:
        return None
    for entry in m.files:
        if entry.path == name:
            return reader.get(key_of(reader, spec.checkpoint.uri) + f"data/{entry.sha256}")
    return None


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class FlakyProxy:
    """An HTTP proxy in front of one upstream (a store): `down = True` makes it answer 503 to everything."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.down = False
        self.refused = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                if owner.down:
                    owner.refused += 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(owner.upstream.hostname, owner.upstream.port, timeout=30)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FlakyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
