"""Run the workload: as a container (`docker`, `podman`: one implementation, the binary differs) or as a plain process
group (`process`: Slurm nodes, bare metal, tests).

Contract of a `Workload`: `start()` launches it with stdout and stderr merged into one pipe (`output`, read by the
log shipper) or raises `LaunchError` carrying the outcome (infra_failed or user_failed) and a reason; `signal()`
reaches the whole workload (the container's init, or the process group); `poll()`/`wait()` give the exit code (a
death by signal N is 128+N, as shells report it); `stop()` sends SIGTERM, then SIGKILL after a grace period.

Environment and secrets never appear on a command line (which `ps` shows): containers get them through an
`--env-file` written 0600 in the agent's private directory and deleted as soon as `create` has read it; a process
gets them directly. Containers are created with `--pull=never` (the agent pulled the image first), `--init` (so the
signal reaches the workload under a PID 1 that forwards it), `--ipc=host` or `--shm-size`, exactly `gpu_count`
GPUs, and two mounts: the checkpoint directory and the run directory (progress and notice files).

GPUs: `nvidia-smi -L` lists the host's GPUs. A job asking for N GPUs on a host with fewer, or without a working
driver, fails to launch as infra_failed. Docker gets `--gpus "device=0,1"`, podman CDI devices
`--device nvidia.com/gpu=<i>`, a process `CUDA_VISIBLE_DEVICES=0,1`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from agent.compat import remove_prefix
from agent.protocol import Outcome, Runtime

CONTAINER_CHECKPOINT_DIR = "/overspill/checkpoint"
CONTAINER_RUN_DIR = "/overspill/run"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# what a process workload inherits from the agent's environment; nothing else (no agent credentials)
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")


class LaunchError(Exception):
    def __init__(self, outcome: Outcome, detail: str, exit_code: int | None = None) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail
        self.exit_code = exit_code


@dataclass
class Launch:
    """What to run. `env` is the workload's whole environment (job env, secrets, OVERSPILL_* files) with the paths
    as the workload sees them (`CONTAINER_*_DIR` in a container); the directories are host paths."""

    name: str
    command: list[str]
    env: dict[str, str]
    checkpoint_dir: Path
    run_dir: Path
    private_dir: Path
    gpu_count: int = 0
    image: str = ""
    shm_size_gb: str | None = None
    runtime_env: dict[str, str] = field(default_factory=dict)  # the container runtime's own environment


def detect_gpus(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The host's GPU indices from `nvidia-smi -L`; None when there is no nvidia-smi. Raises LaunchError when the
    driver does not answer."""
    binary = shutil.which("nvidia-smi", path=(env or os.environ).get("PATH"))
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(Outcome.INFRA_FAILED, f"nvidia-smi did not answer: {exc}") from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip()[-300:]
        raise LaunchError(Outcome.INFRA_FAILED, f"the GPU driver does not work (nvidia-smi -L: {reason})")
    return [m[1] for m in re.finditer(r"^GPU (\d+):", done.stdout, re.MULTILINE)]


def select_gpus(gpu_count: int, env: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPU indices the workload gets: the first `gpu_count` ones; None when the host has no NVIDIA tooling and
    none are asked for. Raises LaunchError (infra_failed) when the host cannot provide them."""
    found = detect_gpus(env)
    if gpu_count <= 0:
        return [] if found is not None else None
    if found is None:
        raise LaunchError(
            Outcome.INFRA_FAILED, f"the job needs {gpu_count} GPU(s) but this host has no NVIDIA driver (no nvidia-smi)"
        )
    if len(found) < gpu_count:
        raise LaunchError(Outcome.INFRA_FAILED, f"the job needs {gpu_count} GPU(s) but this host has {len(found)}")
    return found[:gpu_count]


def check_env(env: Mapping[str, str], *, container: bool) -> None:
    for name, value in env.items():
        if not ENV_NAME.match(name):
            raise LaunchError(Outcome.USER_FAILED, f"environment variable name {name!r} is not valid")
        if "\0" in value or (container and ("\n" in value or "\r" in value)):
            raise LaunchError(
                Outcome.USER_FAILED,
                f"environment variable {name} holds a line break or NUL, which a container's --env-file cannot carry;"
                " encode it (e.g. base64)",
            )


class Workload:
    output: IO[bytes]

    def start(self) -> None:
        raise NotImplementedError

    def signal(self, sig: signal.Signals) -> None:
        raise NotImplementedError

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int | None:
        raise NotImplementedError

    def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds; the exit code."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """Remove whatever the workload left behind (a container); safe to call twice."""


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class ProcessWorkload(Workload):
    """The command in its own session and process group, as the agent's user."""

    def __init__(self, launch: Launch, gpus: list[str] | None) -> None:
        self.launch = launch
        self.gpus = gpus
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        launch = self.launch
        check_env(launch.env, container=False)
        env = {k: v for k in INHERITED if (v := os.environ.get(k)) is not None}
        env.update(launch.env)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        try:
            self.proc = subprocess.Popen(
                launch.command,
                env=env,
                cwd=launch.run_dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError:
            raise LaunchError(Outcome.USER_FAILED, f"command not found: {launch.command[0]!r}", 127) from None
        except PermissionError:
            raise LaunchError(Outcome.USER_FAILED, f"command not executable: {launch.command[0]!r}", 126) from None
        except OSError as exc:
            raise LaunchError(Outcome.USER_FAILED, f"cannot run {launch.command[0]!r}: {exc.strerror}", 126) from None
        assert self.proc.stdout is not None
        self.output = self.proc.stdout

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def poll(self) -> int | None:
        assert self.proc is not None
        rc = self.proc.poll()
        return None if rc is None else _code(rc)

    def wait(self, timeout: float | None = None) -> int | None:
        assert self.proc is not None
        try:
            return _code(self.proc.wait(timeout))
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float) -> int:
        self.signal(signal.SIGTERM)
        code = self.wait(grace)
        if code is None:
            self.signal(signal.SIGKILL)
            code = self.wait(None)
        assert code is not None
        return code

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop(1)
        # anything the workload left running in its group
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)


class ContainerWorkload(Workload):
    """`<binary> create ...` then `<binary> start --attach`: the exit code of `start` is the container's; 125 is the
    runtime's own failure."""

    def __init__(self, binary: str, launch: Launch, gpus: list[str] | None) -> None:
        self.binary = binary
        self.launch = launch
        self.gpus = gpus or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.is_docker = os.path.basename(binary).startswith("docker")
        self._lock = threading.Lock()

    def _runtime(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {k: v for k in INHERITED if (v := os.environ.get(k)) is not None}
        env.update(self.launch.runtime_env)
        return subprocess.run([self.binary, *args], capture_output=True, text=True, env=env, timeout=timeout)

    def create_args(self, env_file: Path) -> list[str]:
        launch = self.launch
        args = ["create", "--rm", "--name", launch.name, "--init", "--pull=never", "--env-file", str(env_file)]
        if launch.shm_size_gb is not None:
            size = str(launch.shm_size_gb)  # the spec may carry a JSON number
            if not re.fullmatch(r"\d+(\.\d+)?", size) or float(size) <= 0:
                raise LaunchError(Outcome.USER_FAILED, f"shm_size_gb {launch.shm_size_gb!r} is not a positive number")
            args.append(f"--shm-size={max(1, int(float(size) * 1024))}m")
        else:
            args.append("--ipc=host")
        args += ["-v", f"{launch.checkpoint_dir}:{CONTAINER_CHECKPOINT_DIR}"]
        args += ["-v", f"{launch.run_dir}:{CONTAINER_RUN_DIR}"]
        if self.gpus:
            if self.is_docker:
                args += ["--gpus", '"device=' + ",".join(self.gpus) + '"']
            else:
                for gpu in self.gpus:
                    args += ["--device", f"nvidia.com/gpu={gpu}"]
        return [*args, launch.image, *launch.command]

    def start(self) -> None:
        launch = self.launch
        env = launch.env
        check_env(env, container=True)
        env_file = launch.private_dir / f"{launch.name}.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.writelines(f"{k}={v}\n" for k, v in env.items())
            self._runtime(["rm", "-f", launch.name], timeout=60)  # a leftover from an earlier agent run
            try:
                created = self._runtime(self.create_args(env_file), timeout=600)
            except FileNotFoundError:
                raise LaunchError(
                    Outcome.INFRA_FAILED, f"the container runtime {self.binary!r} is not installed"
                ) from None
            except subprocess.TimeoutExpired:
                raise LaunchError(Outcome.INFRA_FAILED, f"{self.binary} create timed out") from None
        finally:
            with contextlib.suppress(OSError):
                env_file.unlink()
        if created.returncode != 0:
            reason = (created.stderr or created.stdout).strip()[-500:]
            outcome = Outcome.USER_FAILED if created.returncode in (126, 127) else Outcome.INFRA_FAILED
            raise LaunchError(
                outcome, f"{self.binary} create failed ({created.returncode}): {reason}", created.returncode
            )
        run_env = {k: v for k in INHERITED if (v := os.environ.get(k)) is not None}
        run_env.update(launch.runtime_env)
        self.proc = subprocess.Popen(
            [self.binary, "start", "--attach", launch.name],
            env=run_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.output = self.proc.stdout

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self._runtime(["kill", "--signal", remove_prefix(sig.name, "SIG"), self.launch.name], timeout=30)

    def poll(self) -> int | None:
        assert self.proc is not None
        rc = self.proc.poll()
        return None if rc is None else _code(rc)

    def wait(self, timeout: float | None = None) -> int | None:
        assert self.proc is not None
        try:
            return _code(self.proc.wait(timeout))
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float) -> int:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self._runtime(["stop", "-t", str(max(1, int(grace))), self.launch.name], timeout=grace + 60)
        code = self.wait(30)
        if code is None:
            assert self.proc is not None
            self.proc.kill()
            code = self.wait(None)
        assert code is not None
        return code

    def cleanup(self) -> None:
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                self.stop(1)
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self._runtime(["rm", "-f", self.launch.name], timeout=60)


def make_workload(runtime: Runtime, launch: Launch, gpus: list[str] | None, binary: str | None = None) -> Workload:
    if runtime is Runtime.PROCESS:
        return ProcessWorkload(launch, gpus)
    return ContainerWorkload(binary or runtime.value, launch, gpus)
