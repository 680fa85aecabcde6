"""REST API for jobs: validation, auth and tenancy, idempotency, listing, cancel, events — on SQLite and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, func, select

from broker.api.auth import Role
from broker.runtime import Runtime
from broker.store.tables import Job
from tests.builders import job_body


def test_submit_returns_202_and_pending_job(client: TestClient) -> None:
    resp = client.post("/v1/jobs", json=job_body())
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["state"] == "pending"
    assert job["max_total_usd"] == "50"
    assert job["spent_usd"] == "0"
    assert job["work_hours"] == "2"
    assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"
    got = client.get(f"/v1/jobs/{job['id']}").json()
    assert got["id"] == job["id"] and got["spec"]["accelerators"] == ["A100"]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"gpu_count": -1}, "gpu_count"),  # 0 is a CPU job (tests/test_cpu_jobs.py)
        ({"max_total_usd": "-1"}, "max_total_usd"),
        ({"max_total_usd": "abc"}, "max_total_usd"),
        ({"accelerators": []}, "accelerators"),
        ({"team": "bad team!"}, "team"),
        ({"deadline": "2026-12-01T00:00:00"}, "deadline"),
        ({"surprise": 1}, "surprise"),
        ({"max_hourly_usd": "0"}, "max_hourly_usd"),
    ],
)
def test_validation_errors_name_the_field(client: TestClient, override: dict[str, object], field: str) -> None:
    resp = client.post("/v1/jobs", json=job_body(**override))
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert field in body["message"]
    assert resp.headers["content-type"] == "application/problem+json"
    assert field in body["detail"]
    assert any(e["field"].split(".")[0] == field and e["location"] == "body" for e in body["errors"]), body


def test_missing_required_field_is_named(client: TestClient) -> None:
    body = job_body()
    del body["max_total_usd"]
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422
    assert "max_total_usd" in resp.json()["message"]


def test_work_estimate_must_be_given_once(client: TestClient) -> None:
    resp = client.post("/v1/jobs", json=job_body(runtime_hours="3"))
    assert resp.status_code == 422
    assert "work_gpu_hours or runtime_hours" in resp.json()["message"]


def test_job_no_pool_could_ever_run_is_rejected(client: TestClient) -> None:
    resp = client.post("/v1/jobs", json=job_body(accelerators=["TPU-V5"]))
    assert resp.status_code == 422
    assert "accelerators" in resp.json()["message"]
    resp = client.post("/v1/jobs", json=job_body(gpu_count=64))
    assert resp.status_code == 422
    resp = client.post("/v1/jobs", json=job_body(allowed_providers=["nowhere"]))
    assert resp.status_code == 422


def test_past_deadline_rejected(client: TestClient) -> None:
    resp = client.post("/v1/jobs", json=job_body(deadline="2020-01-01T00:00:00Z"))
    assert resp.status_code == 422
    assert "deadline" in resp.json()["message"]


def test_auth_required_and_checked(client: TestClient) -> None:
    anon = {"Authorization": ""}
    resp = client.get("/v1/jobs", headers=anon)
    assert resp.status_code == 401 and "API key" in resp.json()["message"]
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    bad = {"Authorization": "Bearer ovs_devadmin_not-the-right-secret"}
    assert client.get("/v1/jobs", headers=bad).status_code == 401
    malformed = {"Authorization": "Bearer nonsense"}
    assert client.get("/v1/jobs", headers=malformed).status_code == 401


def test_finance_cannot_submit_or_read_jobs(client: TestClient, key_for: Callable[[str, Role], dict[str, str]]) -> None:
    finance = key_for("demo", Role.FINANCE)
    resp = client.post("/v1/jobs", json=job_body(), headers=finance)
    assert resp.status_code == 403
    assert "finance" in resp.json()["detail"]
    assert client.get("/v1/jobs", headers=finance).status_code == 403
    assert client.get("/v1/pools", headers=finance).status_code == 200


def test_other_tenant_gets_404(client: TestClient, key_for: Callable[[str, Role], dict[str, str]]) -> None:
    job = client.post("/v1/jobs", json=job_body()).json()
    other = key_for("globex", Role.ADMIN)
    for method, path in [
        ("GET", f"/v1/jobs/{job['id']}"),
        ("GET", f"/v1/jobs/{job['id']}/events"),
        ("POST", f"/v1/jobs/{job['id']}/cancel"),
    ]:
        assert client.request(method, path, headers=other).status_code == 404, path
    assert client.get("/v1/jobs", headers=other).json()["items"] == []
    assert client.get(f"/v1/jobs/{job['id']}").status_code == 200


def test_submitter_key_from_admin(client: TestClient) -> None:
    created = client.post("/v1/keys", json={"role": "submitter", "name": "ci"}).json()
    sub = {"Authorization": f"Bearer {created['key']}"}
    assert client.post("/v1/jobs", json=job_body(), headers=sub).status_code == 202
    assert client.post("/v1/keys", json={"role": "admin"}, headers=sub).status_code == 403


def test_idempotent_resubmission(client: TestClient, rt: Runtime) -> None:
    headers = {"Idempotency-Key": "run-42"}
    first = client.post("/v1/jobs", json=job_body(), headers=headers)
    again = client.post("/v1/jobs", json=job_body(), headers=headers)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"
    clash = client.post("/v1/jobs", json=job_body(gpu_count=2), headers=headers)
    assert clash.status_code == 409
    assert "Idempotency-Key" in clash.json()["message"]
    with Session(rt.engine) as session:
        assert session.exec(select(func.count()).select_from(Job)).one() == 1


def test_concurrent_retries_make_one_job(client: TestClient, rt: Runtime) -> None:
    def post(_: int) -> str:
        r = client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "same"})
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(post, range(16)))
    assert len(ids) == 1
    with Session(rt.engine) as session:
        assert session.exec(select(func.count()).select_from(Job)).one() == 1


def test_list_filters_and_cursor_pagination(client: TestClient) -> None:
    made = [client.post("/v1/jobs", json=job_body(name=f"j{i}", team="a" if i % 2 else "b")).json() for i in range(7)]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [j["id"] for j in reversed(made)]
    team_a = client.get("/v1/jobs", params={"team": "a"}).json()["items"]
    assert {j["name"] for j in team_a} == {"j1", "j3", "j5"}
    assert client.get("/v1/jobs", params={"state": "running"}).json()["items"] == []
    assert client.get("/v1/jobs", params={"state": "bogus"}).status_code == 422
    assert client.get("/v1/jobs", params={"cursor": "%%%"}).status_code == 422


def test_cancel_is_idempotent_and_recorded(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=job_body()).json()
    first = client.post(f"/v1/jobs/{job['id']}/cancel")
    second = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert first.status_code == second.status_code == 200
    assert second.json()["state"] == "cancelled"
    kinds = [e["kind"] for e in client.get(f"/v1/jobs/{job['id']}/events").json()["items"]]
    assert kinds == ["submitted", "cancelled"]


def test_update_changes_limits_and_records_each_change(client: TestClient, rt: Runtime) -> None:
    job = client.post("/v1/jobs", json=job_body(max_hourly_usd="9")).json()
    resp = client.patch(f"/v1/jobs/{job['id']}", json={"max_total_usd": "80", "max_hourly_usd": None, "priority": 5})
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert (got["max_total_usd"], got["state"]) == ("80", "pending")
    assert got["spec"]["max_hourly_usd"] is None and got["spec"]["priority"] == 5
    with Session(rt.engine) as s:
        stored = s.get(Job, job["id"])
        assert stored is not None
        assert (stored.max_total_usd, stored.max_hourly_usd, stored.priority) == (80, None, 5)
    [updated] = [e for e in client.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["kind"] == "updated"]
    assert "max_total_usd 50 -> 80" in updated["message"] and "priority 0 -> 5" in updated["message"]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({}, 422, "max_total_usd"),  # nothing to change: the message lists what may change
        ({"max_total_usd": None}, 422, "max_total_usd"),
        ({"max_total_usd": "-5"}, 422, "max_total_usd"),
        ({"deadline": "2020-01-01T00:00:00Z"}, 422, "deadline"),
        ({"deadline": "2030-01-01T00:00:00"}, 422, "deadline"),  # no time zone
        ({"gpu_count": 2}, 422, "gpu_count"),  # the job's shape is fixed at submission
        ({"priority": 5000}, 422, "priority"),
    ],
)
def test_update_refuses_bad_changes_naming_the_field(
    client: TestClient, body: dict[str, object], status: int, field: str
) -> None:
    job = client.post("/v1/jobs", json=job_body()).json()
    resp = client.patch(f"/v1/jobs/{job['id']}", json=body)
    assert resp.status_code == status, resp.text
    assert field in resp.json()["message"]
    assert client.get(f"/v1/jobs/{job['id']}").json()["max_total_usd"] == "50"


def test_update_of_an_ended_job_conflicts(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=job_body()).json()
    client.post(f"/v1/jobs/{job['id']}/cancel")
    resp = client.patch(f"/v1/jobs/{job['id']}", json={"max_total_usd": "80"})
    assert resp.status_code == 409 and "cancelled" in resp.json()["message"]


def test_body_size_limit(client: TestClient) -> None:
    resp = client.post("/v1/jobs", content=b"{" + b" " * 2_000_000 + b"}", headers={"Content-Type": "application/json"})
    assert resp.status_code == 413


def test_openapi_served(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "/v1/jobs" in spec["paths"] and "/v1/quotes" in spec["paths"]


def test_chunked_body_over_the_limit_is_refused(client: TestClient) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"name": "'
        for _ in range(30):
            yield b"x" * 50_000
        yield b'"}'

    resp = client.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["message"].startswith("body:")


def test_an_empty_idempotency_key_is_no_key(client: TestClient) -> None:
    """Found by the stateful fuzzing: an empty `Idempotency-Key` was stored as a key, so a second empty one
    collided with the first on the database's unique key (a 500). Empty means absent: two submissions, two jobs."""
    first = client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": ""})
    second = client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": ""})
    assert first.status_code == second.status_code == 202, (first.text, second.text)
    assert first.json()["id"] != second.json()["id"]
