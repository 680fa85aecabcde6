"""A real OpenSSH server on a free 127.0.0.1 port, for the local pool's remote-host tests (lab-notes-4.md): a
private `sshd` (no PAM, key only, its own host key and authorized_keys in a temporary directory) and the client key
that logs in to it as the current user. `sshd_ready()` says why one cannot run here, or None.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.moto_server import free_port

SSHD = "/usr/sbin/sshd"


def sshd_ready() -> str | None:
    if not Path(SSHD).exists():
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client is not installed (apt-get install openssh-client)"
    return None


@dataclass(frozen=True)
class Sshd:
    port: int
    user: str
    identity_file: Path
    known_hosts: Path

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1"


@contextmanager
def running_sshd(directory: Path) -> Iterator[Sshd]:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / name)], check=True)
    (directory / "authorized_keys").write_text((directory / "user_key.pub").read_text())
    os.chmod(directory / "authorized_keys", 0o600)
    port = free_port()
    config = directory / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {directory}/host_key\n"
        f"AuthorizedKeysFile {directory}/authorized_keys\nPasswordAuthentication no\nPidFile {directory}/sshd.pid\n"
        "StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
    )
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    subprocess.run([SSHD, "-f", str(config), "-E", str(directory / "sshd.log")], check=True)
    host_pub = (directory / "host_key.pub").read_text().split()
    known = directory / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    server = Sshd(port, getpass.getuser(), directory / "user_key", known)
    try:
        deadline = time.monotonic() + 20
        while True:
            probe = subprocess.run(
                ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}", "-i", str(server.identity_file),
                 "-p", str(port), server.target, "true"],
                capture_output=True, text=True,
            )  # fmt: skip
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                log = (directory / "sshd.log").read_text()
                log = (directory / "sshd.log").read_text()
                raise AssertionError(f"sshd does not take the key: {probe.stderr}\n{log}")
            time.sleep(0.2)
        yield server
    finally:
        pid = (directory / "sshd.pid").read_text().strip() if (directory / "sshd.pid").exists() else ""
        if pid:
            with suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
