"""CPU jobs are jobs: `gpu_count: 0` with `cpus` and `runtime_hours` is accepted (accelerators default to the local
pool's CPU slots), an image may be left out for the process runtime, and the broker places such a job on the local
pool's CPU slots and boots it with a spec that asks the agent for no GPU. Refusals name the field."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from agent import protocol as proto
from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import Placement
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.local_pool_harness import kill_under

CPU_JOB = {"gpu_count": 0, "cpus": 2, "runtime_hours": "0.5", "work_gpu_hours": None, "accelerators": []}


@pytest.fixture
def local_rt(db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, tmp_path) -> Iterator[Runtime]:
    rt = make_runtime(db_url, local_pool=True, local_pool_slots=4, simulated=False)
    try:
        yield rt
    finally:
        kill_under(tmp_path / "pool")


@pytest.fixture
def api(local_rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=local_rt)) as c:
        c.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
        yield c


def _cpu(**more: object) -> dict[str, object]:
    body = job_body(**CPU_JOB, **more)
    return {k: v for k, v in body.items() if v is not None and k not in ("image",)}


def test_a_cpu_job_without_image_is_accepted_and_runs_on_cpu_slots(api: TestClient, local_rt: Runtime, clock) -> None:
    resp = api.post("/v1/jobs", json=_cpu(allowed_providers=["local"], command=["true"]))
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["spec"]["accelerators"] == ["CPU"] and job["spec"]["gpu_count"] == 0 and job["spec"]["image"] == ""
    tick(local_rt, clock())
    with Session(local_rt.engine) as session:
        p = session.exec(select(Placement).where(Placement.job_id == job["id"])).one()
    assert p.provider == "local" and p.instance_type == "cpu-2", p  # the smallest pool with 2 CPUs
    assert p.user_data is not None and "systemd-run" not in p.user_data  # several attempts share the host
    events = api.get(f"/v1/jobs/{job['id']}/events").json()["items"]
    written = next(e for e in events if e["kind"] == "attempt_spec_written")
    assert written["data"]["runtime"] == proto.Runtime.PROCESS.value


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cpus": 0}, "cpus"),
        ({"work_gpu_hours": "1", "runtime_hours": None}, "work_gpu_hours"),
    ],
)
def test_cpu_job_refusals_name_the_field(api: TestClient, change: dict[str, object], field: str) -> None:
    body = {**_cpu(), **change}
    resp = api.post("/v1/jobs", json={k: v for k, v in body.items() if v is not None})
    assert resp.status_code == 422, resp.text
    assert any(e["field"].split(".")[0] == field for e in resp.json()["errors"]), resp.json()


def test_a_gpu_job_still_names_its_accelerators(api: TestClient) -> None:
    body = job_body()
    del body["accelerators"]
    resp = api.post("/v1/jobs", json=body)
    assert resp.status_code == 422 and any(e["field"] == "accelerators" for e in resp.json()["errors"]), resp.text


def test_a_container_runtime_refuses_a_job_without_image(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, tmp_path
) -> None:
    rt = make_runtime(db_url, local_pool=True, local_pool_slots=2, simulated=False, agent_runtime={"local": "podman"})
    try:
        with TestClient(create_app(runtime=rt)) as c:
            c.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
            job = c.post("/v1/jobs", json=_cpu(allowed_providers=["local"])).json()
            tick(rt, clock())
            got = c.get(f"/v1/jobs/{job['id']}").json()
        assert got["state"] == "paused", got
        assert "image" in got["wait_reason"] and "podman" in got["wait_reason"], got
    finally:
        kill_under(tmp_path / "pool")
