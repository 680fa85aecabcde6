"""Attack: anyone could append to a tenant's audit log. A request naming a real key id with a wrong secret was
filed under that key's tenant, one row per request, with the raw `X-Request-ID` it sent. Now only verified callers
write to a tenant's log (with the sanitised request id); refused requests are counted per minute, address, route
and status in `audit_refused`, attributed to no tenant. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.api.auth import Role
from broker.runtime import Runtime
from broker.store.tables import AuditEntry
from tests.builders import job_body

HOSTILE_IDS = ["x" * 400, "id with spaces", "<script>alert(1)</script>", "é-unicode", "a\tb", "ok-id\u2028"]


def test_flood_naming_a_real_key_id_does_not_write_to_its_tenants_log(
    client: TestClient, rt: Runtime, key_for: Callable[[str, Role], dict[str, str]]
) -> None:
    admin = key_for("acme", Role.ADMIN)
    key_id = admin["Authorization"].split("_")[1]
    forged = {"Authorization": f"Bearer ovs_{key_id}_{'w' * 30}"}
    for i in range(40):
        rid = HOSTILE_IDS[i % len(HOSTILE_IDS)].encode("utf-8")
        answer = client.post("/v1/jobs", json=job_body(), headers={**forged, "X-Request-ID": rid})
        assert answer.status_code == 401
    for _ in range(5):
        assert client.delete("/v1/keys/abc", headers={"Authorization": ""}).status_code == 401
    items = client.get("/v1/audit", headers=admin).json()["items"]
    assert items == [], "nothing was written to acme's log"
    from broker.store.tables import AuditRefused

    with Session(rt.engine) as s:
        assert s.exec(select(AuditEntry)).all() == []
        refused = {(r.method, r.route, r.status): r.count for r in s.exec(select(AuditRefused)).all()}
    assert refused == {("POST", "/v1/jobs", 401): 40, ("DELETE", "/v1/keys/{key_id}", 401): 5}


def test_verified_requests_store_the_sanitised_request_id(
    client: TestClient, key_for: Callable[[str, Role], dict[str, str]]
) -> None:
    admin = key_for("acme", Role.ADMIN)
    for rid in HOSTILE_IDS:
        answer = client.post("/v1/keys", json={"role": "finance"}, headers={**admin, "X-Request-ID": rid.encode()})
        assert answer.status_code == 201
        assert answer.headers["X-Request-ID"].startswith("req-")
    client.post("/v1/keys", json={"role": "finance"}, headers={**admin, "X-Request-ID": "trace-42.a:b"})
    stored = [i["request_id"] for i in client.get("/v1/audit", headers=admin).json()["items"]]
    assert stored[0] == "trace-42.a:b", "a sane id is kept"
    assert all(r.startswith("req-") and len(r) == 36 for r in stored[1:]), stored
