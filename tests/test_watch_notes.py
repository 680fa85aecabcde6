"""Feedback while a job waits, on the embedded simulated market (issue 31, points 7 and 8):
- a job `pending` or `starting` always has a note; a starting one names its pool, when its launch was requested
  and, once the pool has a measured launch time, when it is expected to be ready;
- `GET /v1/jobs/{id}/attempts` lists the job's placements, numbered from 1, tenant-scoped, in the OpenAPI document;
- `overspill logs` on a job whose pool runs no agent says why and exits 1; `overspill logs -f` on a job not yet
  placed prints why it waits and ends once the job is over; `overspill attempts` and `overspill status` show them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from broker.api.auth import Role
from broker.cli import watch
from broker.cli.main import app
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import tick
from broker.runtime import Runtime
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.test_cli import server  # noqa: F401  (fixture)

SPOT = {"allowed_providers": ["sim-gcp"], "allowed_regions": ["us-central1"]}
runner = CliRunner()


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _hms(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%SZ")


def _run_until_started(client: TestClient, rt: Runtime, clock: MovableClock, job_id: str) -> dict:
    for _ in range(60):
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] != "starting":
            return job
        assert job["wait_reason"], "a starting job always has a note"
        clock.advance(seconds=15)
        tick(rt, clock())
    raise AssertionError("the simulated launch never finished")


def test_a_waiting_job_always_says_why_and_when_it_should_be_ready(
    client: TestClient, rt: Runtime, clock: MovableClock
) -> None:
    first = client.post("/v1/jobs", json=job_body(**SPOT)).json()
    assert first["state"] == "pending" and first["wait_reason"] == "waiting for the next placement round"
    tick(rt, clock())
    job = client.get(f"/v1/jobs/{first['id']}").json()
    assert job["state"] == "starting", job
    pool = job["placement"]["offering_key"]
    requested = _at(job["placement"]["created_at"])
    assert job["wait_reason"] == f"launch requested on {pool} at {_hms(requested)}; no launch on this pool measured yet"
    listed = client.get("/v1/jobs").json()["items"]
    assert listed[0]["wait_reason"] == job["wait_reason"], "the list shows the same note"
    job = _run_until_started(client, rt, clock, first["id"])
    assert job["state"] == "running"
    took = _at(job["placement"]["started_at"]) - requested
    assert took > timedelta(0), "the simulated spot pool takes a while to launch"
    client.post(f"/v1/jobs/{first['id']}/cancel")
    tick(rt, clock())
    # the next job on that pool is told when to expect it, from the launch the broker measured there
    second = client.post("/v1/jobs", json=job_body(**SPOT)).json()
    tick(rt, clock())
    job = client.get(f"/v1/jobs/{second['id']}").json()
    assert job["state"] == "starting" and job["placement"]["offering_key"] == pool
    requested = _at(job["placement"]["created_at"])
    assert job["wait_reason"].startswith(f"launch requested on {pool} at {_hms(requested)}; expected ready by ")
    assert _hms(requested + took) in job["wait_reason"] and "launch on this pool" in job["wait_reason"]
    # past the expected time it says it is overdue
    clock.advance(seconds=took.total_seconds() + 1)
    late = client.get(f"/v1/jobs/{second['id']}").json()
    if late["state"] == "starting":
        assert "overdue: expected ready by" in late["wait_reason"]


def test_attempts_lists_the_placements_of_the_callers_job_only(
    client: TestClient, rt: Runtime, clock: MovableClock, key_for: Callable[[str, Role], dict[str, str]]
) -> None:
    job = client.post("/v1/jobs", json=job_body(**SPOT)).json()
    assert client.get(f"/v1/jobs/{job['id']}/attempts").json() == {"items": [], "next_cursor": None}
    tick(rt, clock())
    _run_until_started(client, rt, clock, job["id"])
    client.post(f"/v1/jobs/{job['id']}/cancel")
    tick(rt, clock())
    [a] = client.get(f"/v1/jobs/{job['id']}/attempts").json()["items"]
    placement = client.get(f"/v1/jobs/{job['id']}").json()["placement"]
    assert a["number"] == 1 and a["placement_id"] == placement["id"] and a["pool"] == placement["offering_key"]
    assert a["started_at"] and a["ended_at"] and a["state"] != "running" and a["end_reason"].startswith(a["state"])
    assert a["has_log"] is False, "the simulated market runs no agent"
    other = key_for("other-tenant", Role.SUBMITTER)
    assert client.get(f"/v1/jobs/{job['id']}/attempts", headers=other).status_code == 404
    assert "jobs.attempts" in str(client.get("/openapi.json").json()["paths"]["/v1/jobs/{job_id}/attempts"])
    # the logs route takes an attempt number; one the job does not have is a 404 naming the parameter
    missing = client.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": "2"})
    assert missing.status_code == 404 and missing.json()["errors"][0]["field"] == "attempt"


@pytest.fixture
def env(server: str) -> Iterator[dict[str, str]]:  # noqa: F811
    yield {"OVERSPILL_URL": server, "OVERSPILL_API_KEY": DEV_API_KEY}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_logs_of_a_job_without_an_agent_says_why(
    env: dict[str, str], client: TestClient, rt: Runtime, clock: MovableClock
) -> None:
    job = client.post("/v1/jobs", json=job_body(**SPOT)).json()
    early = runner.invoke(app, ["logs", job["id"]], env=env)
    assert early.exit_code == 0 and "is pending: waiting for the next placement round" in early.stderr
    assert "logs -f` waits for it" in early.stderr
    tick(rt, clock())
    out = runner.invoke(app, ["logs", job["id"]], env=env)
    assert out.exit_code == 1, out.output
    assert out.stdout == "" and "run no Overspill agent" in out.stderr and "attempt 1 ran on sim-gcp/" in out.stderr
    numbered = runner.invoke(app, ["logs", job["id"], "--attempt", "1"], env=env)
    assert numbered.exit_code == 1 and "run no Overspill agent" in numbered.stderr
    unknown = runner.invoke(app, ["logs", job["id"], "--attempt", "3"], env=env)
    assert unknown.exit_code == 1 and "no attempt '3'" in unknown.stderr
    listed = runner.invoke(app, ["attempts", job["id"]], env={**env, "COLUMNS": "200"})
    assert listed.exit_code == 0 and "sim-gcp/us-central1-" in listed.stdout and "launching" in listed.stdout
    status = runner.invoke(app, ["status", job["id"]], env={**env, "COLUMNS": "200"})
    assert status.exit_code == 0 and "starting" in status.stdout and "launch requested on" in status.stdout
    assert "not reported" in status.stdout


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_logs_follow_waits_for_the_placement_and_ends_with_the_job(
    env: dict[str, str], client: TestClient, rt: Runtime, clock: MovableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch, "POLL_SECONDS", 0.05)
    job = client.post("/v1/jobs", json=job_body(**SPOT)).json()
    results: list[object] = []
    follower = threading.Thread(target=lambda: results.append(runner.invoke(app, ["logs", job["id"], "-f"], env=env)))
    follower.start()
    time.sleep(1.0)
    assert follower.is_alive(), "logs -f does not stop while the job waits to be placed"
    tick(rt, clock())
    time.sleep(0.5)
    assert follower.is_alive()
    client.post(f"/v1/jobs/{job['id']}/cancel")
    follower.join(timeout=30)
    assert not follower.is_alive(), "logs -f ends once the job is over"
    [out] = results
    assert out.exit_code == 0, out.output  # type: ignore[attr-defined]
    said = out.stderr  # type: ignore[attr-defined]
    assert f"job {job['id']} is pending: waiting for the next placement round" in said
    assert f"job {job['id']} is starting: launch requested on sim-gcp/" in said
    assert "attempt 1 ran on sim-gcp/" in said and "run no Overspill agent" in said
    assert said.rstrip().endswith(f"==> job {job['id']} cancelled <==")
