"""pytest fixtures for the agent's tests (load with `pytest_plugins = ["tests.agent_fixtures"]`): the built agent
wheel, one metadata server for the session (reset before each use), and Azurite over HTTPS with `--oauth basic`
(bearer tokens are only accepted over HTTPS), yielding its account endpoint and CA file.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.metadata_server import MetadataServer
from tests.moto_server import free_port
from tests.storage_emulators import AZURITE_ACCOUNT, AZURITE_KEY, _process, find_azurite


@pytest.fixture(scope="session")
def agent_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent.wheel import build_wheel

    path, _ = build_wheel(tmp_path_factory.mktemp("wheel"))
    return path


@pytest.fixture(scope="session")
def metadata_session() -> Iterator[MetadataServer]:
    with MetadataServer() as server:
        yield server


@pytest.fixture
def metadata(metadata_session: MetadataServer) -> MetadataServer:
    metadata_session.reset()
    return metadata_session


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """(cert, key) for 127.0.0.1, valid two days."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", str(key),
         "-out", str(cert), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="session")
def azurite_https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    binary = find_azurite()
    if binary is None or shutil.which("node") is None or shutil.which("openssl") is None:
        pytest.skip("azurite-blob, node and openssl are needed (see tests/storage_emulators.py)")
    tmp = tmp_path_factory.mktemp("azurite-https")
    cert, key = self_signed_cert(tmp)
    port = free_port()
    cmd = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(tmp), "--oauth", "basic",
           "--cert", str(cert), "--key", str(key), "--skipApiVersionCheck", "--disableTelemetry",
           "--silent"]  # fmt: skip
    with _process(cmd, port, tmp, "azurite-https"):
        yield f"https://127.0.0.1:{port}/{AZURITE_ACCOUNT}", str(cert)


def azure_container(endpoint: str, cafile: str, name: str) -> Any:
    """A new container in Azurite (shared key, over HTTPS), as an azure-storage-blob ContainerClient."""
    blob = pytest.importorskip("azure.storage.blob")
    conn = (
        f"DefaultEndpointsProtocol=https;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint};"
    )
    service = blob.BlobServiceClient.from_connection_string(conn, connection_verify=cafile)
    container = service.get_container_client(name)
    if not container.exists():
        container.create_container()
    return container
