"""Real API processes for the multi-process tests and benchmarks: `uvicorn --factory broker.app:app_from_env` on a
free loopback port, settings from the environment given, started and awaited until `/healthz` answers.

`start_api(env, log=..., workers=N)` returns the base URL and the process (with `workers` > 1, uvicorn's supervisor
of N worker processes); the caller terminates it. Output goes to `log` (a file path) or is inherited: never to a
pipe nobody reads while the process runs. `running_apis(env, n)` starts `n` of them, waits until each is healthy,
yields their URLs and stops them all.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.moto_server import free_port

ROOT = Path(__file__).resolve().parent.parent


def start_api(env: dict[str, str], *, log: Path | None = None, workers: int = 1) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "broker.app:app_from_env"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    if log is None:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    else:
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return f"http://127.0.0.1:{port}", proc


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until `url`/healthz answers 200; RuntimeError if the process exits first, TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"API process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not come up")


@contextmanager
def running_apis(env: dict[str, str], n: int) -> Iterator[list[str]]:
    """`n` API processes on the settings in `env`, healthy; stopped (terminate, then wait) on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for _ in range(n):
            url, proc = start_api(env)
            urls.append(url)
            procs.append(proc)
        for url, proc in zip(urls, procs, strict=True):
            wait_healthy(url, proc)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
