"""Jobs the broker places on Slurm run in their own image with the site's container runtime, and keep their output
(providers/slurm/container.py): on the real cluster, rootless podman as the tenant's unprivileged identity runs a
real image (a tiny rootfs of the host's dash, `podman import`ed into that user's store), with the job's environment
passed by name, never as shell text; the output goes to the configured `--output`. The other runtimes' command
lines are checked for quoting, since apptainer and pyxis are not installed here."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from federation.pressure import QueueModel
from providers.slurm.container import container_command
from providers.slurm.provider import SlurmProvider
from tests.container_images import containers_conf
from tests.provider_contract import BROKER_ID, ContractEnv
from tests.test_provider_slurm import PARTITIONS, make_offering, wait_until

HOSTILE = 'it\'s "x" $(touch /tmp/pwned) `id` ; & |'


def _tiny_image(root: Path) -> Path:
    """A root filesystem with only /bin/sh (the host's dash and its libraries) and a marker file, as a tarball."""
    fs = root / "rootfs"
    (fs / "bin").mkdir(parents=True)
    shutil.copy("/bin/dash", fs / "bin" / "sh")
    libs = subprocess.run(["ldd", "/bin/dash"], capture_output=True, text=True, check=True).stdout
    for word in libs.split():
        if word.startswith("/"):
            dest = fs / word.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(word, dest)
    (fs / "ovs-marker").write_text("inside-the-tiny-image\n")
    tar = root / "tiny.tar"
    subprocess.run(["tar", "-C", str(fs), "-cf", str(tar), "."], check=True)
    return tar


@pytest.mark.integration
def test_a_broker_placed_job_runs_its_image_with_podman_as_the_tenant_and_keeps_its_output(cluster: Any) -> None:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (apt-get install podman runc)")
    cluster.cancel_all()
    shared = cluster.root / "shared"
    tag = uuid.uuid4().hex[:8]
    base = shared / f"podman-{tag}"  # the tenant identity's container store, on the site's disk
    runroot = Path(f"/tmp/ovs-rr-{tag}")  # podman wants a runroot path of at most 50 characters
    base.mkdir()
    os.chmod(base, 0o1777)
    tar = _tiny_image(base)
    os.chmod(tar, 0o644)
    launcher = [
        "env", f"HOME={base}", f"XDG_RUNTIME_DIR={base}/run", f"CONTAINERS_CONF={containers_conf()}",
        "podman", "--root", f"{base}/root", "--runroot", str(runroot),
    ]  # fmt: skip
    load = shlex.join([*launcher, "import", str(tar), "localhost/ovs-tiny:1"])
    prep = f"cd / && mkdir -p {base}/run && chmod 700 {base}/run && {load}"
    done = cluster.run(["runuser", "-u", "tenant-acme", "--", "sh", "-c", prep])
    assert done.returncode == 0, done.stdout + done.stderr
    provider = SlurmProvider(
        broker_id=BROKER_ID,
        partitions=PARTITIONS,
        queue_model=QueueModel,
        run=cluster.broker_runner(),
        command=container_command("podman", launcher),
        output=f"{shared}/%j.out",
        workdir=str(shared),
        submit_as={"t": "tenant-acme"},
    )
    request = ContractEnv(provider=provider, offering=make_offering(1)).request()
    script = 'read m < /ovs-marker; echo "$m|$GREETING|$OVERSPILL_JOB_ID|$OVERSPILL_RESUME"; [ ! -e /etc/passwd ]'
    spec = replace(request.spec, image="localhost/ovs-tiny:1", command=("/bin/sh", "-c", script),
                   env={"GREETING": HOSTILE})  # fmt: skip
    instance = provider.launch(replace(request, spec=spec))
    try:
        wait_until(lambda: provider.get(instance.id).state.terminal, "the containerised job to end", timeout=60)
        out = (shared / f"{instance.id}.out").read_text()
        assert provider.get(instance.id).state.value == "succeeded", out
        # the image's own file system (no /etc/passwd there), the job's environment byte for byte, the broker's ids
        assert out.strip() == f"inside-the-tiny-image|{HOSTILE}|{request.tags.job_id}|0", out
        assert not Path("/tmp/pwned").exists()
    finally:
        cluster.cancel_all()
        shutil.rmtree(runroot, ignore_errors=True)


def test_apptainer_and_pyxis_command_lines_quote_every_word() -> None:
    from tests.test_provider_slurm import make_provider  # noqa: F401  (same request shape as the contract)

    request = ContractEnv(provider=None, offering=make_offering(1)).request()  # type: ignore[arg-type]
    spec = replace(request.spec, image="nvcr.io/nvidia/pytorch:24.01", command=("python", "-c", "print('$(x)')"),
                   env={"A": HOSTILE})  # fmt: skip
    req = replace(request, spec=spec)
    apptainer = container_command("apptainer", (), ["--bind", "/scratch"])(req)
    exports, _, run = apptainer.partition("; exec ")
    assert shlex.split(run) == ["apptainer", "exec", "--cleanenv", "--nv", "--bind", "/scratch",
                                "docker://nvcr.io/nvidia/pytorch:24.01", "python", "-c", "print('$(x)')"]  # fmt: skip
    assert f"APPTAINERENV_A={shlex.quote(HOSTILE)}" in exports
    pyxis = container_command("pyxis")(req)
    words = shlex.split(pyxis.partition("; exec ")[2])
    assert words[:2] == ["srun", "--container-image=nvcr.io#nvidia/pytorch:24.01"]
    assert words[2].startswith("--container-env=A,OVERSPILL_LAUNCH_TOKEN,") and words[-3:] == [
        "python",
        "-c",
        "print('$(x)')",
    ]
    done = subprocess.run(["sh", "-c", exports.removeprefix("export ") + '; printf %s "$APPTAINERENV_A"'],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout == HOSTILE
    with pytest.raises(ValueError, match="unknown container runtime"):
        container_command("docker-in-docker")
