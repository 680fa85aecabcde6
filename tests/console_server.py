"""A real broker process for browser tests and the console benchmark: uvicorn serving the app, the simulated
market on a fast clock, and a control loop that a test can pause.

    python -m tests.console_server --port P [--speed 600] [--pause-file PATH]

Configuration comes from the environment (`OVERSPILL_*`, e.g. the database URL). `--speed` runs simulated time
that many times faster than real time (600: a simulated hour every 6 s), so a job goes pending -> running ->
done within seconds; the loop ticks every `OVERSPILL_TICK_INTERVAL_SECONDS` of simulated time. While the pause
file exists the loop does not tick (so a test can look at a job before it is placed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import uvicorn

from broker.app import create_app
from broker.config.settings import Settings
from broker.loop.tick import tick
from broker.observe.logging_setup import configure_logging
from broker.runtime import Runtime, build_runtime


class FastClock:
    """Simulated UTC time running `speed` times faster than the wall clock, from now."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self.start = datetime.now(UTC)
        self.t0 = time.monotonic()

    def __call__(self) -> datetime:
        return self.start + timedelta(seconds=(time.monotonic() - self.t0) * self.speed)


def _loop(rt: Runtime, speed: float, pause: Path | None, stop: threading.Event) -> None:
    interval = rt.settings.tick_interval_seconds / speed
    while not stop.is_set():
        if pause is None or not pause.exists():
            tick(rt, rt.clock())
        stop.wait(interval)


@contextlib.contextmanager
def running(data_dir: Path, env: dict[str, str], args: list[str], log: Path) -> Iterator[str]:
    """Start this module as a broker process on a free port (`OVERSPILL_*` from `env` over the test's own
    environment, its output to `log`), wait until it answers /healthz, yield its URL, and stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    full = {**os.environ, "OVERSPILL_DATA_DIR": str(data_dir), **env}
    with log.open("w") as out:
        command = [sys.executable, "-m", "tests.console_server", "--port", str(port), *args]
        root = Path(__file__).resolve().parents[1]
        proc = subprocess.Popen(command, cwd=root, env=full, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the broker exited: {log.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--pause-file", type=Path, default=None)
    parser.add_argument("--no-loop", action="store_true")
    args = parser.parse_args()
    settings = Settings()
    configure_logging(settings)
    rt = build_runtime(settings, clock=FastClock(args.speed))
    stop = threading.Event()
    if not args.no_loop:
        threading.Thread(target=_loop, args=(rt, args.speed, args.pause_file, stop), daemon=True).start()
    try:
        uvicorn.run(create_app(runtime=rt), host="127.0.0.1", port=args.port, log_config=None, access_log=False)
    finally:
        stop.set()


if __name__ == "__main__":
    main()
