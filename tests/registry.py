"""A local container registry that requires a login (lab-notes-3.md): Docker's `registry` (Debian's docker-registry)
over TLS with a self-signed certificate for 127.0.0.1 and htpasswd (bcrypt) users, on a free port, for the length
of a `with` block.

`LoginRegistry.host` is `127.0.0.1:<port>`; `cert_dir` holds `<host>/ca.crt` for podman's `--cert-dir` (the agent
gets it through `OVERSPILL_REGISTRY_CERT_DIR`). `push(local_image, name)` pushes with the test credentials through
an auth file of its own, so nothing leaks into the agent's login state.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from tests.agent_fixtures import self_signed_cert
from tests.container_images import podman
from tests.moto_server import free_port
from tests.storage_emulators import _wait_for_port

USER, PASSWORD = "overspill-ci", "registry-pass-0d6f"


def registry_ready() -> str | None:
    for tool in ("docker-registry", "htpasswd", "openssl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install docker-registry apache2-utils openssl)"
    return None


class LoginRegistry:
    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="overspill-registry-")
        self.root = Path(self._tmp.name)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.cert_dir = self.root / "certs"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LoginRegistry:
        root = self.root
        (root / "data").mkdir()
        cert, key = self_signed_cert(root)
        (self.cert_dir / self.host).mkdir(parents=True)
        shutil.copy(cert, self.cert_dir / self.host / "ca.crt")
        htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True)
        (root / "htpasswd").write_text(htpasswd.stdout)
        (root / "config.yml").write_text(
            "version: 0.1\nlog: {level: warn}\n"
            f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
            f"http: {{addr: {self.host}, tls: {{certificate: {cert}, key: {key}}}}}\n"
            f"auth: {{htpasswd: {{realm: overspill-test, path: {root / 'htpasswd'}}}}}\n"
        )
        log = root / "registry.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["docker-registry", "serve", str(root / "config.yml")], stdout=out, stderr=subprocess.STDOUT
            )
        _wait_for_port(self.port, self.proc, log)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._tmp.cleanup()

    def push(self, local_image: str, name: str) -> str:
        """Push `local_image` as `<host>/<name>` and return that reference."""
        target = f"{self.host}/{name}"
        env = {"REGISTRY_AUTH_FILE": str(self.root / "push-auth.json")}
        certs = ["--cert-dir", str(self.cert_dir / self.host)]
        subprocess.run(
            ["podman", "login", *certs, "-u", USER, "--password-stdin", self.host],
            input=PASSWORD, text=True, check=True, capture_output=True,
            env={**_podman_env(), **env},
        )  # fmt: skip
        podman("push", *certs, local_image, target, env=env)
        return target


def _podman_env() -> dict[str, str]:
    import os

    from tests.container_images import containers_conf

    return {**os.environ, "CONTAINERS_CONF": str(containers_conf())}
