"""Attack: a job's `image` used as an option of `docker run` (`image="--privileged"`, `command=["-v", "/:/host",
...]`) would make the job root on its instance. The API refuses anything but an OCI image reference (422 naming
`image`), and the attempt's spec refuses one too (the start-up script holds no image at all: the agent reads it from the
spec and hands it to the container runtime as one argument, never through a shell).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.builders import job_body, spec

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


def _build(image: str) -> object:
    from broker.agent_side.attempt_spec import build_spec
    from broker.config.settings import Settings

    return build_spec(
        Settings(),
        spec(image=image, command=("-v", "/:/host", "img", "sh"), gpu_count=1),
        job_id="job-1",
        placement_id="plc-1",
        provider_name="aws",
        provider=object(),
        checkpoint_uri="s3://b/tenants/demo/jobs/job-1/checkpoint/",
        resume=False,
        attempt_prefix="s3://b/tenants/demo/jobs/job-1/attempts/plc-1/",
        mailbox_uri="s3://b/tenants/demo/mailbox/",
    )


def test_attempt_spec_refuses_an_option_as_image() -> None:
    """A job row stored before the API validated images (or written by hand) is refused again when its attempt's
    spec is built: the agent never receives `--privileged` as an image (the launch loop then pauses the job)."""
    for image in ("--privileged", "-v", "a b", "ghcr.io/acme/train;id"):
        with pytest.raises(ValueError, match=r"^image: "):
            _build(image)
    assert _build("ghcr.io/acme/train:1.0").image == "ghcr.io/acme/train:1.0"  # type: ignore[attr-defined]
