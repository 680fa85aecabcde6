"""The broker's own spot experience per pool (`broker.loop.feeds.pool_experience`): on every backend the same
decayed run hours and reclaims as `pricing.risk.experience_from_runs` over the placements of the last two weeks
(PostgreSQL sums them in one aggregate statement, SQLite reads the rows)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlmodel import Session

from broker.loop.feeds import EXPERIENCE_WINDOW, pool_experience
from broker.runtime import Runtime
from broker.store.tables import Placement
from pricing.risk import experience_from_runs
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import admin_api

KEYS = ("sim/a/a1/x/spot", "sim/a/a2/x/spot", "sim/b/b1/y/spot")


def test_experience_is_the_decayed_runs_of_the_last_two_weeks(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url, simulated=False)
    now = clock()
    job = admin_api(rt).post("/v1/jobs", json=job_body()).json()["id"]
    runs: dict[str, list[tuple[datetime, datetime, bool]]] = defaultdict(list)
    rows = []
    for n in range(60):
        key = KEYS[n % 3]
        created = now - timedelta(hours=7 * n + 1)  # n >= 48: older than the window, left out
        started = created + timedelta(minutes=3)
        state = ("running", "preempted", "succeeded", "stopped", "launching")[n % 5]
        ended = None if state in ("running", "launching") else started + timedelta(hours=1 + n % 4, minutes=n)
        if n % 7 == 0 and ended is not None:
            ended = now + timedelta(hours=1)  # recorded past now: counted up to now
        capacity = "on_demand" if n % 11 == 0 else "spot"
        rows.append(
            Placement(
                id=f"plc-{n}",
                job_id=job,
                tenant="demo",
                offering_key=key if capacity == "spot" else key[:-4] + "od",
                provider="sim",
                region="r",
                zone="z",
                instance_type="x",
                capacity_type=capacity,
                accelerator="A100",
                accelerator_count=1,
                launch_token=f"tok-{n}",
                state=state,
                created_at=created,
                started_at=None if state == "launching" else started,
                ended_at=ended,
            )
        )
        if capacity == "spot" and state != "launching" and created >= now - EXPERIENCE_WINDOW:
            runs[key].append((started, min(ended or now, now), state == "preempted"))
    with Session(rt.engine) as session:
        session.add_all(rows)
        session.commit()
        seen = pool_experience(session, now, half_life_hours=48.0)
    expected = {key: experience_from_runs(r, now, 48.0) for key, r in runs.items()}
    assert set(seen) == set(expected) == set(KEYS)
    for key, exp in expected.items():
        assert exp.run_hours > 0 and exp.preemptions > 0
        assert seen[key].run_hours == pytest.approx(exp.run_hours, rel=1e-9)
        assert seen[key].preemptions == pytest.approx(exp.preemptions, rel=1e-9)
