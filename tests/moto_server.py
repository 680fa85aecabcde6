"""A real moto server for tests: a `ThreadedMotoServer` on a free 127.0.0.1 port and boto3 clients pointed at it.

Use it from a module-scoped fixture (the first EC2 call costs ~1.5 s of backend start-up, later calls milliseconds):

    @pytest.fixture(scope="module")
    def moto_url() -> Iterator[str]:
        with running_moto_server() as url:
            yield url

moto keeps its state in process-wide backends, so every server started in one test process sees the same
resources: tests must find their own resources by id, token or tag, never assume an empty account. A test that
resets moto (`/moto-api/reset`) wipes every in-process server's resources, so state that must outlive other test
modules (the session's Terraform deployment) lives in `running_moto_process()`: a server in a process of its own.
Clients are built with dummy credentials and a single attempt (no retries hiding errors).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_moto_server() -> Iterator[str]:
    """Start a moto server, yield its URL, stop it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_threaded(server)


def stop_threaded(server: Any) -> None:
    """Stop a `ThreadedMotoServer` and close its listening socket: moto's `stop()` ends the serving thread but
    leaves the socket listening until the garbage collector finds it (tests/leak_check.py reports that)."""
    server.stop()
    inner = getattr(server, "_server", None)
    if inner is not None:
        inner.server_close()


@contextmanager
def running_moto_process(timeout: float = 60.0) -> Iterator[str]:
    """A moto server in its own process (its own backends: no other test's reset reaches it); yield its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server process did not start on port {port}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def moto_client(service: str, region: str, url: str) -> Any:
    """A boto3 client for `service` in `region` talking to the moto server at `url`."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"total_max_attempts": 1})
    return boto3.client(service, region_name=region, endpoint_url=url, config=config, **CREDS)
