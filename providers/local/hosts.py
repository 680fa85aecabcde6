"""Where a local pool runs its attempts: this machine, or a host reached over SSH. One small contract, `Host.sh`:
run a POSIX shell script (given on stdin to `sh -s`) there and return its exit status and output.

- `LocalHost` runs `sh -s` here. Its PATH starts with the directory of the broker's own interpreter, so `python3`
  on the host (the agent's interpreter, and the workload's on the process runtime) is the one the broker runs on.
- `SshHost` runs `ssh [-p PORT] [-i KEY] -o BatchMode=yes TARGET sh -s` (OpenSSH's client): the agent is shipped and
  started over that one connection, as SkyPilot's SSH node pools and dstack's SSH fleets do. The host needs only
  `sh` and `python3` (3.8+); host keys are checked against `known_hosts` when given (else the first key seen is
  kept there: `StrictHostKeyChecking=accept-new`).
A host that cannot be reached raises `HostUnreachable`; the pool turns it into the provider errors of its contract.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


class HostUnreachable(Exception):
    """The host did not run the script (ssh failed to connect, or timed out)."""


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@dataclass
class LocalHost:
    """This machine."""

    name: str = "local"
    timeout: float = 60.0

    def sh(self, script: str, *, timeout: float | None = None) -> Result:
        env = dict(os.environ)
        bindir = str(Path(sys.executable).parent)
        env["PATH"] = f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
        try:
            done = subprocess.run(
                ["sh", "-s"], input=script, env=env, capture_output=True, text=True, timeout=timeout or self.timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise HostUnreachable(f"host {self.name}: the script ran over {exc.timeout}s") from None
        return Result(done.returncode, done.stdout, done.stderr)


@dataclass
class SshHost:
    """A host reached with OpenSSH (`target` is `user@host` or an alias of the ssh config)."""

    name: str
    target: str
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    options: list[str] = field(default_factory=list)
    timeout: float = 60.0

    def command(self) -> list[str]:
        cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=accept-new"]
        if self.port:
            cmd += ["-p", str(self.port)]
        if self.identity_file:
            cmd += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            cmd += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        for option in self.options:
            cmd += ["-o", option]
        return [*cmd, self.target, "sh -s"]

    def sh(self, script: str, *, timeout: float | None = None) -> Result:
        try:
            done = subprocess.run(
                self.command(), input=script, capture_output=True, text=True, timeout=timeout or self.timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise HostUnreachable(f"host {self.name} ({self.target}): no answer in {exc.timeout}s") from None
        except OSError as exc:
            raise HostUnreachable(f"host {self.name}: cannot run ssh: {exc}") from None
        if done.returncode == 255:  # ssh's own failure (connection, authentication)
            raise HostUnreachable(f"host {self.name} ({self.target}): {done.stderr.strip()[-500:]}")
        return Result(done.returncode, done.stdout, done.stderr)


Host = LocalHost | SshHost
