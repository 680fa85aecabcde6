"""Real object-store emulators for the checkpoint tests, as session-scoped pytest fixtures on free 127.0.0.1 ports.

- `s3_endpoint`: moto's `ThreadedMotoServer` in this process (via `tests.moto_server`), needs `moto[server]`.
- `gcs_endpoint`: gcp-storage-emulator as a separate process with `--in-memory` (in-process, the stored data would
  count in this process's memory, and its disk store rewrites the whole partial file on every chunk).
- `azurite_endpoint`: Azurite's blob service as a separate node process with `--skipApiVersionCheck` (the SDK
  sends an API version newer than Azurite accepts) and `--location` in a temp dir. The binary comes from
  `OVERSPILL_AZURITE_BIN`, else `azurite-blob` on PATH, else `<repo>/.ci/node_modules/.bin/azurite-blob`.
Each fixture skips with the reason when its package or binary is missing (tests using them are marked
`integration`, so CI turns the skip into a failure) and stops its server at the end of the session. The client
fixtures (`s3_client`, `gcs_client`, `azure_service`) are the official SDK clients pointed at the emulators.
For fault injection, `RecordingStore` wraps any store, records which parts were really sent and can flip a byte
in one of them, and `crash_after` makes a progress callback that raises `Crash` (the broker dying mid-copy).

PYTEST_DONT_REWRITE: test modules both import this as a plugin and import helpers from it; it has no asserts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from providers.storage import ObjectStore, PartInfo, UploadSession
from tests.moto_server import CREDS, free_port, running_moto_server

REPO = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_STARTUP_TIMEOUT_S = 30.0


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"not listening on {port} after {_STARTUP_TIMEOUT_S}s: {log.read_text(errors='replace')}")


@contextlib.contextmanager
def _process(cmd: list[str], port: int, workdir: Path, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run `cmd` with its output in `workdir/<name>.log` until it listens on `port`; stop it afterwards."""
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True)
    try:
        try:
            _wait_for_port(port, proc, log)
        except RuntimeError as exc:
            pytest.fail(f"{name} did not start: {exc}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        pytest.skip("moto[server] is not installed (pip install 'moto[server]')")
    with running_moto_server() as url:
        yield url


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Any:
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    config = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1})
    return boto3.client("s3", region_name="us-east-1", endpoint_url=s3_endpoint, config=config, **CREDS)


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    if importlib.util.find_spec("gcp_storage_emulator") is None:
        pytest.skip("gcp-storage-emulator is not installed (pip install gcp-storage-emulator)")
    port = free_port()
    cmd = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port)]
    with (
        tempfile.TemporaryDirectory(prefix="overspill-gcs-") as tmp,
        _process([*cmd, "--in-memory", "-q"], port, Path(tmp), "gcp-storage-emulator"),
    ):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def gcs_client(gcs_endpoint: str) -> Any:
    storage = pytest.importorskip("google.cloud.storage", reason="google-cloud-storage is not installed")
    from google.auth.credentials import AnonymousCredentials

    return storage.Client(
        project="overspill-test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gcs_endpoint},
    )


def find_azurite() -> str | None:
    """The `azurite-blob` launcher: $OVERSPILL_AZURITE_BIN, PATH, or the copy `.ci/run` installs."""
    given = os.environ.get("OVERSPILL_AZURITE_BIN")
    if given:
        return given if os.access(given, os.X_OK) else None
    local = REPO / ".ci" / "node_modules" / ".bin" / "azurite-blob"
    return shutil.which("azurite-blob") or (str(local) if os.access(local, os.X_OK) else None)


@pytest.fixture(scope="session")
def azurite_endpoint() -> Iterator[str]:
    binary = find_azurite()
    if binary is None:
        pytest.skip(
            "azurite-blob not found: set OVERSPILL_AZURITE_BIN, put it on PATH, or `npm install --prefix .ci azurite`"
        )
    if shutil.which("node") is None:
        pytest.skip("azurite-blob needs node on PATH")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="overspill-azurite-") as tmp:
        cmd = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", tmp]
        with _process([*cmd, "--skipApiVersionCheck", "--disableTelemetry", "--silent"], port, Path(tmp), "azurite"):
            yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"


@pytest.fixture(scope="session")
def azure_service(azurite_endpoint: str) -> Any:
    blob = pytest.importorskip("azure.storage.blob", reason="azure-storage-blob is not installed")
    conn = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={azurite_endpoint};"
    )
    # 8 MiB SDK read buffers (defaults 32/4 MiB) keep downloads within the copy's memory bound.
    return blob.BlobServiceClient.from_connection_string(conn, max_single_get_size=8 * MiB, max_chunk_get_size=8 * MiB)


class Crash(Exception):
    """Stands for the broker dying in the middle of a copy."""


def crash_after(limit: int) -> Callable[[int, int], None]:
    def progress(done: int, total: int) -> None:
        if done >= limit:
            raise Crash(f"crashed after {done} of {total} bytes")

    return progress


class RecordingStore:
    """Wraps a store; records the numbers of the parts actually sent and can flip a byte in one of them."""

    def __init__(self, inner: ObjectStore, corrupt_part: int | None = None) -> None:
        self.inner = inner
        self.sent: list[int] = []
        self.corrupt_part = corrupt_part

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def begin_upload(self, key: str, *, size: int, part_size: int) -> UploadSession:
        return _RecordingSession(self, self.inner.begin_upload(key, size=size, part_size=part_size))

    def resume_upload(self, key: str, token: str, *, size: int, part_size: int) -> UploadSession:
        return _RecordingSession(self, self.inner.resume_upload(key, token, size=size, part_size=part_size))


class _RecordingSession:
    def __init__(self, owner: RecordingStore, inner: UploadSession) -> None:
        self.owner = owner
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def upload_part(self, number: int, data: bytes, *, md5: str | None = None) -> PartInfo:
        self.owner.sent.append(number)
        if number == self.owner.corrupt_part:  # bit rot between hashing and the wire; the claimed MD5 is the true one
            data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
        return self.inner.upload_part(number, data, md5=md5)
