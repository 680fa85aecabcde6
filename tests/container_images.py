"""Real container images for the agent's podman tests, built without a public registry (lab-notes-3.md):
podman + runc with a containers.conf that suits this kind of machine, a Debian bookworm rootfs made by mmdebstrap
(minbase + python3-numpy), `podman import`ed, and the training workload copied in by `podman build`.

The rootfs tarball (~110 s to make, ~270 MB) is cached under `$OVERSPILL_TEST_IMAGES` (default
/var/tmp/overspill-test-images) keyed by a hash of what goes into it, so CI builds it once per run and a developer
once; the imported base and the app image (~15 s) are tagged with that hash and the workload's hash in podman's
store, so later sessions reuse them. `podman_ready()` says why podman cannot be used here, or None.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from tests.agent_harness import TRAIN

CACHE = Path(os.environ.get("OVERSPILL_TEST_IMAGES", "/var/tmp/overspill-test-images"))
PACKAGES = ("python3", "python3-numpy")
SUITE = "bookworm"
CONTAINERS_CONF = """[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""


def podman_ready() -> str | None:
    for tool in ("podman", "runc", "mmdebstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman runc mmdebstrap docker-registry apache2-utils)"
    return None


def containers_conf() -> Path:
    """The containers.conf every podman call of the tests uses (via CONTAINERS_CONF)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / "containers.conf"
    if not path.exists() or path.read_text() != CONTAINERS_CONF:
        path.write_text(CONTAINERS_CONF)
    return path


def podman(*args: str, check: bool = True, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "CONTAINERS_CONF": str(containers_conf()), **(env or {})}
    done = subprocess.run(["podman", *args], capture_output=True, text=True, env=full, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout.strip()


def _exists(image: str) -> bool:
    env = {**os.environ, "CONTAINERS_CONF": str(containers_conf())}
    return subprocess.run(["podman", "image", "exists", image], env=env, capture_output=True).returncode == 0


def base_image() -> str:
    """localhost/overspill-test/deb-py-numpy:<hash>, built (or found) once."""
    key = hashlib.sha256(f"{SUITE} minbase {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
    image = f"localhost/overspill-test/deb-py-numpy:{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time across test processes
        if _exists(image):
            return image
        tarball = CACHE / f"rootfs-{key}.tar"
        if tarball.is_dir():  # left by an older version of this helper, which let mmdebstrap pick a directory
            shutil.rmtree(tarball)
        if not tarball.exists():
            partial = CACHE / f"rootfs-{key}.partial.tar"
            # --format=tar: mmdebstrap otherwise guesses the format from the name, and makes a directory of any
            # name it does not know
            subprocess.run(
                ["mmdebstrap", "--variant=minbase", "--format=tar", f"--include={','.join(PACKAGES)}", SUITE,
                 str(partial)],
                check=True, capture_output=True, timeout=1800,
            )  # fmt: skip
            partial.rename(tarball)
        podman("import", "--change", 'CMD ["/bin/bash"]', str(tarball), image)
    return image


def train_image() -> str:
    """localhost/overspill-test/train:<hash>: the base with tests/workloads/train.py at /app/train.py."""
    base = base_image()
    key = hashlib.sha256(base.encode() + TRAIN.read_bytes()).hexdigest()[:12]
    image = f"localhost/overspill-test/train:{key}"
    if _exists(image):
        return image
    context = CACHE / f"context-{key}"
    context.mkdir(parents=True, exist_ok=True)
    shutil.copy(TRAIN, context / "train.py")
    (context / "Containerfile").write_text(f"FROM {base}\nCOPY train.py /app/train.py\n")
    podman("build", "-q", "-t", image, str(context))
    return image


def examples_image() -> str:
    """localhost/overspill-test/examples:<hash>: the base with the repository's examples/ at /app/examples and
    PYTHONPATH=/app, so `python3 -m examples.train_numpy` runs the example training job in it."""
    base = base_image()
    source = Path(__file__).resolve().parent.parent / "examples"
    files = sorted(p for p in source.iterdir() if p.suffix == ".py")
    digest = hashlib.sha256(base.encode())
    for path in files:
        digest.update(path.name.encode() + path.read_bytes())
    image = f"localhost/overspill-test/examples:{digest.hexdigest()[:12]}"
    if _exists(image):
        return image
    context = CACHE / f"context-examples-{digest.hexdigest()[:12]}"
    (context / "examples").mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copy(path, context / "examples" / path.name)
    (context / "Containerfile").write_text(f"FROM {base}\nCOPY examples /app/examples\nENV PYTHONPATH=/app\n")
    podman("build", "-q", "-t", image, str(context))
    return image
