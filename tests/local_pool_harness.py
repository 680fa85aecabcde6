"""The broker as a user runs it, for the local pool's end-to-end tests and benchmark: `overspill serve` in its own
process (the local pool on, the simulated market off for speed unless asked), the `overspill` CLI as separate
processes, and what a user compares at the end (the example's final weights in the checkpoint store against an
uninterrupted run of the same script).

- `Broker.start(tmp, env)`: serve on a free port with `OVERSPILL_DATA_DIR=tmp/data`, a 1 s tick; `cli(...)` runs
  one CLI command against it (raises with its output when it fails); `stop()` ends the broker and then every
  process still working under its pool's directories (detached agents, metadata endpoints, workloads).
- `reference_weights(env)`: the example script run directly, without the agent, to the end.
- `final_weights(store, job_id)`: `weights-final.npz` from the job's last checkpoint in a `file://` store (its
  manifest names the file's content-addressed object).
- `kill_under(root)`: SIGKILL every process whose command line or working directory lies under `root`.
- `run_drill(broker, tmp, job_file)`: the newcomer's walk (submit, `logs -f`, `notice`, wait for the end) with its
  checks (a notice drill, two attempts, the second resumed, weights bit-identical to `reference_weights`); returns
  the job id and the measured seconds (submit to finished, notice to the resumed attempt's start).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from tests.moto_server import free_port

REPO = Path(__file__).resolve().parent.parent
OVERSPILL = str(Path(sys.executable).with_name("overspill"))
EXAMPLE = REPO / "examples" / "train-local.yaml"
KEY = "ovs_devadmin_local-development-only"
# about 60 s of training: the notice at step 100 leaves the log's lag (5 s flushes, a busy machine) a wide margin
STEPS = {"STEPS": "300", "CHECKPOINT_EVERY": "50", "STEP_SECONDS": "0.2"}


@dataclass
class Broker:
    url: str
    proc: subprocess.Popen[bytes]
    data: Path
    log: Path
    roots: list[Path] = field(default_factory=list)
    key: str = KEY

    @classmethod
    def start(cls, tmp: Path, env: dict[str, str] | None = None) -> Broker:
        data = tmp / "data"
        port = free_port()
        full = {
            **os.environ,
            "OVERSPILL_DATA_DIR": str(data),
            "OVERSPILL_SIMULATED": "false",
            "OVERSPILL_TICK_INTERVAL_SECONDS": "1",
            "OVERSPILL_AGENT_HEARTBEAT_SECONDS": "10",
            **(env or {}),
        }
        full.pop("OVERSPILL_LOCAL_POOL", None)  # `serve` turns it on by default: that is under test
        full.update({k: v for k, v in (env or {}).items() if k == "OVERSPILL_LOCAL_POOL"})
        log = tmp / "broker.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [OVERSPILL, "serve", "--port", str(port)], env=full, stdout=out, stderr=subprocess.STDOUT, cwd=tmp
            )
        broker = cls(
            f"http://127.0.0.1:{port}", proc, data, log, [data / "pool"], full.get("OVERSPILL_BOOTSTRAP_API_KEY", KEY)
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"overspill serve exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{broker.url}/healthz", timeout=2).status_code == 200:
                    return broker
            time.sleep(0.3)
        broker.stop()
        raise AssertionError(f"overspill serve did not answer:\n{log.read_text()[-4000:]}")

    @property
    def store(self) -> Path:
        return self.data.with_name(self.data.name + "-checkpoints")

    def cli(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        env = {**os.environ, "OVERSPILL_URL": self.url, "OVERSPILL_API_KEY": self.key, "COLUMNS": "200"}
        done = subprocess.run([OVERSPILL, *args], env=env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"overspill {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout + (done.stderr if not check else "")

    def events(self, job_id: str) -> list[dict[str, object]]:
        answer = httpx.get(
            f"{self.url}/v1/jobs/{job_id}/events", headers={"Authorization": f"Bearer {self.key}"}, timeout=10
        ).json()
        return answer["items"]  # type: ignore[no-any-return]

    def wait_state(self, job_id: str, states: set[str], timeout: float) -> dict[str, object]:
        end = time.monotonic() + timeout
        job: dict[str, object] = {}
        while time.monotonic() < end:
            job = httpx.get(
                f"{self.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {self.key}"}, timeout=10
            ).json()
            if job.get("state") in states:
                return job
            if job.get("state") in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        raise AssertionError(
            f"job {job_id} not in {states} after {timeout}s: {job}\n{self.log.read_text()[-3000:]}\n"
            + "\n".join(f"{e['kind']}: {e['message']}" for e in self.events(job_id))
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for root in self.roots:
            kill_under(root)


def kill_under(root: Path) -> None:
    marker = str(root)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if marker in cmd or cwd.startswith(marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def example_job(tmp: Path, image: str | None = None, **env: str) -> Path:
    """examples/train-local.yaml with the workload's variables overridden (shorter runs), and its image."""
    import yaml

    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["env"] = {**spec.get("env", {}), **env}
    if image:
        spec["image"] = image
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def reference_weights(tmp: Path, env: dict[str, str], image: str | None = None) -> dict[str, np.ndarray]:
    """The example trained straight through, without the agent (STEP_SECONDS 0: the pause changes nothing): here,
    or in `image` with podman (its own NumPy build and BLAS give other last bits than this machine's, so a container
    run is compared with a run in the same image)."""
    ckpt = tmp / "reference"
    ckpt.mkdir(parents=True, exist_ok=True)
    if image:
        from tests.container_images import podman

        variables = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        podman("run", "--rm", "-v", f"{ckpt}:/ckpt", "-e", "OVERSPILL_CHECKPOINT_DIR=/ckpt", "-e", "STEP_SECONDS=0",
               *variables, image, "python3", "-m", "examples.train_numpy")  # fmt: skip
    else:
        run_env = {**os.environ, **env, "STEP_SECONDS": "0", "OVERSPILL_CHECKPOINT_DIR": str(ckpt)}
        for name in ("OVERSPILL_PROGRESS_FILE", "OVERSPILL_RESUME"):
            run_env.pop(name, None)
        subprocess.run(
            [sys.executable, "-m", "examples.train_numpy"],
            env=run_env,
            cwd=REPO,
            check=True,
            timeout=300,
            stdout=subprocess.DEVNULL,
        )
    with np.load(ckpt / "weights-final.npz") as z:
        return {k: z[k].copy() for k in z.files}


def final_weights(store: Path, job_id: str) -> dict[str, np.ndarray]:
    """`weights-final.npz` of the job's last checkpoint in the file store rooted at `store`."""
    for manifest in store.rglob("MANIFEST.json"):
        doc = json.loads(manifest.read_text())
        if doc.get("job_id") != job_id:
            continue
        entry = next((f for f in doc["files"] if f["path"] == "weights-final.npz"), None)
        assert entry is not None, f"the job's checkpoint holds no weights-final.npz: {doc['files']}"
        path = manifest.parent / "data" / entry["sha256"]
        with np.load(path) as z:
            return {k: z[k].copy() for k in z.files}
    raise AssertionError(f"no checkpoint manifest of {job_id} under {store}")


def job_id_of(submitted: str) -> str:
    return next(word for word in submitted.split() if word.startswith("job_"))


def _follow(broker: Broker, job_id: str, lines: list[str]) -> threading.Thread:
    """`overspill logs JOB -f` in its own process, its lines collected as they come."""
    env = {**os.environ, "OVERSPILL_URL": broker.url, "OVERSPILL_API_KEY": broker.key}
    proc = subprocess.Popen(
        [OVERSPILL, "logs", job_id, "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
        proc.wait()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _wait_for(lines: list[str], needle: str, timeout: float) -> float:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(needle in line for line in lines):
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} never appeared in the streamed log:\n" + "\n".join(lines[-40:]))


def run_drill(
    broker: Broker, tmp: Path, job_file: Path, *, zone: str = "local", image: str | None = None
) -> tuple[str, dict[str, float]]:
    """Submit, stream, notice, resume, finish (both attempts on the pool's host `zone`); returns the measured times
    (seconds)."""
    t0 = time.monotonic()
    job_id = job_id_of(broker.cli("submit", str(job_file)))
    broker.wait_state(job_id, {"running"}, timeout=120)
    lines: list[str] = []
    # the log appears once the agent has shipped its first chunk: retry until `logs -f` has something to follow
    end = time.monotonic() + 60
    while not broker.cli("logs", job_id).strip() and time.monotonic() < end:
        time.sleep(0.5)
    follower = _follow(broker, job_id, lines)
    _wait_for(lines, "step 100/", timeout=120)
    noticed = time.monotonic()
    said = broker.cli("notice", job_id)
    assert "notice delivered" in said, said
    follower.join(timeout=120)
    assert any("interruption notice: checkpoint saved at step" in line for line in lines), lines[-20:]
    job = broker.wait_state(job_id, {"succeeded", "failed", "paused", "cancelled"}, timeout=300)
    done = time.monotonic()
    assert job["state"] == "succeeded", job
    assert job["placement"]["zone"] == zone and job["placement"]["instance_id"].startswith(f"{zone}/"), job  # type: ignore[index]
    kinds = [e["kind"] for e in broker.events(job_id)]
    assert "notice_drill" in kinds, kinds
    attempts = [e for e in broker.events(job_id) if e["kind"] == "agent_started"]
    assert len(attempts) == 2, kinds
    resumed_at = _event_time(broker, job_id, "agent_started", last=True)
    noticed_at = _event_time(broker, job_id, "notice_drill")
    second = broker.cli("logs", job_id)
    assert "resumed from the checkpoint at step" in second, second[-2000:]
    want = reference_weights(tmp, STEPS, image)
    got = final_weights(broker.store, job_id)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes(), name
    return job_id, {
        "submit_to_finished_s": round(done - t0, 1),
        "notice_to_resumed_s": round(resumed_at - noticed_at, 1),
        "notice_cli_to_finished_s": round(done - noticed, 1),
    }


def _event_time(broker: Broker, job_id: str, kind: str, *, last: bool = False) -> float:
    from datetime import datetime

    found = [e for e in broker.events(job_id) if e["kind"] == kind]
    assert found, kind
    event = found[-1] if last else found[0]
    return datetime.fromisoformat(str(event["at"]).replace("Z", "+00:00")).timestamp()
