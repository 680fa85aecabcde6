"""Budgets: CRUD and roles over the API, spend and month-end forecast, threshold alerts delivered once each by
webhook (a local HTTP server) and email (a real aiosmtpd SMTP server), and a spent hard budget that keeps new
placements waiting with the budget named."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.api.auth import Role, create_key
from broker.finance.budgets import forecast, month_window
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import BudgetAlertRow
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.finance_sinks import SmtpSink, WebhookSink
from tests.scripted import ScriptedCloud, admin_api, attach


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    with SmtpSink() as sink:
        yield sink


@pytest.fixture
def hook() -> Iterator[WebhookSink]:
    with WebhookSink() as sink:
        yield sink


@pytest.fixture
def cloud(clock: MovableClock) -> ScriptedCloud:
    return ScriptedCloud("scripted", clock)


@pytest.fixture
def srt(
    db_url: str, make_runtime: Callable[..., Runtime], cloud: ScriptedCloud, clock: MovableClock, smtp: SmtpSink
) -> Runtime:
    rt = make_runtime(
        db_url,
        simulated=False,
        wait_value_usd_per_gpu_hour=0.0,
        smtp_host="127.0.0.1",
        smtp_port=smtp.port,
        webhook_allowed_networks=["127.0.0.0/8"],  # the local receiver stands for a public one
    )
    attach(rt, cloud)
    tick(rt, clock())
    return rt


@pytest.fixture
def api(srt: Runtime) -> TestClient:
    return admin_api(srt)


@pytest.fixture
def key(srt: Runtime, clock: MovableClock) -> Callable[[str, Role], dict[str, str]]:
    def make(tenant: str, role: Role) -> dict[str, str]:
        return {"Authorization": f"Bearer {create_key(srt.engine, tenant=tenant, role=role, name='t', now=clock())}"}

    return make


def _run(rt: Runtime, clock: MovableClock, ticks: int) -> None:
    for _ in range(ticks):
        clock.advance(minutes=10)
        tick(rt, clock())


def test_budget_crud_roles_and_validation(api: TestClient, key: Callable[..., dict[str, str]]) -> None:
    finance = key("demo", Role.FINANCE)
    made = api.post(
        "/v1/budgets",
        json={"scope": "team", "name": "vision", "amount_usd": "1000", "thresholds": [80, 50, 100, 50]},
        headers=finance,
    )
    assert made.status_code == 201, made.text
    b = made.json()
    assert b["thresholds"] == [50, 80, 100] and b["period"] == "monthly" and b["hard"] is False
    assert (b["spent_usd"], b["forecast_usd"], b["fired"], b["amount_usd"]) == ("0", "0", [], "1000")
    assert set(b) >= {"id", "scope", "name", "period", "starts_at", "ends_at", "webhook_url", "email_to"}
    assert api.get(f"/v1/budgets/{b['id']}").json()["name"] == "vision"
    patched = api.patch(f"/v1/budgets/{b['id']}", json={"hard": True, "amount_usd": "500"}, headers=finance).json()
    assert (patched["hard"], patched["amount_usd"]) == (True, "500")
    assert [x["id"] for x in api.get("/v1/budgets", headers=finance).json()["items"]] == [b["id"]]

    assert api.get("/v1/budgets", headers=key("demo", Role.SUBMITTER)).status_code == 403
    assert api.post("/v1/budgets", json={}, headers=key("demo", Role.SUBMITTER)).status_code == 403
    other = key("other", Role.FINANCE)
    assert api.get(f"/v1/budgets/{b['id']}", headers=other).status_code == 404
    assert api.delete(f"/v1/budgets/{b['id']}", headers=other).status_code == 404
    assert api.get("/v1/budgets", headers=other).json()["items"] == []

    for body, field in [
        ({"scope": "org", "name": "x", "amount_usd": "1"}, "scope"),
        ({"scope": "team", "name": "x", "amount_usd": "-1"}, "amount_usd"),
        ({"scope": "team", "name": "x", "amount_usd": "1", "thresholds": [0]}, "thresholds"),
        ({"scope": "team", "name": "x", "amount_usd": "1", "email_to": ["nobody"]}, "email_to"),
        ({"scope": "team", "name": "x", "amount_usd": "1", "webhook_url": "ftp://x"}, "webhook_url"),
        ({"scope": "team", "name": "x", "amount_usd": "1", "period": "custom"}, "starts_at and ends_at"),
    ]:
        bad = api.post("/v1/budgets", json=body)
        assert bad.status_code == 422, body
        assert field in bad.json()["message"], bad.json()
    assert api.delete(f"/v1/budgets/{b['id']}", headers=finance).status_code == 204
    assert api.get(f"/v1/budgets/{b['id']}").status_code == 404


def test_thresholds_alert_once_each_by_webhook_and_email(
    srt: Runtime, api: TestClient, clock: MovableClock, hook: WebhookSink, smtp: SmtpSink
) -> None:
    b = api.post(
        "/v1/budgets",
        json={
            "scope": "project",
            "name": "atlas",
            "amount_usd": "30",
            "thresholds": [50, 80, 100],
            "webhook_url": hook.url + "/alerts",
            "email_to": ["finops@example.com"],
        },
    ).json()
    api.post("/v1/jobs", json=job_body(work_gpu_hours="5", max_total_usd="100"))  # $10/h on the scripted cloud
    tick(srt, clock())
    _run(srt, clock, 6)  # $10: nothing yet
    assert hook.requests == [] and smtp.messages == []
    _run(srt, clock, 3)  # $15: 50%
    assert [json.loads(r[2])["threshold"] for r in hook.requests] == [50]
    _run(srt, clock, 12)  # $35: 80% and 100%, once each, however many ticks pass
    _run(srt, clock, 6)
    payloads = [json.loads(r[2]) for r in hook.requests]
    assert [p["threshold"] for p in payloads] == [50, 80, 100]
    assert {p["budget_id"] for p in payloads} == {b["id"]} and all(r[0] == "/alerts" for r in hook.requests)
    assert Decimal(payloads[0]["spent_usd"]) >= Decimal("15")
    assert [m["Subject"] for m in smtp.messages] == [
        f"[overspill] project atlas: {t}% of its monthly budget reached" for t in (50, 80, 100)
    ]
    assert smtp.messages[0]["To"] == "finops@example.com"
    read = api.get(f"/v1/budgets/{b['id']}").json()
    assert read["fired"] == [50, 80, 100] and Decimal(read["spent_usd"]) >= Decimal("30")
    with Session(srt.engine) as s:
        alerts = s.exec(select(BudgetAlertRow)).all()
        assert len(alerts) == 3 and all(a.delivered_at is not None and a.attempts == 1 for a in alerts)


def test_failed_webhook_is_retried_not_refired(
    srt: Runtime, api: TestClient, clock: MovableClock, hook: WebhookSink
) -> None:
    hook.status = 500
    api.post(
        "/v1/budgets",
        json={"scope": "team", "name": "vision", "amount_usd": "5", "thresholds": [100], "webhook_url": hook.url},
    )
    api.post("/v1/jobs", json=job_body(work_gpu_hours="2", max_total_usd="100"))
    tick(srt, clock())
    _run(srt, clock, 4)
    assert len(hook.requests) >= 1
    with Session(srt.engine) as s:
        [alert] = s.exec(select(BudgetAlertRow)).all()
        assert alert.delivered_at is None and "500" in alert.last_error
    hook.status = 200
    _run(srt, clock, 2)
    with Session(srt.engine) as s:
        [alert] = s.exec(select(BudgetAlertRow)).all()
        assert alert.delivered_at is not None
    sent = len(hook.requests)
    _run(srt, clock, 3)
    assert len(hook.requests) == sent


def test_hard_budget_keeps_new_jobs_waiting_with_the_reason(
    srt: Runtime, api: TestClient, clock: MovableClock, cloud: ScriptedCloud
) -> None:
    budget = api.post(
        "/v1/budgets", json={"scope": "team", "name": "vision", "amount_usd": "10", "hard": True, "thresholds": []}
    ).json()
    first = api.post("/v1/jobs", json=job_body(work_gpu_hours="2", max_total_usd="100")).json()["id"]
    tick(srt, clock())
    _run(srt, clock, 13)  # the first job ran 2 h: $20 spent, the budget is over
    assert api.get(f"/v1/jobs/{first}").json()["state"] == "succeeded"
    second = api.post("/v1/jobs", json=job_body(work_gpu_hours="1", max_total_usd="100")).json()["id"]
    other_team = api.post("/v1/jobs", json=job_body(team="nlp", work_gpu_hours="1", max_total_usd="100")).json()["id"]
    _run(srt, clock, 2)
    job = api.get(f"/v1/jobs/{second}").json()
    assert job["state"] == "pending" and job["placement"] is None
    assert job["wait_reason"].startswith("budget_exhausted") and budget["id"] in job["wait_reason"]
    assert api.get(f"/v1/jobs/{other_team}").json()["state"] in ("running", "succeeded")
    api.patch(f"/v1/budgets/{budget['id']}", json={"amount_usd": "100"})  # raised: it may burst again
    _run(srt, clock, 1)
    assert api.get(f"/v1/jobs/{second}").json()["state"] in ("starting", "running")  # placed: no longer held back


def test_forecast_is_linear_on_the_month_to_date_run_rate(clock: MovableClock) -> None:
    start, end = month_window(clock())
    assert (start.day, end.month) == (1, 12)
    ten_days = start.replace(day=11)
    assert forecast(Decimal("100"), start, end, ten_days) == Decimal("300.00")  # November has 30 days
    assert forecast(Decimal("100"), start, end, end) == Decimal("100")
