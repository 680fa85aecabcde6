"""Tenant isolation, generated from the route table: every /v1 route, including ones added later, is called with
another tenant's admin key against tenant A's resources, and must never answer 2xx with A's data.

How it works: tenant A gets a job (placed, so it has a placement and events) whose name carries a marker. For each
route and method, path parameters are filled from `RESOURCES` (A's ids); a route with a path parameter that has no
entry there FAILS the test, so whoever adds `/v1/things/{thing_id}` must say how to make an A-owned thing. Then:
- with B's admin key: any route with A's ids in its path answers 404 (403 for role, 401/422 where the route takes
  an instance's callback token instead of an API key), and no answer of any route, listing ones included, contains
  A's marker or ids;
- A's own key reads A's resources (GET routes answer 200): the ids are real, the 404s mean isolation;
- A's job is unchanged after everything B tried.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.api.auth import Role
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import ApiKey, Job, Placement
from tests.builders import job_body
from tests.conftest import MovableClock

MARKER = "tenant-a-private-7f3c"

# path parameter -> how to get the id of an A-owned resource, given A's seeded ids
RESOURCES: dict[str, Callable[[dict[str, str]], str]] = {
    "job_id": lambda ids: ids["job"],
    "placement_id": lambda ids: ids["placement"],
    "budget_id": lambda ids: ids["budget"],
    "schedule_id": lambda ids: ids["schedule"],
    "run_id": lambda ids: ids["run"],
    "import_id": lambda ids: ids["bill"],
    "key_id": lambda ids: ids["key"],
}
FOCUS_SAMPLE = Path(__file__).parent / "fixtures" / "aws_focus_1_0_sample.csv"
# routes that authenticate an instance's per-placement callback token instead of an API key
CALLBACK_ROUTES = {
    "/v1/placements/{placement_id}/exit",
    "/v1/placements/{placement_id}/scheduled-events",
    "/v1/placements/{placement_id}/reports",
}
# a body per route that takes one, so the call reaches the ownership check instead of stopping at validation
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/placements/{placement_id}/exit"): {"exit_code": 0},
    ("POST", "/v1/placements/{placement_id}/reports"): {"placement_id": "x", "seq": 1, "kind": "final", "at": "now"},
    ("POST", "/v1/placements/{placement_id}/scheduled-events"): {"DocumentIncarnation": 1, "Events": []},
    ("POST", "/v1/jobs"): job_body(name="b-job"),
    ("POST", "/v1/quotes"): job_body(name="b-quote"),
    ("POST", "/v1/keys"): {"role": "submitter", "name": "b"},
    ("PATCH", "/v1/budgets/{budget_id}"): {"amount_usd": "1"},
    ("PATCH", "/v1/jobs/{job_id}"): {"max_total_usd": "1"},
    ("PATCH", "/v1/report-schedules/{schedule_id}"): {"name": "b"},
}


def _seed(rt: Runtime, client: TestClient, a_admin: dict[str, str], clock: MovableClock) -> dict[str, str]:
    job = client.post("/v1/jobs", json=job_body(name=MARKER, team="a-team"), headers=a_admin).json()
    tick(rt, clock.advance(minutes=1))
    with Session(rt.engine) as s:
        placement = s.exec(select(Placement).where(Placement.job_id == job["id"])).first()
    assert placement is not None, "A's job was placed"
    budget = client.post(
        "/v1/budgets", json={"scope": "team", "name": MARKER, "amount_usd": "100"}, headers=a_admin
    ).json()
    schedule = client.post("/v1/report-schedules", json={"name": MARKER, "cron": "0 6 1 * *"}, headers=a_admin).json()
    run = client.post("/v1/report-runs", json={"period": "2026-11", "format": "csv"}, headers=a_admin).json()
    bill = client.post("/v1/costs/bills?filename=a.csv", content=FOCUS_SAMPLE.read_bytes(), headers=a_admin).json()
    key = client.post("/v1/keys", json={"role": "submitter", "name": MARKER}, headers=a_admin).json()
    return {
        "key": key["id"],
        "job": job["id"],
        "placement": placement.id,
        "budget": budget["id"],
        "schedule": schedule["id"],
        "run": run["id"],
        "bill": bill["id"],
    }


def _walk(routes: list[Any], prefix: str = "") -> list[tuple[str, APIRoute]]:
    """Every APIRoute in a route table, through included routers (FastAPI >= 0.16x nests them)."""
    out: list[tuple[str, APIRoute]] = []
    for route in routes:
        if isinstance(route, APIRoute):
            out.append((prefix + route.path, route))
            continue
        inner = getattr(route, "original_router", None)
        if inner is not None:
            context = getattr(route, "include_context", None)
            out.extend(_walk(list(inner.routes), prefix + str(getattr(context, "prefix", "") or "")))
        elif hasattr(route, "routes"):
            out.extend(_walk(list(route.routes), prefix + str(getattr(route, "path", "") or "")))
    return out


def _v1_routes(client: TestClient) -> list[tuple[str, str]]:
    app = client.app
    out = sorted(
        {
            (method, path)
            for path, route in _walk(list(app.routes))
            for method in route.methods
            if path.startswith("/v1/")
        }  # type: ignore[attr-defined]
    )
    served = {
        (method.upper(), path)
        for path, ops in app.openapi()["paths"].items()  # type: ignore[attr-defined]
        for method in ops
        if path.startswith("/v1/")
    }
    assert served <= set(out), f"routes in the OpenAPI document the walk missed: {served - set(out)}"
    assert len(out) >= 10, "the route table lists the API"
    return out


def _fill(path: str, ids: dict[str, str]) -> str:
    params = re.findall(r"{(\w+)(?::\w+)?}", path)
    missing = [p for p in params if p not in RESOURCES]
    assert not missing, (
        f"route {path} has path parameter(s) {missing} with no A-owned resource registered: add them to "
        "RESOURCES in tests/test_isolation_routes.py so tenant isolation is checked for this route"
    )
    for p in params:
        path = re.sub(r"{" + p + r"(?::\w+)?}", RESOURCES[p](ids), path)
    return path


def test_no_route_shows_or_touches_another_tenants_data(
    rt: Runtime, client: TestClient, key_for: Callable[[str, Role], dict[str, str]], clock: MovableClock
) -> None:
    a_admin = key_for("acme", Role.ADMIN)
    b_admin = key_for("globex", Role.ADMIN)
    ids = _seed(rt, client, a_admin, clock)
    with Session(rt.engine) as s:
        before = s.get(Job, ids["job"])
    assert before is not None
    secrets = (MARKER, *ids.values())
    checked = []
    sent: set[str] = set()
    for method, template in _v1_routes(client):
        path = _fill(template, ids)
        has_params = path != template
        body = BODIES.get((method, template))
        answer = client.request(method, path, headers=b_admin, json=body)
        sent |= {s for s in secrets if s in path}
        # a 404 may echo what B sent, and B's own audit log lists the paths B sent: neither is A's data
        leaked = [s for s in secrets if s in answer.text and s not in sent]
        assert not leaked, f"{method} {template} as tenant B answered {answer.status_code} with A's {leaked}"
        if has_params:
            allowed = {401, 403, 422} if template in CALLBACK_ROUTES else {403, 404}
            assert answer.status_code in allowed, f"{method} {template} as tenant B: {answer.status_code} {answer.text}"
            if method == "GET":
                own = client.request(method, path, headers=a_admin)
                assert own.status_code == 200, f"{method} {template} as tenant A: {own.status_code} {own.text}"
        checked.append(f"{method} {template} -> {answer.status_code}")
    with Session(rt.engine) as s:
        after = s.get(Job, ids["job"])
    assert after is not None and after.state == before.state and after.state != "cancelled"
    assert (after.max_total_usd, after.spec) == (before.max_total_usd, before.spec)
    assert any("{job_id}" in c for c in checked) and any("{placement_id}" in c for c in checked)
    assert any("DELETE /v1/keys/{key_id}" in c for c in checked)
    with Session(rt.engine) as s:
        a_key = s.get(ApiKey, ids["key"])
    assert a_key is not None and a_key.revoked_at is None, "B could not revoke A's key"
