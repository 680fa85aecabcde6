"""Attack: a job's `image` used as an option of `docker run` (`image="--privileged"`, `command=["-v", "/:/host",
...]`) would make the job root on its instance. The API refuses anything but an OCI image reference (422 naming
`image`), the start-up script refuses one too, and passes the image after `--`, which a real podman (the engine on
this machine, through a `docker` shim as the instances run it) accepts and runs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient

from providers.base import LaunchRequest
from providers.model import Tags
from providers.startup import startup_script
from tests.builders import job_body, offering, spec

HOSTILE_IMAGES = [
    "--privileged",
    "-v",
    "--volume=/:/host",
    "ghcr.io/acme/train:1.0 --privileged",
    "ghcr.io/acme/train:1.0\n--privileged",
    "ghcr.io/acme/train;id",
    "$(id)",
    "../../etc/passwd",
    "file:///etc/passwd",
    "Ghcr.io/acme/Train:1.0",
    "ghcr.io/acme/train:" + "x" * 129,
]


@pytest.mark.parametrize("image", HOSTILE_IMAGES)
def test_image_given_as_a_docker_option_is_refused_naming_image(client: TestClient, image: str) -> None:
    body = job_body(image=image, command=["-v", "/:/host", "ghcr.io/acme/train:1.0", "sh"])
    for route in ("/v1/jobs", "/v1/quotes"):
        answer = client.post(route, json=body)
        assert answer.status_code == 422, (route, image, answer.status_code, answer.text)
        assert answer.json()["message"].startswith("image:"), answer.json()["message"]


def test_valid_references_are_accepted(client: TestClient) -> None:
    for image in (
        "ghcr.io/acme/train:1.0",
        "localhost:5000/team/train@sha256:" + "a" * 64,
        "127.0.0.1:5055/test/deb-py:12",
        "ubuntu",
    ):
        answer = client.post("/v1/quotes", json=job_body(image=image))
        assert answer.status_code == 200, (image, answer.text)


def _request(image: str, command: tuple[str, ...]) -> LaunchRequest:
    return LaunchRequest(
        offering=offering(),
        launch_token="tok",
        tags=Tags("b", "job-1", "plc-1"),
        spec=spec(image=image, command=command, gpu_count=1),
        remaining_work_hours=Decimal("1"),
    )


def test_start_up_script_refuses_an_option_as_image() -> None:
    for image in ("--privileged", "-v", "a b"):
        with pytest.raises(ValueError):
            startup_script(_request(image, ("-v", "/:/host", "img", "sh")))


@pytest.fixture(scope="module")
def podman_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A one-binary image (the static `ldconfig`) in the machine's podman, and an environment whose `docker` is
    podman (the lab notes' configuration: runc, cgroupfs, no default ulimits)."""
    podman = shutil.which("podman")
    ldconfig = next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    if podman is None or ldconfig is None:
        pytest.skip("podman (apt-get install podman runc) and a static ldconfig are needed")
    work = tmp_path_factory.mktemp("podman")
    conf = work / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n')
    shim = work / "bin"
    shim.mkdir()
    (shim / "docker").write_text(f'#!/bin/sh\nexec {podman} "$@"\n')
    (shim / "docker").chmod(0o755)
    env = {**os.environ, "CONTAINERS_CONF": str(conf), "PATH": f"{shim}:{os.environ['PATH']}"}
    rootfs = work / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        tar.add(ldconfig, arcname="ldconfig")
    image = "localhost/overspill-attack-test:1"
    subprocess.run([podman, "import", str(rootfs), image], env=env, check=True, capture_output=True, timeout=120)
    yield image, env
    subprocess.run([podman, "rmi", "-f", image], env=env, capture_output=True, timeout=120)


@pytest.mark.integration
def test_image_goes_after_double_dash_and_real_podman_runs_it(podman_image: tuple[str, dict[str, str]]) -> None:
    image, env = podman_image
    script = startup_script(_request(image, ("/ldconfig", "--version")))
    pull = next(line for line in script.splitlines() if line.startswith("docker pull"))
    run = next(line for line in script.splitlines() if line.startswith("docker run"))
    assert shlex.split(pull) == ["docker", "pull", "--", image]
    argv = shlex.split(run)
    assert argv[argv.index("--") + 1] == image, "every option before `--`, the image right after it"
    assert all(not a.startswith("-") for a in argv[argv.index("--") + 1 : argv.index("--") + 2])
    done = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ldconfig" in done.stdout.lower(), done.stdout
    # the same construction with an option in the image's place: podman takes it as a (bad) image name
    hostile = run.replace(shlex.quote(image), "--privileged -v /:/host " + image)
    refused = subprocess.run(["bash", "-c", hostile], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "invalid reference format" in refused.stderr, refused.stderr
