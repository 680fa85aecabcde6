"""Quotes, pools, pressure, health and readiness against the built-in simulated market and on-prem cluster."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import Runtime
from tests.builders import job_body
from tests.conftest import MovableClock


def test_quote_ranks_pools_and_explains_rejections(client: TestClient) -> None:
    body = job_body(accelerators=["A100"], gpu_count=1, max_hourly_usd="3", allowed_regions=["us-central1", "onprem"])
    q = client.post("/v1/quotes", json=body, params={"limit": 1000}).json()
    assert q["feasible"] and q["placeable_now"]
    costs = [float(c["expected_cost_usd"]) for c in q["candidates"]]
    assert q["candidates"] and all(c["offering"]["accelerator"] == "A100" for c in q["candidates"])
    assert all(float(c["offering"]["hourly_usd"]) <= 3 for c in q["candidates"])
    assert [c["rank"] for c in q["candidates"]] == list(range(1, len(costs) + 1))
    reasons = {r["reason"] for r in q["rejections"]}
    assert {"over_hourly_ceiling", "region_not_allowed"} <= reasons
    assert q["rejections_total"] == len(q["rejections"])
    assert q["other_accelerator_pools"] > 0
    assert all(r["message"] for r in q["rejections"])


def test_quote_of_impossible_job_is_not_feasible(client: TestClient) -> None:
    q = client.post("/v1/quotes", json=job_body(accelerators=["A100"], gpu_count=16)).json()
    assert not q["feasible"] and not q["placeable_now"]
    assert {r["reason"] for r in q["rejections"]} == {"too_few_gpus"}


def test_pools_show_prices_freshness_and_simulated(client: TestClient) -> None:
    pools = client.get("/v1/pools", params={"accelerator": "a100"}).json()["items"]
    assert pools and all(p["accelerator"] == "A100" for p in pools)
    assert all(p["simulated"] for p in pools)
    kinds = {p["capacity_type"] for p in pools}
    assert {"spot", "on_demand", "on_prem"} <= kinds
    for p in pools:
        assert p["age_seconds"] >= 0 and p["stale"] is False and p["price_source"]
    spot = client.get("/v1/pools", params={"capacity_type": "spot", "provider": "sim-aws"}).json()["items"]
    assert spot and {p["provider"] for p in spot} == {"sim-aws"}
    assert client.get("/v1/pools", params={"capacity_type": "cheap"}).status_code == 422


def test_pressure_reports_onprem_queue(client: TestClient) -> None:
    rows = client.get("/v1/pressure").json()["items"]
    assert {r["accelerator"] for r in rows} == {"A100", "V100"}
    for r in rows:
        assert 0 <= r["free_gpus"] <= r["total_gpus"]


def test_health_and_readiness(db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock) -> None:
    rt = make_runtime(db_url)
    c = TestClient(create_app(runtime=rt))
    assert c.get("/healthz").json() == {"status": "ok"}
    before = c.get("/readyz")
    assert before.status_code == 503 and "first tick" in before.json()["prices"]
    tick(rt, clock())
    admin = {"Authorization": f"Bearer {DEV_API_KEY}"}  # feed detail is for admins and the metrics token
    ready = c.get("/readyz", headers=admin)
    assert ready.status_code == 200, ready.text
    assert ready.json()["feeds"]["prices:sim-aws"]["fresh"]
    clock.advance(hours=4)
    stale = c.get("/readyz", headers=admin)
    assert stale.status_code == 503 and not stale.json()["feeds"]["prices:sim-aws"]["fresh"]
    assert c.get("/readyz").json() == {"status": "not ready", "database": "ok", "prices": "stale"}


def test_job_runs_on_the_simulated_market_to_completion(client: TestClient, rt: Runtime, clock: MovableClock) -> None:
    job = client.post("/v1/jobs", json=job_body(accelerators=["V100", "A10G", "L4"], work_gpu_hours="1")).json()
    states = []
    for _ in range(24):
        clock.advance(minutes=10)
        tick(rt, clock())
        states.append(client.get(f"/v1/jobs/{job['id']}").json()["state"])
        if states[-1] == "succeeded":
            break
    assert states[-1] == "succeeded", states
    done = client.get(f"/v1/jobs/{job['id']}").json()
    assert 0 < float(done["spent_usd"]) <= 50
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["items"]
    placed = next(e for e in events if e["kind"] == "placed")
    assert placed["data"]["simulated"] is True
    assert events[0]["kind"] == "submitted" and events[-1]["kind"] in ("finished", "cost_accrued")
    times = [datetime.fromisoformat(e["at"].replace("Z", "+00:00")) for e in events]
    assert times == sorted(times)  # in time order


def test_production_refuses_the_development_key() -> None:
    with pytest.raises(ValidationError, match="OVERSPILL_BOOTSTRAP_API_KEY"):
        Settings(env="production", bootstrap_api_key=DEV_API_KEY)
    with pytest.raises(ValidationError):
        Settings(env="production", bootstrap_api_key="")
    # production also needs its own callback secret (tests/test_secrets.py has the rest of the rules)
    ok = Settings(
        env="production", bootstrap_api_key="ovs_prodadm_" + "x" * 32, callback_secret="c" * 32, metrics_token="m" * 32
    )
    assert ok.env == "production"


def test_deadline_job_is_quoted_with_finish_times(client: TestClient, clock: MovableClock) -> None:
    deadline = clock() + timedelta(hours=6)
    q = client.post("/v1/quotes", json=job_body(work_gpu_hours="4", deadline=deadline.isoformat())).json()
    assert q["candidates"]
    for c in q["candidates"]:
        assert datetime.fromisoformat(c["expected_finish_at"]) <= deadline
    late = [r for r in q["rejections"] if r["reason"] == "misses_deadline"]
    assert all("deadline" in r["message"] for r in late)


def test_cached_book_answers_without_the_database_only_while_fresh(rt: Runtime) -> None:
    """`POST /v1/jobs` runs on the event loop and asks `cached_book()` first: it must never query (None instead)
    when the re-check is due or another thread holds the cache, so that `book()` then runs in a worker thread."""
    import threading
    import time

    from broker.market.catalog import CatalogCache

    catalog = CatalogCache(rt.engine, check_seconds=0.3)
    assert catalog.cached_book() is None, "nothing loaded yet"
    book = catalog.book(rt.clock())
    assert catalog.cached_book() is book
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with catalog._lock:
            holding.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    try:
        assert catalog.cached_book() is None, "another thread is loading: no wait on its lock"
    finally:
        release.set()
        holder.join()
    time.sleep(0.35)
    assert catalog.cached_book() is None, "the re-check is due"
    assert catalog.book(rt.clock()) is book, "unchanged prices: the same book after the re-check"
    assert catalog.cached_book() is book
