"""Budget alerts across tenants: a CRLF in one tenant's `email_to` made the budget step fail on every tick, so no
tenant's alerts went out. Addresses are validated (422 naming `email_to[i]` / `destination.to[i]`), and a bad
budget already stored, or one whose webhook is dead, fails its own alert only. Real SMTP (aiosmtpd) and webhook
receivers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlmodel import Session, select

from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.services.jobs import new_id
from broker.store.tables import BudgetAlertRow, BudgetRow
from tests.attacks.finance_parts import finance_client
from tests.conftest import MovableClock
from tests.finance_data import seed_ledger
from tests.finance_sinks import SmtpSink, WebhookSink

NOV = datetime(2026, 11, 1, tzinfo=UTC)
HOSTILE = [
    "finops@example.com\r\nBcc: everyone@victim.example",
    "finops@example.com\nX-Injected: 1",
    "finops@example.com\x00",
    "Finance <finops@example.com>",
    "a@example.com, b@example.com",
]


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    with SmtpSink() as sink:
        yield sink


@pytest.fixture
def art(tmp_path: Path, make_runtime: Callable[..., Runtime], smtp: SmtpSink) -> Runtime:
    return make_runtime(
        f"sqlite:///{tmp_path / 'alerts.db'}",
        simulated=False,
        smtp_host="127.0.0.1",
        smtp_port=smtp.port,
        webhook_allowed_networks=["127.0.0.0/8"],  # tenant B's receiver runs on loopback
        delivery_deadline_seconds=2,
    )


@pytest.mark.parametrize("address", HOSTILE)
def test_hostile_email_addresses_are_refused_naming_the_field(art: Runtime, clock: MovableClock, address: str) -> None:
    api = finance_client(art, clock())
    made = api.post(
        "/v1/budgets",
        json={"scope": "team", "name": "nlp", "amount_usd": "1", "email_to": ["ok@example.com", address]},
    )
    assert made.status_code == 422 and "email_to[1]" in made.json()["message"], made.text
    good = api.post("/v1/budgets", json={"scope": "team", "name": "nlp", "amount_usd": "1"}).json()
    patched = api.patch(f"/v1/budgets/{good['id']}", json={"email_to": [address]})
    assert patched.status_code == 422 and "email_to[0]" in patched.json()["message"], patched.text
    schedule = api.post(
        "/v1/report-schedules",
        json={"name": "x", "cron": "0 6 1 * *", "destination": {"type": "email", "to": [address]}},
    )
    assert schedule.status_code == 422 and "destination.to[0]" in schedule.json()["message"], schedule.text
    run = api.post("/v1/report-runs", json={"period": "2026-10", "destination": {"type": "email", "to": [address]}})
    assert run.status_code == 422 and "destination.to[0]" in run.json()["message"], run.text


def test_one_tenants_bad_budgets_never_stop_another_tenants_alerts(
    art: Runtime, clock: MovableClock, smtp: SmtpSink
) -> None:
    for tenant in ("tenant-a", "tenant-b"):
        seed_ledger(art.engine, tenant, NOV, days=1, entries=20)  # team nlp of each spends
    with Session(art.engine) as s:  # tenant A's budgets, stored before addresses were validated (or by hand)
        for email_to, webhook in [
            (["finops@example.com\r\nBcc: everyone@victim.example"], ""),
            ([], "http://127.0.0.1:9/dead"),  # nothing listens there
        ]:
            s.add(
                BudgetRow(
                    id=new_id("bdg"), tenant="tenant-a", scope="team", name="nlp", period="monthly",
                    amount_usd=1, thresholds=[50], webhook_url=webhook, email_to=email_to,
                    created_at=clock(), updated_at=clock(),
                )
            )  # fmt: skip
        s.commit()
    with WebhookSink() as hook:
        api_b = finance_client(art, clock(), tenant="tenant-b")
        made = api_b.post(
            "/v1/budgets",
            json={"scope": "team", "name": "nlp", "amount_usd": "1", "thresholds": [50],
                  "webhook_url": hook.url + "/b", "email_to": ["finops-b@example.com"]},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        first = tick(art, clock())
        second = tick(art, clock())
        assert [r[0] for r in hook.requests] == ["/b"]  # tenant B's alert went out, once
    assert [m["To"] for m in smtp.messages] == ["finops-b@example.com"]
    assert first.ok and second.ok, (first, second)
    with Session(art.engine) as s:
        rows = s.exec(select(BudgetAlertRow).where(BudgetAlertRow.tenant == "tenant-a")).all()
    assert len(rows) == 2 and all(a.delivered_at is None for a in rows)  # each failed alone, recorded on it
    errors = [a.last_error for a in rows]
    assert any("to[0]" in e for e in errors) and any("http://127.0.0.1:9" in e for e in errors), errors
