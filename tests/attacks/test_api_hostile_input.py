"""Attack: hostile values that used to answer 5xx. Each is now a 4xx whose message names the field or header."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.api.auth import callback_token
from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import Placement
from tests.builders import job_body
from tests.conftest import MovableClock

OVERFLOWING = ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59+00:00"]


@pytest.fixture
def api(rt: Runtime) -> Iterator[TestClient]:
    """The app with server errors answered as 500s (not raised into the test), as a client would see them."""
    with TestClient(create_app(runtime=rt), raise_server_exceptions=False) as c:
        c.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
        yield c


@pytest.mark.parametrize("deadline", OVERFLOWING)
def test_deadline_past_the_end_of_the_calendar_is_a_422_naming_deadline(api: TestClient, deadline: str) -> None:
    for route in ("/v1/jobs", "/v1/quotes"):
        answer = api.post(route, json=job_body(deadline=deadline))
        assert answer.status_code == 422, (route, answer.status_code, answer.text)
        assert answer.json()["message"].startswith("deadline:"), answer.json()["message"]
    job = api.post("/v1/jobs", json=job_body()).json()
    answer = api.patch(f"/v1/jobs/{job['id']}", json={"deadline": deadline})
    assert answer.status_code == 422 and answer.json()["message"].startswith("deadline:"), answer.text


def test_price_history_window_past_the_end_of_the_calendar_is_a_422_naming_it(api: TestClient) -> None:
    key = api.get("/v1/pools", params={"limit": 1}).json()["items"][0]["key"]
    for name in ("from", "to"):
        answer = api.get("/v1/prices/history", params={"offering": key, name: OVERFLOWING[0]})
        assert answer.status_code == 422, (name, answer.text)
        assert answer.json()["message"].startswith(f"{name}:"), answer.json()["message"]


@pytest.mark.parametrize("token", ["é" * 64, "\u2603", "tok\u00ff"])
def test_non_ascii_callback_token_is_a_4xx_naming_the_header(
    api: TestClient, rt: Runtime, clock: MovableClock, token: str
) -> None:
    api.post("/v1/jobs", json=job_body())
    tick(rt, clock.advance(minutes=1))
    with Session(rt.engine) as s:
        placement = s.exec(select(Placement)).first()
    assert placement is not None
    raw = {"X-Overspill-Callback-Token": token.encode("utf-8")}
    for route, body in (("exit", {"exit_code": 0}), ("scheduled-events", {"DocumentIncarnation": 1, "Events": []})):
        answer = api.post(f"/v1/placements/{placement.id}/{route}", json=body, headers=raw)
        assert 400 <= answer.status_code < 500, (route, answer.status_code, answer.text)
        assert "x-overspill-callback-token" in answer.json()["message"].lower(), answer.json()["message"]
    # the real token still works
    good = {"X-Overspill-Callback-Token": callback_token(rt.settings, placement.id)}
    assert api.post(f"/v1/placements/{placement.id}/exit", json={"exit_code": 0}, headers=good).status_code == 204
