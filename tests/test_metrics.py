"""GET /metrics: scraped through the API and parsed with Prometheus' own text parser; the figures agree with what
the API and the ledger say, and label sets stay bounded however many jobs (and teams) there are."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from sqlmodel import Session, select

from broker.api.auth import Role, create_key
from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import STEPS, tick
from broker.observe.metrics import MAX_TEAMS_PER_TENANT, OTHER_TEAM
from broker.runtime import Runtime
from broker.store.tables import FeedStatus, Placement
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud

Samples = dict[str, list[Sample]]


def scrape(client: TestClient, headers: dict[str, str] | None = None) -> Samples:
    response = client.get("/metrics", headers=headers or {})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[sample.name].append(sample)
    return out


def by(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels[k] for k in labels): s.value for s in samples.get(name, [])}


@pytest.fixture
def cloud(clock: MovableClock) -> ScriptedCloud:
    c = ScriptedCloud("scripted", clock)
    c.prices = {"z1": Decimal("2.5"), "z2": Decimal("3")}
    c.on_demand = {"z1": Decimal("9")}
    return c


@pytest.fixture
def srt(db_url: str, make_runtime: Callable[..., Runtime], cloud: ScriptedCloud, clock: MovableClock) -> Runtime:
    rt = make_runtime(db_url, simulated=False)
    rt.providers[cloud.name] = cloud
    rt.offering_sources.append(cloud)
    return rt


@pytest.fixture
def api(srt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=srt)) as c:
        c.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
        yield c


def test_metrics_agree_with_the_api_and_the_ledger(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    other = create_key(srt.engine, tenant="acme", role=Role.SUBMITTER, name="t", now=clock())
    other_headers = {"Authorization": f"Bearer {other}"}
    submitted = []
    for i, team in enumerate(["vision", "vision", "nlp"]):
        body = job_body(name=f"j{i}", team=team, work_gpu_hours="10", max_total_usd="100")
        submitted.append(api.post("/v1/jobs", json=body).json())
    api.post("/v1/jobs", json=job_body(name="acme-1", team="search", max_total_usd="100"), headers=other_headers)
    never = api.post("/v1/jobs", json=job_body(name="tiny", max_total_usd="0.5")).json()  # ceiling too low to run
    ticks = 0
    for _ in range(2):
        tick(srt, clock())
        ticks += 1
    clock.advance(hours=1)
    tick(srt, clock())
    ticks += 1
    first = api.get(f"/v1/jobs/{submitted[0]['id']}").json()
    cloud.preempt(first["placement"]["instance_id"])
    clock.advance(minutes=30)
    tick(srt, clock())
    ticks += 1

    m = scrape(api)
    assert by(m, "overspill_state_scrape_ok") == {(): 1.0}

    # jobs by tenant and state: exactly what the API lists, per tenant
    expected: dict[tuple[str, str], float] = defaultdict(float)
    for headers, tenant in (({}, "demo"), (other_headers, "acme")):
        for job in api.get("/v1/jobs?limit=500", headers=headers).json()["items"]:
            expected[(tenant, job["state"])] += 1
    assert by(m, "overspill_jobs", "tenant", "state") == expected
    assert api.get(f"/v1/jobs/{never['id']}").json()["state"] == "pending"

    # placements: live ones by state, all ones made, and the one preemption
    with Session(srt.engine) as s:
        placements = s.exec(select(Placement)).all()
    live = defaultdict(float)
    for p in placements:
        if p.state in ("launching", "queued", "running"):
            live[(p.provider, p.capacity_type, p.state)] += 1
    assert by(m, "overspill_placements_active", "provider", "capacity_type", "state") == live
    assert by(m, "overspill_placements_total", "provider", "capacity_type") == {
        ("scripted", "spot"): float(len(placements))
    }
    assert by(m, "overspill_preemptions_total", "provider", "capacity_type") == {("scripted", "spot"): 1.0}

    # spend: month-to-date equals the jobs' spent_usd (the ledger's sum), per tenant and team
    spent: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    rate: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for headers, tenant in (({}, "demo"), (other_headers, "acme")):
        for job in api.get("/v1/jobs?limit=500", headers=headers).json()["items"]:
            spent[(tenant, job["team"])] += Decimal(job["spent_usd"])
            if job["placement"] and job["placement"]["state"] == "running":
                rate[(tenant, job["team"])] += Decimal(job["placement"]["hourly_usd"])
    mtd = by(m, "overspill_spend_month_to_date_usd", "tenant", "team")
    assert set(mtd) == {k for k, v in spent.items() if v > 0}
    for key, usd in mtd.items():
        assert usd == pytest.approx(float(spent[key]), rel=1e-9)
    assert spent[("demo", "vision")] > 0
    assert by(m, "overspill_spend_rate_usd_per_hour", "tenant", "team") == {k: float(v) for k, v in rate.items()}

    # price feed age: from the feed's last success to the broker's clock
    with Session(srt.engine) as s:
        feeds = {f.name: f for f in s.exec(select(FeedStatus)).all()}
    ages = by(m, "overspill_price_feed_age_seconds", "feed")
    assert set(ages) == {(name,) for name in feeds}
    for name, f in feeds.items():
        assert f.last_success_at is not None
        assert ages[(name,)] == pytest.approx((clock() - f.last_success_at).total_seconds())
    assert set(by(m, "overspill_price_feed_failing", "feed").values()) == {0.0}

    # tick step durations: one observation per step per tick in this process
    counts = by(m, "overspill_tick_step_duration_seconds_count", "step")
    assert counts == {(name,): float(ticks) for name, _ in STEPS}
    assert by(m, "overspill_tick_last_completed_timestamp_seconds")[()] > 0


def test_onprem_pressure_per_gpu_type(rt: Runtime, client: TestClient) -> None:
    """The built-in simulated cluster reports pressure per GPU type; the metrics carry the same numbers."""
    m = scrape(client)
    pressure = client.get("/v1/pressure").json()["items"]
    assert pressure
    pending = by(m, "overspill_onprem_pending_gpus", "source", "accelerator")
    total = by(m, "overspill_onprem_gpus", "source", "accelerator")
    wait = by(m, "overspill_onprem_expected_wait_seconds", "source", "accelerator")
    for r in pressure:
        key = (r["source"], r["accelerator"])
        assert pending[key] == r["pending_gpus"] and total[key] == r["total_gpus"]
        assert wait[key] == pytest.approx(r["expected_wait_hours"] * 3600)
    assert set(pending) == {(r["source"], r["accelerator"]) for r in pressure}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_label_sets_stay_bounded_under_1000_jobs(rt: Runtime, client: TestClient, clock: MovableClock) -> None:
    """1,000 jobs, each with its own team, in three tenants: no id becomes a label and teams are capped."""
    keys = {
        tenant: {
            "Authorization": f"Bearer {create_key(rt.engine, tenant=tenant, role=Role.ADMIN, name='t', now=clock())}"
        }
        for tenant in ("t1", "t2", "t3")
    }
    tenants = list(keys)
    for i in range(1000):
        body = job_body(name=f"j{i}", team=f"team-{i}", work_gpu_hours="2", max_total_usd="50")
        assert client.post("/v1/jobs", json=body, headers=keys[tenants[i % 3]]).status_code == 202
    tick(rt, clock())
    tick(rt, clock())
    clock.advance(minutes=30)
    tick(rt, clock())
    text = client.get("/metrics").text
    m = scrape(client)

    assert "job_" not in text and "plc_" not in text  # no job or placement id anywhere in the exposition
    series = sum(len(v) for v in m.values())
    assert series < 1500, f"{series} series for 1,000 jobs"
    assert sum(by(m, "overspill_jobs", "tenant", "state").values()) == 1000
    assert len(by(m, "overspill_jobs", "tenant", "state")) <= 3 * 6
    for name in ("overspill_spend_month_to_date_usd", "overspill_spend_rate_usd_per_hour"):
        values = by(m, name, "tenant", "team")
        per_tenant: dict[str, int] = defaultdict(int)
        for tenant, _team in values:
            per_tenant[tenant] += 1
        assert values, name
        assert max(per_tenant.values()) <= MAX_TEAMS_PER_TENANT + 1, name
    rate = by(m, "overspill_spend_rate_usd_per_hour", "tenant", "team")
    assert any(team == OTHER_TEAM for _, team in rate)  # ~330 teams per tenant: the tail is folded, not dropped
    running = client.get("/v1/jobs?limit=500&state=running", headers=keys["t1"]).json()["items"]
    assert len(running) > MAX_TEAMS_PER_TENANT
    assert sum(v for (t, _), v in rate.items() if t == "t1") == pytest.approx(
        float(sum(Decimal(j["placement"]["hourly_usd"]) for j in running if j["placement"]["state"] == "running"))
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_metrics_token_protects_the_endpoint(db_url: str, make_runtime: Callable[..., Runtime], tmp_path: Path) -> None:
    rt = make_runtime(db_url, metrics_token="scrape-secret-1234")
    with TestClient(create_app(runtime=rt)) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": f"Bearer {DEV_API_KEY}"}).status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = c.get("/metrics", headers={"Authorization": "Bearer scrape-secret-1234"})
        assert ok.status_code == 200 and "overspill_jobs" in ok.text


def test_failing_feed_and_failing_step_are_reported(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    tick(srt, clock())
    assert by(scrape(api), "overspill_price_feed_failing", "feed")[("prices:scripted",)] == 0.0

    def feed_down(now: Any) -> list[Any]:
        raise RuntimeError("feed down")

    def step_down(rt: Runtime, now: Any) -> int:
        raise RuntimeError("step down")

    cloud.offerings = feed_down  # type: ignore[method-assign]
    clock.advance(minutes=10)
    tick(srt, clock(), (*STEPS, ("always_fails", step_down)))
    m = scrape(api)
    assert by(m, "overspill_price_feed_failing", "feed")[("prices:scripted",)] == 1.0
    assert by(m, "overspill_price_feed_age_seconds", "feed")[("prices:scripted",)] == pytest.approx(600)
    assert by(m, "overspill_tick_step_failures_total", "step") == {("always_fails",): 1.0}
