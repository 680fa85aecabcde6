"""Spot availability history: run lengths from traces and observed changes (pricing/availability.py), the
`availability_change` table the feeds and reclaims write (broker/market/availability.py), and the deadline-aware
placement reading it through `PoolOutlook`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.feeds import store_offerings
from broker.loop.tick import tick
from broker.market.availability import pool_outlooks, record_reclaim
from broker.runtime import Runtime
from broker.store.tables import AvailabilityChange, Placement
from federation.strategies import Timeline
from pricing.availability import Runs, load_trace_runs, runs_from_events, runs_from_trace
from tests.builders import job_body, offering
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, attach

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def test_trace_runs_leave_out_the_runs_cut_by_the_edges() -> None:
    # 5-minute samples: [up 2][down 3][up 4][down 1][up 2] -> the first and last up runs are censored
    values = [1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 1, 1]
    assert runs_from_trace(values, 300) == Runs(up=(20 / 60,), down=(15 / 60, 5 / 60))


def test_trace_file_is_read_and_a_broken_one_named(tmp_path: Path) -> None:
    good = tmp_path / "t.json"
    good.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 1, 1, 1, 0, 0, 1]}))
    assert load_trace_runs(good) == Runs(up=(0.5,), down=(20 / 60,))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=r"bad\.json: not a spot availability trace"):
        load_trace_runs(bad)


def test_observed_changes_fold_into_completed_runs_state_and_age() -> None:
    events = [(h(0), True), (h(1), True), (h(2), False), (h(2.5), True), (h(6.5), False), (h(7), True), (h(9), True)]
    seen = runs_from_events(events, h(8))
    assert seen is not None
    # the first up run started before anything was observed: unknown length, left out; the future is ignored
    assert seen.runs == Runs(up=(4.0,), down=(0.5, 0.5))
    assert seen.up and seen.age_hours == 1.0
    assert runs_from_events(events, h(-1)) is None


@pytest.fixture
def engine_rt(db_url: str, make_runtime: Callable[..., Runtime]) -> Runtime:
    return make_runtime(db_url, simulated=False)


def test_feed_refreshes_and_reclaims_write_changes_not_samples(engine_rt: Runtime) -> None:
    spot = offering(capacity="spot", zone="us-east-1a")
    other = offering(capacity="spot", zone="us-east-1b")
    on_demand = offering(capacity="on_demand")
    with Session(engine_rt.engine) as s:
        for at, listed in [
            (h(0), [spot, other, on_demand]),  # first sight: a row per spot pool
            (h(1), [spot, other, on_demand]),  # no change: nothing
            (h(2), [replace(spot, available=False), other]),  # spot down, on-demand dropped (not tracked)
            (h(3), [spot, other]),  # spot back
            (h(4), [spot]),  # `other` no longer listed: down
        ]:
            store_offerings(s, "feed", listed, at)
        record_reclaim(s, spot.key, h(5))  # the provider took our instance back
        s.commit()
        rows = [(r.offering_key, r.up, r.observed_at) for r in s.exec(select(AvailabilityChange).order_by("id"))]
        assert rows == [
            (spot.key, True, h(0)),
            (other.key, True, h(0)),
            (spot.key, False, h(2)),
            (spot.key, True, h(3)),
            (other.key, False, h(4)),
            (spot.key, False, h(5)),
        ]
        store_offerings(s, "feed", [spot], h(6))  # listed again after the reclaim: up again
        s.commit()
        looks = pool_outlooks(s, [spot.key, other.key, "never/seen"], h(7))
    assert set(looks) == {spot.key, other.key}
    assert looks[spot.key].up and looks[spot.key].age_hours == 1.0
    assert looks[spot.key].up_runs.hours == (2.0,) and looks[spot.key].down_runs.hours == (1.0, 1.0)
    assert not looks[other.key].up and looks[other.key].age_hours == 3.0
    # dated, for a joint model: up from h(0), down at 2, up at 3, reclaimed at 5, up at 6 (seconds since h(0))
    assert looks[spot.key].timeline == Timeline(h(0), True, (7200.0, 10800.0, 18000.0, 21600.0))
    assert looks[other.key].timeline == Timeline(h(0), True, (14400.0,))
    # as of h(4.5): only what was recorded by then
    with Session(engine_rt.engine) as s:
        early = pool_outlooks(s, [spot.key], h(4.5))[spot.key]
    assert early.timeline == Timeline(h(0), True, (7200.0, 10800.0))


def test_a_configured_trace_adds_its_runs_as_prior_history(engine_rt: Runtime) -> None:
    spot = offering(capacity="spot")
    with Session(engine_rt.engine) as s:
        store_offerings(s, "feed", [spot], h(0))
        s.commit()
        prior = {"aws/us-east-1": Runs(up=(3.0, 5.0), down=(1.0,)), "gcp/": Runs(up=(9.0,))}
        look = pool_outlooks(s, [spot.key], h(1), prior)[spot.key]
    assert look.up_runs.hours == (3.0, 5.0) and look.down_runs.hours == (1.0,)
    assert look.up_runs.mean_residual(1.0) == 3.0  # both runs outlast 1 h: (2 + 4) / 2


def _history(rt: Runtime, key: str, up_hours: float, runs: int, now: datetime) -> None:
    """`runs` past up runs of `up_hours` each, separated by 10-minute outages, ending up (age 0) at `now`."""
    rows: list[AvailabilityChange] = []
    at = now - timedelta(hours=runs * (up_hours + 1 / 6) + 1)
    rows.append(AvailabilityChange(offering_key=key, up=False, observed_at=at))
    for _ in range(runs):
        at += timedelta(hours=1 / 6)
        rows.append(AvailabilityChange(offering_key=key, up=True, observed_at=at))
        at += timedelta(hours=up_hours)
        rows.append(AvailabilityChange(offering_key=key, up=False, observed_at=at))
    rows.append(AvailabilityChange(offering_key=key, up=True, observed_at=now))
    with Session(rt.engine) as s:
        s.add_all(rows)
        s.commit()


@pytest.mark.parametrize("with_history", [True, False])
def test_deadline_job_goes_to_the_steady_pool_when_history_shows_the_cheap_one_is_flaky(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, with_history: bool
) -> None:
    """Spot z1 at $1.0/h whose capacity has stayed up 12 minutes at a time, z2 at $1.2/h up 6 h at a time,
    15-minute changeovers: z1's progress costs 1.0 x E/(E - d) with E = 0.2 h <= d, so it is not expected to
    outlast its own changeover; z2 costs 1.2 x 6/5.75 = $1.25 per hour of progress. Without history both look
    alike (no interruption rate) and the cheaper z1 wins."""
    cloud = ScriptedCloud("aws", clock, zones=("z1", "z2"), region="us-east-1")
    cloud.prices = {"z1": Decimal("1.0"), "z2": Decimal("1.2")}
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0)
    attach(rt, cloud)
    tick(rt, clock())
    if with_history:
        for zone, up_hours in (("z1", 0.2), ("z2", 6.0)):
            key = next(o.key for o in cloud.offerings(clock()) if o.zone == zone)
            _history(rt, key, up_hours, runs=8, now=clock())
    api = TestClient(create_app(runtime=rt))
    api.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
    deadline = clock() + timedelta(hours=30)
    body = job_body(work_gpu_hours="10", max_total_usd="100", deadline=deadline.isoformat())
    job_id = api.post("/v1/jobs", json=body).json()["id"]
    tick(rt, clock())
    with Session(rt.engine) as s:
        [p] = s.exec(select(Placement).where(Placement.job_id == job_id)).all()
    assert p.zone == ("z2" if with_history else "z1")
