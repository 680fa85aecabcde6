"""SSRF from the finance role: report-run and budget webhooks aimed at the broker's own network (loopback, the
cloud metadata address, private ranges, a host name that resolves inside), the answer body echoed back, and
webhook URLs (which carry tokens) written out in full. The internal target is a real HTTP service on a local
address that records whatever reaches it."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.finance.budgets import check_budgets
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import BudgetAlertRow
from tests.attacks.finance_parts import InternalService, finance_client
from tests.conftest import MovableClock
from tests.finance_data import seed_ledger

NOV = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def srt(tmp_path: Any, make_runtime: Callable[..., Runtime]) -> Runtime:
    """The broker as shipped: no private network opened for webhooks."""
    return make_runtime(f"sqlite:///{tmp_path / 'ssrf.db'}", simulated=False)


@pytest.fixture
def opened(tmp_path: Any, make_runtime: Callable[..., Runtime]) -> Runtime:
    """An operator opened 127.0.0.0/8 (its receiver runs there): the address check passes, the other rules hold."""
    return make_runtime(
        f"sqlite:///{tmp_path / 'opened.db'}", simulated=False, webhook_allowed_networks=["127.0.0.0/8"]
    )


@pytest.fixture
def internal() -> Iterator[InternalService]:
    with InternalService() as service:
        yield service


def _hostname_address() -> str:
    """The address this machine's own name resolves to (a name, not a literal, pointing inside)."""
    address = socket.getaddrinfo(socket.gethostname(), 80, type=socket.SOCK_STREAM)[0][4][0]
    if ipaddress.ip_address(address).is_global:
        pytest.skip(f"{socket.gethostname()} resolves to a public address ({address}): no internal name to aim at")
    return str(address)


def _run(api: TestClient, url: str) -> Any:
    return api.post(
        "/v1/report-runs", json={"period": "2026-10", "format": "csv", "destination": {"type": "webhook", "url": url}}
    )


def test_report_webhook_aimed_at_a_loopback_admin_service_never_reaches_it(
    srt: Runtime, internal: InternalService, clock: MovableClock
) -> None:
    api = finance_client(srt, clock())
    answer = _run(api, internal.url() + "/admin/delete-everything")
    tick(srt, clock())  # the control loop delivers
    assert internal.requests == []
    assert answer.status_code == 422 and "destination.url" in answer.json()["message"], answer.text
    assert "non-public address" in answer.json()["message"]


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://2852039166/latest/meta-data/",  # 169.254.169.254 as one number
        "http://[::ffff:169.254.169.254]/latest/meta-data/",  # IPv4-mapped
        "http://[fd00:ec2::254]/latest/meta-data/",  # the IMDS IPv6 address (unique-local)
        "http://10.0.0.1:8500/v1/kv/",
        "http://100.64.0.1/",
        "http://0.0.0.0:8000/v1/keys",
        "http://localhost:8000/v1/keys",
        "http://127.1:8000/",
    ],
)
def test_budget_webhook_aimed_at_the_metadata_service_or_a_private_range_is_refused_at_creation(
    srt: Runtime, clock: MovableClock, url: str
) -> None:
    api = finance_client(srt, clock())
    made = api.post("/v1/budgets", json={"scope": "team", "name": "nlp", "amount_usd": "1", "webhook_url": url})
    assert made.status_code == 422 and made.json()["message"].startswith("webhook_url"), made.text
    ok = api.post("/v1/budgets", json={"scope": "team", "name": "nlp", "amount_usd": "1"}).json()
    patched = api.patch(f"/v1/budgets/{ok['id']}", json={"webhook_url": url})
    assert patched.status_code == 422 and patched.json()["message"].startswith("webhook_url"), patched.text


def test_webhook_host_name_resolving_inside_is_refused_at_delivery(srt: Runtime, clock: MovableClock) -> None:
    address = _hostname_address()
    with InternalService(address) as service:
        url = service.url(socket.gethostname()) + "/hook"
        api = finance_client(srt, clock())
        queued = _run(api, url)  # a name passes creation: its DNS answer is only known at delivery
        tick(srt, clock())  # the control loop delivers
        assert service.requests == []
        assert queued.status_code == 202, queued.text
        run = api.get(f"/v1/report-runs/{queued.json()['id']}").json()
        assert (run["state"], run["delivery_state"]) == ("failed", "failed"), run
        assert "non-public address" in run["error"]

        seed_ledger(srt.engine, "demo", NOV, days=1, entries=20)  # team nlp spends
        budget = api.post(
            "/v1/budgets",
            json={"scope": "team", "name": "nlp", "amount_usd": "0.01", "thresholds": [100], "webhook_url": url},
        )
        assert budget.status_code == 201, budget.text
        check_budgets(srt, clock())
        assert service.requests == []
        with Session(srt.engine) as s:
            [alert] = s.exec(select(BudgetAlertRow)).all()
        assert alert.delivered_at is None and "non-public address" in alert.last_error


def test_internal_answer_body_is_never_echoed_back(opened: Runtime, clock: MovableClock) -> None:
    with InternalService(status=500, body=b"root:x:0:0:root:/root:/bin/bash SECRET-INTERNAL-DATA") as service:
        api = finance_client(opened, clock())
        queued = _run(api, service.url() + "/internal")
        tick(opened, clock())
        run = api.get(f"/v1/report-runs/{queued.json()['id']}").json()
        assert len(service.requests) == 1  # the operator opened loopback: it was sent
    assert "SECRET" not in run["error"] and "root:x" not in run["error"]
    assert "HTTP 500" in run["error"] and queued.status_code == 202, run


def test_webhook_tokens_stay_out_of_logs_errors_and_records(
    opened: Runtime, clock: MovableClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with InternalService(status=503) as service:
        url = service.url() + "/services/T0KEN-IN-PATH/B1234?sig=S1GNATURE-IN-QUERY"
        api = finance_client(opened, clock())
        queued = _run(api, url)
        tick(opened, clock())
        seed_ledger(opened.engine, "demo", NOV, days=1, entries=20)
        made = api.post(
            "/v1/budgets",
            json={"scope": "team", "name": "nlp", "amount_usd": "0.01", "thresholds": [100], "webhook_url": url},
        )
        assert made.status_code == 201, made.text
        check_budgets(opened, clock())
        assert len(service.requests) == 2  # both were sent, with the token, to the receiver
    run = api.get(f"/v1/report-runs/{queued.json()['id']}").json()
    with Session(opened.engine) as s:
        [alert] = s.exec(select(BudgetAlertRow)).all()
    shown = service.url()
    assert shown in run["error"] and shown in alert.last_error  # scheme and host say which receiver failed
    for text in (caplog.text, run["error"], run["delivered_to"], alert.last_error):
        assert "T0KEN" not in text and "S1GNATURE" not in text, text
