"""Audit log: every state-changing request of a verified caller (refused ones included) is recorded with who, what,
when and from where; admins read their own tenant's entries, newest first, page by page; nothing secret is stored.
Requests with no valid key are only counted (audit_refused), never in a tenant's log."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.api.auth import Role
from broker.store.tables import AuditEntry, AuditRefused
from tests.builders import job_body


def test_state_changing_requests_are_audited_and_readable_by_admins_of_the_tenant(
    client: TestClient, key_for: Callable[[str, Role], dict[str, str]]
) -> None:
    a_admin = key_for("acme", Role.ADMIN)
    a_sub = key_for("acme", Role.SUBMITTER)
    b_admin = key_for("globex", Role.ADMIN)
    sub_key = a_sub["Authorization"].split()[1]
    sub_id = sub_key.split("_")[1]

    made = client.post("/v1/jobs", json=job_body(), headers={**a_sub, "X-Request-ID": "req-42"})
    assert made.status_code == 202
    job_id = made.json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=a_sub).status_code == 200
    assert client.post("/v1/jobs", json={"name": ""}, headers=a_sub).status_code == 422
    assert client.post("/v1/keys", json={"role": "admin"}, headers=a_sub).status_code == 403
    wrong = f"ovs_{sub_id}_{'x' * 30}"  # a real key id with a wrong secret
    assert client.post("/v1/jobs", json=job_body(), headers={"Authorization": f"Bearer {wrong}"}).status_code == 401
    assert client.get("/v1/jobs", headers=a_sub).status_code == 200  # reads are not audited
    client.post("/v1/jobs", json=job_body(), headers=b_admin)

    page = client.get("/v1/audit", headers=a_admin)
    assert page.status_code == 200
    items = page.json()["items"]
    seen = [(i["method"], i["route"], i["status"], i["key_id"], i["role"]) for i in items]
    assert seen == [  # the refused key (401) is not in any tenant's log: it is counted in audit_refused
        ("POST", "/v1/keys", 403, sub_id, "submitter"),
        ("POST", "/v1/jobs", 422, sub_id, "submitter"),
        ("POST", "/v1/jobs/{job_id}/cancel", 200, sub_id, "submitter"),
        ("POST", "/v1/jobs", 202, sub_id, "submitter"),
    ], seen
    first = items[-1]
    assert first["path"] == "/v1/jobs" and first["request_id"] == "req-42" and first["client"] == "testclient"
    assert items[-2]["path"] == f"/v1/jobs/{job_id}/cancel"
    assert all(i["method"] != "GET" for i in items)

    assert client.get("/v1/audit", headers=a_sub).status_code == 403, "admins only"
    b_items = client.get("/v1/audit", headers=b_admin).json()["items"]
    assert [i["status"] for i in b_items] == [202], "another tenant sees only its own"

    first_page = client.get("/v1/audit", params={"limit": 2}, headers=a_admin).json()
    second = client.get("/v1/audit", params={"limit": 2, "cursor": first_page["next_cursor"]}, headers=a_admin).json()
    assert [i["id"] for i in first_page["items"] + second["items"]] == [i["id"] for i in items[:4]]
    with Session(client.app.state.runtime.engine) as s:  # type: ignore[attr-defined]
        refused = s.exec(select(AuditRefused)).all()
    assert [(r.method, r.route, r.status, r.count) for r in refused] == [("POST", "/v1/jobs", 401, 1)]
    bad = client.get("/v1/audit", params={"cursor": "x1"}, headers=a_admin)
    assert bad.status_code == 422 and "cursor" in bad.json()["message"]


def test_audit_rows_hold_no_secret(client: TestClient, key_for: Callable[[str, Role], dict[str, str]]) -> None:
    admin = key_for("acme", Role.ADMIN)
    created = client.post("/v1/keys", json={"role": "submitter", "name": "ci"}, headers=admin).json()
    with Session(client.app.state.runtime.engine) as s:  # type: ignore[attr-defined]
        rows = s.exec(select(AuditEntry)).all()
    text = " ".join(repr(r) for r in rows)
    assert rows and created["key"] not in text and admin["Authorization"].split()[1] not in text
    assert created["key"].split("_", 2)[2] not in text


def test_a_submitted_job_and_its_audit_row_commit_in_one_transaction(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POST /v1/jobs writes its audit row with the job (one row, one transaction): if the row cannot be written
    the job is not stored either; a replay with the same Idempotency-Key stores no job and is audited once."""
    import broker.api.routes.jobs as jobs_route
    from broker.store.tables import Job

    engine = client.app.state.runtime.engine  # type: ignore[attr-defined]
    made = client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "k1"})
    assert made.status_code == 202
    replay = client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "k1"})
    assert replay.json()["id"] == made.json()["id"] and replay.headers["Idempotent-Replayed"] == "true"
    with Session(engine) as s:
        assert [(r.route, r.status) for r in s.exec(select(AuditEntry)).all()] == [("/v1/jobs", 202)] * 2
        assert len(s.exec(select(Job)).all()) == 1

    real = jobs_route.entry_row
    monkeypatch.setattr(jobs_route, "entry_row", lambda *a: {**(real(*a) or {}), "status": None})  # NOT NULL
    broken = TestClient(client.app, raise_server_exceptions=False)
    assert broken.post("/v1/jobs", json=job_body(), headers=dict(client.headers)).status_code == 500
    with Session(engine) as s:
        assert len(s.exec(select(Job)).all()) == 1, "the job rolled back with its audit row"
