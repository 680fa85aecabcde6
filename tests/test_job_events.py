"""A job's timeline and state as the API shows them on the simulated market: pages in time order with a cursor,
a kind filter, one cost event per placement (older per-tick accruals folded); `starting` until the instance is
up, remaining work counting down while it runs, and where a job ran once it ended."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import Any

from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import CostEntryRow, JobEvent
from tests.builders import job_body
from tests.conftest import MovableClock


def _events(client: TestClient, job_id: str, **params: Any) -> dict[str, Any]:
    resp = client.get(f"/v1/jobs/{job_id}/events", params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _at(e: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(e["at"].replace("Z", "+00:00"))


def _run_a_job(client: TestClient, rt: Runtime, clock: MovableClock, hours: int = 3) -> tuple[str, list[dict]]:
    """Submit a 2 h job on A100s and tick every 10 minutes for `hours`; returns its id and its GETs per tick."""
    job = client.post("/v1/jobs", json=job_body(work_gpu_hours="2", max_total_usd="80")).json()
    seen = []
    for _ in range(hours * 6):
        tick(rt, clock())
        seen.append(client.get(f"/v1/jobs/{job['id']}").json())
        clock.advance(minutes=10)
    return job["id"], seen


def test_events_page_by_cursor_in_time_order_with_a_kind_filter(
    rt: Runtime, client: TestClient, clock: MovableClock
) -> None:
    job_id, _ = _run_a_job(client, rt, clock)
    everything = _events(client, job_id, fold="false", limit=1000)
    assert everything["next_cursor"] is None
    raw = everything["items"]
    assert len(raw) > 5 and raw[0]["kind"] == "submitted"
    assert [_at(e) for e in raw] == sorted(_at(e) for e in raw)
    paged: list[dict[str, Any]] = []
    after = None
    while True:
        page = _events(client, job_id, fold="false", limit=5, **({"after": after} if after else {}))
        assert len(page["items"]) <= 5
        paged += page["items"]
        after = page["next_cursor"]
        if after is None:
            break
        assert after == str(page["items"][-1]["id"])
    assert paged == raw  # every event once, in the same order
    kinds = _events(client, job_id, kind=["placed", "started"])["items"]
    assert [e["kind"] for e in kinds] == ["placed", "started"]
    # a watcher polling after the last event it saw gets nothing new, then only what came since
    assert _events(client, job_id, after=raw[-1]["id"], fold="false")["items"] == []


def test_one_cost_event_per_placement_holds_its_whole_cost(
    rt: Runtime, client: TestClient, clock: MovableClock
) -> None:
    job_id, _ = _run_a_job(client, rt, clock)
    raw = [e for e in _events(client, job_id, fold="false", limit=1000)["items"] if e["kind"] == "cost_accrued"]
    with Session(rt.engine) as s:
        entries = s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id)).all()
    assert len(raw) == 1 < len(entries)  # not one per tick: the accrual that reaches the placement's end
    [event] = raw
    data = {k: Decimal(v) for k, v in event["data"].items() if k.endswith("_usd") or k == "usd"}
    assert data["usd"] == sum((e.usd for e in entries), Decimal("0")) == data["spent_usd"] > 0
    assert data["compute_usd"] + data["extras_usd"] == data["usd"]
    assert Decimal(client.get(f"/v1/jobs/{job_id}").json()["spent_usd"]) == data["spent_usd"]


def test_accruals_written_one_per_tick_are_still_folded_without_losing_money(
    rt: Runtime, client: TestClient, clock: MovableClock
) -> None:
    """Timelines written before accrual ran on a cadence hold one `cost_accrued` per tick: the API folds them."""
    job = client.post("/v1/jobs", json=job_body()).json()
    start = clock()
    with Session(rt.engine) as s:
        for n in range(4):
            usd = Decimal("1.25") * (n + 1)
            data = {"placement_id": "plc-old", "usd": str(usd), "compute_usd": str(usd), "extras_usd": "0"}
            data["spent_usd"] = str(Decimal("1.25") * sum(range(1, n + 2)))
            s.add(
                JobEvent(
                    job_id=job["id"], tenant="demo", at=start + timedelta(minutes=10 * (n + 1)), kind="cost_accrued",
                    message=f"${usd}", data=data,
                )
            )  # fmt: skip
        s.commit()
    raw = [e for e in _events(client, job["id"], fold="false")["items"] if e["kind"] == "cost_accrued"]
    [folded] = [e for e in _events(client, job["id"])["items"] if e["kind"] == "cost_accrued"]
    assert len(raw) == 4 and folded["data"]["accruals"] == 4 and "accruals from" in folded["message"]
    for key in ("usd", "compute_usd", "extras_usd"):
        assert Decimal(folded["data"][key]) == sum(Decimal(e["data"][key]) for e in raw)
    assert folded["data"]["spent_usd"] == raw[-1]["data"]["spent_usd"] == "12.50"


def test_hostile_event_queries_are_422_naming_the_parameter(
    rt: Runtime, client: TestClient, clock: MovableClock
) -> None:
    a = client.post("/v1/jobs", json=job_body()).json()["id"]
    b = client.post("/v1/jobs", json=job_body(name="other")).json()["id"]
    other_event = _events(client, b)["items"][0]["id"]
    for params, name in (
        ({"after": "not-a-cursor"}, "after"),
        ({"after": "²"}, "after"),  # a digit to str.isdigit, not to int()
        ({"after": "9" * 40}, "after"),
        ({"kind": "placed\n"}, "kind"),
        ({"after": other_event}, "after"),  # another job's event is no position in this one
        ({"kind": "Placed!"}, "kind"),
        ({"limit": 0}, "limit"),
        ({"limit": 100000}, "limit"),
    ):
        resp = client.get(f"/v1/jobs/{a}/events", params=params)
        assert resp.status_code == 422 and name in resp.text, (params, resp.text)


def test_a_job_placed_by_a_tick_that_began_before_it_arrived_is_submitted_first(
    rt: Runtime, client: TestClient, clock: MovableClock
) -> None:
    tick(rt, clock())
    clock.advance(minutes=5)
    job_id = client.post("/v1/jobs", json=job_body()).json()["id"]
    tick(rt, clock() - timedelta(minutes=1))  # a tick whose clock was read just before the job came in
    kinds = [e["kind"] for e in _events(client, job_id)["items"]]
    assert kinds[:2] == ["submitted", "placed"], kinds


def test_state_says_starting_then_running_work_counts_down_and_the_ended_job_keeps_its_placement(
    rt: Runtime, client: TestClient, clock: MovableClock
) -> None:
    job_id, seen = _run_a_job(client, rt, clock)
    states = [s["state"] for s in seen]
    assert states[0] == "starting" and seen[0]["placement"] is not None  # simulated instances boot in 3 minutes
    assert "running" in states and states[-1] == "succeeded"
    running = [Decimal(s["remaining_work_hours"]) for s in seen if s["state"] == "running"]
    assert len(running) >= 3 and all(b < a for a, b in pairwise(running))
    done = seen[-1]
    assert Decimal(done["remaining_work_hours"]) == 0
    assert done["placement"] is not None and done["placement"]["state"] == "succeeded"
    [listed] = [j for j in client.get("/v1/jobs").json()["items"] if j["id"] == job_id]
    assert listed["placement"] == done["placement"]
