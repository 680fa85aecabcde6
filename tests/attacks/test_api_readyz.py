"""Attack: `/readyz` showed every feed's last error text (internal hosts, accounts) to anyone. Unauthenticated
callers (and invalid keys) now get only the verdict and a coarse status per component; a valid key of any role
also gets each feed's state; the error text needs the metrics token or an admin key."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlmodel import Session

from broker.api.auth import Role, create_key
from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import FeedStatus
from tests.conftest import MovableClock

SECRET_ERROR = "connect to pricing-db.internal.corp:5432 as svc_pricing failed"
TOKEN = "metrics-token-0123456789abcdef0123"


def test_feed_errors_are_shown_only_to_the_metrics_token_and_admins(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url, metrics_token=TOKEN)
    tick(rt, clock())
    with Session(rt.engine) as s:
        s.add(FeedStatus(name="prices:aws", last_success_at=clock(), last_error_at=clock(), last_error=SECRET_ERROR))
        s.commit()
    submitter = create_key(rt.engine, tenant="demo", role=Role.SUBMITTER, name="s", now=clock())
    with TestClient(create_app(runtime=rt)) as c:
        as_submitter = c.get("/readyz", headers={"Authorization": f"Bearer {submitter}"})
        assert as_submitter.json()["feeds"]["prices:aws"] == {"age_seconds": 0.0, "fresh": True, "failing": False}
        assert "internal.corp" not in as_submitter.text, "any key sees feed states, not their errors"
        for headers in (
            {},
            {"Authorization": "Bearer ovs_devadmin_" + "w" * 30},
            {"Authorization": "Bearer wrong-metrics-token"},
            {"X-API-Key": "garbage"},
        ):
            answer = c.get("/readyz", headers=headers)
            assert answer.status_code == 200, (headers, answer.text)
            assert answer.json() == {"status": "ready", "database": "ok", "prices": "fresh"}, answer.text
            assert "internal.corp" not in answer.text
        for headers in ({"Authorization": f"Bearer {TOKEN}"}, {"Authorization": f"Bearer {DEV_API_KEY}"}):
            detail = c.get("/readyz", headers=headers)
            assert detail.status_code == 200
            assert detail.json()["feeds"]["prices:aws"]["last_error"] == SECRET_ERROR
