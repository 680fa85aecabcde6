"""Boot a launched instance for real: take the start-up script a cloud adapter actually sent and run it with `sh`.

What each cloud received:
- `aws_user_data(ec2, instance_id)`: EC2 `DescribeInstanceAttribute userData` of the instance (moto keeps it).
- `gcp_startup_script(fake, instance_id)`: the `startup-script` metadata item of the insert the GCP stand-in
  (tests/gcp_compute_fake.py) recorded for that VM.
- `azure_custom_data(fake, instance_id)`: the `osProfile.customData` of the PUT the Azure stand-in
  (tests/azure_compute_fake.py) recorded for that VM, base64-decoded as cloud-init would.

`boot(script, workdir, env)` writes the script to a file and runs `sh <file>` with exactly `env` (plus PATH and HOME):
the instance's environment, i.e. where the stand-ins for the metadata service are (`OVERSPILL_METADATA_URL`,
tests/metadata_server.py) and, for a self-signed emulator, `SSL_CERT_FILE`. The store endpoints come from the
script's own exports (the broker puts them there from its settings). The script fetches the agent's wheel through
the URL the broker signed, checks its SHA-256 and starts the real agent detached (nohup + setsid, as on a machine
without systemd), then returns. `Booted.wait()` waits for that agent process to exit (found in /proc by its
`--work-dir`, which lies under the test's own directory), `Booted.stop()` ends it by its PID, and `agent_log()`
is its own output.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def aws_user_data(ec2: Any, instance_id: str) -> str:
    """The user data EC2 holds for `instance_id` ("region:i-..." or "i-...")."""
    ec2_id = instance_id.split(":", 1)[-1]
    value = ec2.describe_instance_attribute(InstanceId=ec2_id, Attribute="userData")["UserData"].get("Value", "")
    return base64.b64decode(value).decode()


def gcp_startup_script(fake: Any, instance_id: str) -> str:
    """The `startup-script` metadata of the recorded insert of VM `zone/name`."""
    zone, name = instance_id.split("/")
    for rec in fake.recorded("POST", "/instances"):
        body = rec.body if isinstance(rec.body, dict) else json.loads(rec.body or "{}")
        if body.get("name") == name and f"/zones/{zone}/" in rec.path:
            items = {i["key"]: i.get("value", "") for i in (body.get("metadata") or {}).get("items", [])}
            return str(items["startup-script"])
    raise AssertionError(f"no recorded insert of {instance_id}")


def azure_custom_data(fake: Any, instance_id: str) -> str:
    """The decoded `customData` of the recorded create of the VM named by `instance_id` (its ARM id or name)."""
    name = instance_id.rstrip("/").rsplit("/", 1)[-1]
    for rec in fake.recorded("PUT", f"/virtualMachines/{name}"):
        body = rec.body if isinstance(rec.body, dict) else json.loads(rec.body or "{}")
        custom = ((body.get("properties") or {}).get("osProfile") or {}).get("customData")
        if custom:
            return base64.b64decode(custom).decode()
    raise AssertionError(f"no recorded create of {instance_id} with custom data")


@dataclass
class Booted:
    """An instance whose start-up script ran: its agent, detached, working under `root`."""

    root: Path
    script_output: str

    def agent_pids(self) -> list[int]:
        """The agent processes working under this instance's root (their command line names its work dir)."""
        marker = str(self.root / "work").encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"agent\x00run\x00" in cmdline and marker in cmdline:
                found.append(int(entry.name))
        return found

    def wait(self, timeout: float = 120) -> None:
        """Wait until the agent has started and exited (it exits once its final report is stored). The script
        returns as soon as it has forked the detached agent, which may not have exec'd yet (its process still
        shows the shell's command line): so the agent must be seen running, or its log must say the attempt
        ended, before an empty process list means it is done."""
        end = time.monotonic() + timeout
        seen = False
        while time.monotonic() < end:
            pids = self.agent_pids()
            seen = seen or bool(pids) or "attempt ended" in self.agent_log()
            if seen and not pids:
                return
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the agent did not finish in {timeout}s:\n{self.agent_log()}")

    def stop(self) -> None:
        for pid in self.agent_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def agent_log(self) -> str:
        path = self.root / "agent.log"
        return path.read_text(errors="replace")[-8000:] if path.exists() else "(no agent.log)"


def boot(script: str, root: Path, env: dict[str, str], *, gpus: int = 0, timeout: float = 120) -> Booted:
    """Run `script` with `sh` as a booting instance does (see the module docstring). `root` must be the agent root
    the broker rendered into the script (`OVERSPILL_AGENT_ROOT`). `gpus` > 0 gives the instance that many GPUs as
    its driver lists them: an `nvidia-smi` on PATH answering `-L` (the agent gives the workload the ones it asked
    for; the process runtime needs nothing else of them)."""
    assert f"mkdir -p {root}" in script, f"the script does not use the agent root {root}"
    if Path("/run/systemd/system").is_dir():
        raise AssertionError("this machine runs systemd: the script would start the agent as a systemd unit")
    root.parent.mkdir(parents=True, exist_ok=True)
    path = root.parent / f"{root.name}-user-data.sh"
    path.write_text(script)
    path_var = os.environ.get("PATH", "/usr/bin:/bin")
    if gpus:
        tools = root.parent / f"{root.name}-bin"
        tools.mkdir(exist_ok=True)
        lines = "".join(f"echo 'GPU {i}: NVIDIA A10G (UUID: GPU-0000000{i}-test)'\n" for i in range(gpus))
        (tools / "nvidia-smi").write_text("#!/bin/sh\n" + lines)
        (tools / "nvidia-smi").chmod(0o755)
        path_var = f"{tools}:{path_var}"
    full = {"PATH": path_var, "HOME": os.environ.get("HOME", "/root"), **env}
    done = subprocess.run(["sh", str(path)], env=full, capture_output=True, text=True, timeout=timeout, cwd="/")
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the start-up script failed ({done.returncode}):\n{output}"
    return Booted(root, output)
