"""Price storage in the tick: history per change, last good value on feed failure, staleness in the API."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import tick
from broker.runtime import Runtime
from providers.model import Offering
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud


class FlakyFeed(ScriptedCloud):
    """A scripted cloud whose price feed can be made to fail."""

    def __init__(self, clock: MovableClock) -> None:
        super().__init__("flaky", clock)
        self.failing = False

    def offerings(self, now: datetime) -> list[Offering]:
        if self.failing:
            raise ConnectionError("price API unreachable")
        return super().offerings(now)


@pytest.fixture
def feed(clock: MovableClock) -> FlakyFeed:
    return FlakyFeed(clock)


@pytest.fixture
def frt(db_url: str, make_runtime: Callable[..., Runtime], feed: FlakyFeed) -> Runtime:
    rt = make_runtime(db_url, simulated=False)
    rt.providers[feed.name] = feed
    rt.offering_sources.append(feed)
    return rt


def test_history_records_changes_not_samples(frt: Runtime, feed: FlakyFeed, clock: MovableClock) -> None:
    api = TestClient(create_app(runtime=frt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    key = "flaky/r1/z1/gpu.1/spot"
    t0 = clock()
    for price in ("10", "10", "12", "12", "9.5"):
        feed.prices["z1"] = Decimal(price)
        tick(frt, clock())
        clock.advance(minutes=10)
    history = api.get("/v1/prices/history", params={"offering": key}).json()["items"]
    assert [h["hourly_usd"] for h in history] == ["10", "12", "9.5"]
    assert history[0]["observed_at"].startswith(t0.strftime("%Y-%m-%dT%H:%M"))
    window = api.get(
        "/v1/prices/history",
        params={"offering": key, "from": history[1]["observed_at"], "to": history[2]["observed_at"]},
    ).json()["items"]
    assert [h["hourly_usd"] for h in window] == ["12"]
    bad = api.get("/v1/prices/history", params={"offering": key, "from": "2026-11-02T10:00:00"})
    assert bad.status_code == 422 and "from" in bad.json()["message"]


def test_failing_feed_keeps_last_good_prices_marked_stale(frt: Runtime, feed: FlakyFeed, clock: MovableClock) -> None:
    api = TestClient(create_app(runtime=frt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    feed.prices["z1"] = Decimal("10")
    tick(frt, clock())
    fresh = {p["key"]: p for p in api.get("/v1/pools").json()["items"]}
    assert not fresh["flaky/r1/z1/gpu.1/spot"]["stale"] and fresh["flaky/r1/z1/gpu.1/spot"]["feed"] == "prices:flaky"
    feed.failing = True
    feed.prices["z1"] = Decimal("99")
    clock.advance(minutes=10)
    report = tick(frt, clock())
    assert report.ok  # a failing feed is recorded, not a failed tick
    pools = {p["key"]: p for p in api.get("/v1/pools").json()["items"]}
    assert pools["flaky/r1/z1/gpu.1/spot"]["hourly_usd"] == "10"
    assert pools["flaky/r1/z1/gpu.1/spot"]["stale"] is True
    ready = api.get("/readyz").json()
    assert ready["feeds"]["prices:flaky"]["failing"] is True
    assert "unreachable" in ready["feeds"]["prices:flaky"]["last_error"]
    feed.failing = False
    clock.advance(minutes=10)
    tick(frt, clock())
    pools = {p["key"]: p for p in api.get("/v1/pools").json()["items"]}
    assert pools["flaky/r1/z1/gpu.1/spot"]["hourly_usd"] == "99" and not pools["flaky/r1/z1/gpu.1/spot"]["stale"]


def test_observed_reclaims_raise_a_pools_interruption_rate(frt: Runtime, feed: FlakyFeed, clock: MovableClock) -> None:
    from broker.api.schemas import JobCreate
    from broker.services.jobs import submit_job
    from tests.builders import job_body

    tick(frt, clock())
    before = frt.catalog.book(clock()).get("flaky/r1/z1/gpu.1/spot")
    assert before is not None and before.interruption_rate_per_hour == 0
    for i in range(3):
        submit_job(
            frt.engine,
            frt.catalog,
            tenant="demo",
            create=JobCreate(**job_body(name=f"j{i}", max_total_usd="500")),
            idempotency_key=None,
            now=clock(),
        )
        tick(frt, clock())
        clock.advance(hours=1)
        for inst in feed.running():
            feed.preempt(inst.id)
        tick(frt, clock())
    after = frt.catalog.book(clock()).get("flaky/r1/z1/gpu.1/spot")
    assert after is not None and after.interruption_rate_per_hour > 0
    assert "observed" in after.interruption_basis


def test_configured_trace_sets_a_pools_interruption_prior(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, tmp_path: Path
) -> None:
    import json as _json

    trace = tmp_path / "z1.json"
    trace.write_text(_json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 6 + [0] + [1] * 6 + [0]}))
    rt = make_runtime(db_url, simulated=False, interruption_traces={"flaky/r1/z1": str(trace)})
    feed = FlakyFeed(clock)
    rt.providers[feed.name] = feed
    rt.offering_sources.append(feed)
    tick(rt, clock())
    z1 = rt.catalog.book(clock()).get("flaky/r1/z1/gpu.1/spot")
    z2 = rt.catalog.book(clock()).get("flaky/r1/z2/gpu.1/spot")
    assert z1 is not None and z2 is not None
    assert z1.interruption_rate_per_hour == pytest.approx(1.0) and z1.interruption_basis.startswith("trace:")
    assert z2.interruption_rate_per_hour == 0.0
