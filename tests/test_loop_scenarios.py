"""Control-loop scenarios driven through `tick()` with a scripted cloud: run to completion with an exact
ledger, ceilings (wait, pause), preemption and re-placement, capacity failover, cancel, crash repair."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.interrupts import sweep_orphans
from broker.loop.place import _place_one
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import CostEntryRow, Job, Placement
from providers.model import hours_between
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, admin_api, attach


@pytest.fixture
def cloud(clock: MovableClock) -> ScriptedCloud:
    return ScriptedCloud("scripted", clock)


@pytest.fixture
def srt(db_url: str, make_runtime: Callable[..., Runtime], cloud: ScriptedCloud, clock: MovableClock) -> Runtime:
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0)
    attach(rt, cloud)
    tick(rt, clock())
    return rt


@pytest.fixture
def api(srt: Runtime) -> TestClient:
    return admin_api(srt)


def _job(rt: Runtime, job_id: str) -> Job:
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _placements(rt: Runtime, job_id: str) -> list[Placement]:
    with Session(rt.engine) as s:
        return list(s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.id)).all())


def _ledger(rt: Runtime, job_id: str) -> list[CostEntryRow]:
    with Session(rt.engine) as s:
        return list(s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id)).all())


def _run(rt: Runtime, clock: MovableClock, ticks: int, minutes: float = 10) -> None:
    for _ in range(ticks):
        clock.advance(minutes=minutes)
        tick(rt, clock())


def test_job_runs_to_completion_with_exact_ledger(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("12.5"), "z2": Decimal("10.25")}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="2", max_total_usd="50")).json()["id"]
    tick(srt, clock())
    job = api.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "starting"  # placed; its instance is not up yet
    assert job["placement"]["zone"] == "z2"
    _run(srt, clock, 15)
    job = api.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "succeeded"
    assert job["placement"]["zone"] == "z2" and job["placement"]["state"] == "succeeded"  # where it ran
    [p] = _placements(srt, job_id)
    assert p.started_at is not None and p.ended_at is not None
    entries = _ledger(srt, job_id)
    total = sum((e.usd for e in entries), Decimal("0"))
    assert total == Decimal("10.25") * hours_between(p.started_at, p.ended_at) == Decimal("20.5")
    assert Decimal(job["spent_usd"]) == total == p.cost_usd
    kinds = [e["kind"] for e in api.get(f"/v1/jobs/{job_id}/events", params={"fold": "false"}).json()["items"]]
    assert kinds[:4] == ["submitted", "placed", "launched", "started"]
    assert kinds[-1] in ("finished", "cost_accrued")
    # one cost event for the placement, written by the accrual that reaches its end, however many entries
    assert "finished" in kinds and kinds.count("cost_accrued") == 1 < len(entries)
    [accrual] = [e for e in api.get(f"/v1/jobs/{job_id}/events").json()["items"] if e["kind"] == "cost_accrued"]
    assert Decimal(accrual["data"]["usd"]) == total == Decimal(accrual["data"]["spent_usd"])


def test_price_change_mid_run_is_accrued_at_the_new_price_from_the_tick_that_sees_it(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("11")}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="2", max_total_usd="100")).json()["id"]
    tick(srt, clock())
    _run(srt, clock, 6)  # one hour at $10
    cloud.prices["z1"] = Decimal("14")
    _run(srt, clock, 7)  # the next tick (1 h 10) sees $14: the 50 minutes after it at $14
    assert _job(srt, job_id).state == "succeeded"
    total = sum((e.usd for e in _ledger(srt, job_id)), Decimal("0"))
    assert total == Decimal("11.6666666667") + Decimal("11.6666666667")


def test_job_over_its_ceiling_waits_with_the_reason(srt: Runtime, api: TestClient, clock: MovableClock) -> None:
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="10", max_total_usd="20")).json()["id"]
    _run(srt, clock, 2)
    job = api.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "pending"
    assert job["wait_reason"].startswith("over_total_ceiling")
    assert _placements(srt, job_id) == []
    hourly = api.post("/v1/jobs", json=job_body(max_hourly_usd="5")).json()["id"]
    tick(srt, clock())
    assert api.get(f"/v1/jobs/{hourly}").json()["wait_reason"].startswith("over_hourly_ceiling")


def test_price_spike_pauses_job_before_it_overspends(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("10")}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="3", max_total_usd="36")).json()["id"]
    tick(srt, clock())
    _run(srt, clock, 6)
    cloud.prices = {"z1": Decimal("30"), "z2": Decimal("30")}
    _run(srt, clock, 12)
    job = _job(srt, job_id)
    assert job.state == "paused"
    assert "max_total_usd" in job.wait_reason
    spent = sum((e.usd for e in _ledger(srt, job_id)), Decimal("0"))
    assert spent == job.spent_usd <= Decimal("36")
    assert cloud.running() == []


def test_a_job_paused_at_its_ceiling_resumes_when_the_ceiling_is_raised(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("10")}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="3", max_total_usd="36")).json()["id"]
    tick(srt, clock())
    _run(srt, clock, 6)
    cloud.prices = {"z1": Decimal("30"), "z2": Decimal("30")}
    _run(srt, clock, 12)
    assert _job(srt, job_id).state == "paused"
    spent = _job(srt, job_id).spent_usd
    too_low = api.patch(f"/v1/jobs/{job_id}", json={"max_total_usd": str((spent - 1).quantize(Decimal("0.01")))})
    assert too_low.status_code == 422 and "already spent" in too_low.json()["message"]
    resp = api.patch(f"/v1/jobs/{job_id}", json={"max_total_usd": "120"})
    assert resp.status_code == 200 and resp.json()["state"] == "pending"
    _run(srt, clock, 20)
    job = _job(srt, job_id)
    assert job.state == "succeeded"
    total = sum((e.usd for e in _ledger(srt, job_id)), Decimal("0"))
    assert total == job.spent_usd <= Decimal("120")
    kinds = [e["kind"] for e in api.get(f"/v1/jobs/{job_id}/events").json()["items"]]
    assert kinds.index("paused") < kinds.index("updated") < kinds.index("resumed") < kinds.index("finished")


def test_preemption_replaces_job_elsewhere_with_remaining_work(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("11")}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="100")).json()["id"]
    tick(srt, clock())
    _run(srt, clock, 8)  # 80 minutes: one 30-minute checkpoint interval twice over
    [first] = _placements(srt, job_id)
    assert first.instance_id is not None
    cloud.preempt(first.instance_id)
    tick(srt, clock())
    job = _job(srt, job_id)
    assert job.remaining_work_hours == Decimal("3")  # 4 h minus the 1 h its last checkpoint saved
    tick(srt, clock())
    placements = _placements(srt, job_id)
    assert placements[0].state == "preempted"
    assert placements[1].zone == "z2"  # the preempted zone is avoided for a while
    _run(srt, clock, 20)
    job = _job(srt, job_id)
    assert job.state == "succeeded" and job.attempts == 2
    events = [e["kind"] for e in api.get(f"/v1/jobs/{job_id}/events").json()["items"]]
    assert "preempted" in events and events.count("placed") == 2


def test_capacity_error_blocklists_zone_and_fails_over(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("11")}
    cloud.no_capacity = {"z1"}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body()).json()["id"]
    for _ in range(3):
        tick(srt, clock())
    placements = _placements(srt, job_id)
    assert (placements[0].zone, placements[0].state) == ("z1", "failed")
    assert placements[1].zone == "z2" and placements[1].state == "running"
    quote = api.post("/v1/quotes", json=job_body()).json()
    assert {r["reason"] for r in quote["rejections"]} == {"blocklisted"}


def test_cancel_stops_the_instance(srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock) -> None:
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="5", max_total_usd="100")).json()["id"]
    tick(srt, clock())
    assert len(cloud.running()) == 1
    api.post(f"/v1/jobs/{job_id}/cancel")
    _run(srt, clock, 1)
    assert cloud.running() == []
    [p] = _placements(srt, job_id)
    assert p.state == "stopped"
    assert _job(srt, job_id).state == "cancelled"


def test_crash_between_record_and_launch_is_repaired_once(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    job_id = api.post("/v1/jobs", json=job_body()).json()["id"]
    placement_id, _ = _place_one(srt, job_id, srt.catalog.book(clock()), frozenset(), clock())  # no launch: "crash"
    assert placement_id is not None and cloud.vms == {}
    tick(srt, clock())
    tick(srt, clock())
    assert len(cloud.vms) == 1
    [p] = _placements(srt, job_id)
    assert p.instance_id == "vm-1" and p.state == "running"


def test_job_cancelled_between_record_and_launch_launches_nothing(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    job_id = api.post("/v1/jobs", json=job_body()).json()["id"]
    placement_id, _ = _place_one(srt, job_id, srt.catalog.book(clock()), frozenset(), clock())  # no launch: "crash"
    assert placement_id is not None
    assert api.post(f"/v1/jobs/{job_id}/cancel").json()["state"] == "cancelled"
    tick(srt, clock.advance(minutes=1))
    tick(srt, clock.advance(minutes=1))
    assert cloud.launch_calls == 0 and cloud.vms == {}, "no instance is started for a cancelled job"
    [p] = _placements(srt, job_id)
    assert (p.state, p.instance_id, p.ended_at) == ("stopped", None, clock.now - timedelta(minutes=1))
    assert _job(srt, job_id).state == "cancelled"
    assert _ledger(srt, job_id) == []


def test_a_pool_that_refuses_a_jobs_launch_as_invalid_is_not_tried_again_for_it(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    """z1 is the cheapest pool, but refuses this job's configuration (EC2 `Unsupported`, say): the job moves to z2
    for good, without a launch attempt at z1 every tick; another job is still free to try z1."""
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("11")}
    cloud.invalid = {"z1"}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="100")).json()["id"]
    tick(srt, clock.advance(minutes=1))  # placed on z1, refused
    tick(srt, clock.advance(minutes=1))  # placed on z2
    for _ in range(3):
        tick(srt, clock.advance(minutes=10))
    first, second = _placements(srt, job_id)
    assert (first.zone, first.state) == ("z1", "failed") and first.detail.startswith("InvalidRequest:")
    assert (second.zone, second.state) == ("z2", "running")
    assert [r.offering.zone for r in cloud.requests] == ["z1", "z2"]
    cloud.invalid = set()
    other = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="100")).json()["id"]
    tick(srt, clock.advance(minutes=1))
    [placement] = _placements(srt, other)
    assert placement.zone == "z1", "the refusal was about the first job's request, not the pool for everyone"


def test_interruption_notice_replaces_before_the_reclaim(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("11")}
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="100")).json()["id"]
    tick(srt, clock())
    _run(srt, clock, 4)  # 40 minutes: one 30-minute checkpoint saved
    [first] = _placements(srt, job_id)
    assert first.instance_id is not None
    cloud.warn(first.instance_id, minutes=2)
    cloud.warn(first.instance_id, minutes=2)  # delivered twice: at-least-once queues repeat themselves
    tick(srt, clock())
    placements = _placements(srt, job_id)
    assert placements[0].state == "preempted" and len(placements) == 2
    assert placements[1].zone == "z2"  # re-placed in the same tick, away from the warned zone
    job = _job(srt, job_id)
    assert job.remaining_work_hours == Decimal("3.5") and job.attempts == 2
    kinds = [e["kind"] for e in api.get(f"/v1/jobs/{job_id}/events").json()["items"]]
    assert kinds.count("interruption_notice") == 1


def test_orphan_instances_are_terminated_after_the_grace_period(
    srt: Runtime, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    from providers.base import LaunchRequest
    from providers.model import Tags
    from tests.builders import spec

    orphan = cloud.launch(
        LaunchRequest(
            offering=cloud.offerings(clock())[0],
            launch_token="lost-token",
            tags=Tags(srt.settings.broker_id, "job-x", "plc-x"),
            spec=spec(),
            remaining_work_hours=Decimal("50"),
        )
    )
    srt.marks.clear()
    tick(srt, clock())
    assert cloud.get(orphan.id).state.value == "running"  # too young: it may be a launch being recorded
    clock.advance(minutes=11)
    srt.marks.clear()
    report = tick(srt, clock())
    assert report.count("sweep_orphans") == 1
    assert cloud.get(orphan.id).state.value == "terminated"


def test_a_second_instance_of_a_recorded_launch_token_is_swept_as_an_orphan(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    """A cloud that forgot a token's first launch (an expired idempotency window) starts a duplicate on a retry: the
    token spares only the launch its placement has not recorded yet, never a second instance beside it."""
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="100")).json()["id"]
    tick(srt, clock())
    [p] = _placements(srt, job_id)
    assert p.instance_id is not None
    cloud.remembers_tokens = False
    duplicate = cloud.launch(cloud.requests[-1])
    assert duplicate.id != p.instance_id and duplicate.launch_token == p.launch_token
    clock.advance(minutes=11)
    srt.marks.clear()
    report = tick(srt, clock())
    assert report.count("sweep_orphans") == 1
    assert cloud.get(duplicate.id).state.value == "terminated"
    assert cloud.get(p.instance_id).state.value == "running"
    [still] = _placements(srt, job_id)
    assert still.state == "running" and still.instance_id == p.instance_id


def test_an_unrecorded_launch_is_spared_by_its_token(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    """The instance of a live placement whose answer never arrived (no instance id recorded) is not an orphan."""
    tick(srt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="100")).json()["id"]
    tick(srt, clock())
    [p] = _placements(srt, job_id)
    with Session(srt.engine) as session:  # as if the launch's answer was lost before its record
        row = session.get(Placement, p.id)
        assert row is not None
        row.instance_id = None
        row.state = "launching"
        session.add(row)
        session.commit()
    clock.advance(minutes=11)
    srt.marks.clear()
    instance_id = p.instance_id
    assert instance_id is not None
    assert sweep_orphans(srt, clock()) == 0
    assert cloud.get(instance_id).state.value == "running"


def test_reported_exit_status_decides_the_verdict(
    db_url: str, make_runtime: Callable[..., Runtime], cloud: ScriptedCloud, clock: MovableClock
) -> None:
    from broker.api.auth import callback_token

    rt = make_runtime(db_url, simulated=False, public_url="https://broker.example")
    attach(rt, cloud)
    tick(rt, clock())
    api = TestClient(create_app(runtime=rt))
    api.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="100")).json()["id"]
    tick(rt, clock())
    [p] = _placements(rt, job_id)
    url = f"/v1/placements/{p.id}/exit"
    assert api.post(url, json={"exit_code": 3}, headers={"X-Overspill-Callback-Token": "forged"}).status_code == 403
    token = callback_token(rt.settings, p.id)
    assert api.post(url, json={"exit_code": 3}, headers={"X-Overspill-Callback-Token": token}).status_code == 204
    assert api.post(url, json={"exit_code": 0}, headers={"X-Overspill-Callback-Token": token}).status_code == 204
    assert p.instance_id is not None
    cloud.terminate(p.instance_id)  # the instance powered itself off after reporting
    tick(rt, clock())
    job = _job(rt, job_id)
    assert job.state == "failed" and "exited 3" in job.wait_reason  # not re-run: its own command failed
    assert len(_placements(rt, job_id)) == 1


def test_preempted_twice_falls_back_to_on_demand_and_meets_the_deadline(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    """4 h of work due in 5 h 30 min, spot at $3 in z1 and z2, on-demand at $8 in z3 (10-minute ticks, 0.1 h
    restart, 30-minute checkpoints, and this cloud gives no interruption notice: a reclaim can lose 30 min).

    The margin for spot is 2 x 0.1 h + 0.5 h (the work a reclaim can lose) rounded up to ticks, plus a tick: 1 h.
    t=0: slack 1.5 h -> spot z1. Reclaimed at 50 min (30 min saved, 3.5 h left): slack 1.17 h -> spot again, in
    z2 (z1 was just reclaimed). Reclaimed at 100 min (3 h left): slack 0.83 h < margin -> the on-demand pool,
    which finishes at 4 h 40 min, before the deadline, for $5 of spot + $24 on-demand <= $60.
    """
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3")}
    cloud.on_demand = {"z3": Decimal("8")}
    tick(srt, clock())
    deadline = clock() + timedelta(hours=5, minutes=30)
    job_id = api.post(
        "/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="60", deadline=deadline.isoformat())
    ).json()["id"]
    tick(srt, clock())
    for _ in range(2):
        _run(srt, clock, 5)
        [live] = [p for p in _placements(srt, job_id) if p.state == "running"]
        assert live.capacity_type == "spot" and live.instance_id is not None
        cloud.preempt(live.instance_id)
        tick(srt, clock())
    tick(srt, clock())
    placements = _placements(srt, job_id)
    assert [(p.zone, p.capacity_type, p.state) for p in placements] == [
        ("z1", "spot", "preempted"),
        ("z2", "spot", "preempted"),
        ("z3", "on_demand", "running"),
    ]
    _run(srt, clock, 20)
    job = _job(srt, job_id)
    assert job.state == "succeeded"
    assert job.finished_at is not None and job.finished_at <= deadline
    spent = sum((e.usd for e in _ledger(srt, job_id)), Decimal("0"))
    assert spent == job.spent_usd <= Decimal("60")
    assert spent == Decimal("29")  # 100 min of spot at $3 + 3 h of on-demand at $8


def test_deadline_job_whose_budget_cannot_finish_is_paused_with_the_numbers(
    srt: Runtime, api: TestClient, cloud: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3")}
    tick(srt, clock())
    deadline = (clock() + timedelta(hours=10)).isoformat()
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="10", deadline=deadline)).json()["id"]
    tick(srt, clock())
    job = api.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "paused"
    assert "max_total_usd $10" in job["wait_reason"] and "cannot finish" in job["wait_reason"]
    assert _placements(srt, job_id) == [] and cloud.vms == {}


def test_a_ceiling_inside_the_unaccrued_stretch_still_stops_the_job_in_time(
    db_url: str, make_runtime: Callable[..., Runtime], cloud: ScriptedCloud, clock: MovableClock
) -> None:
    """Accrual on an hour's cadence: the ledger trails the spend by up to an hour, and the ceiling (lowered
    mid-run) falls inside that stretch. The ceiling guard, a lowered ceiling's check and the team's budget all
    count the stretch the ledger does not hold yet, so the job is paused before it could overspend."""
    rt = attach(
        make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0, accrual_cadence_seconds=3600), cloud
    )
    api = admin_api(rt)
    cloud.prices = {"z1": Decimal("10"), "z2": Decimal("10")}
    tick(rt, clock())
    budget = api.post("/v1/budgets", json={"scope": "team", "name": "vision", "amount_usd": "1000"}).json()
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="3", max_total_usd="36")).json()["id"]
    tick(rt, clock())
    _run(rt, clock, 2)
    [p] = _placements(rt, job_id)
    assert p.started_at is not None
    for _ in range(7):  # on to a tick where the ledger trails by $4 or more (it accrues at one point an hour)
        ran = 10 * hours_between(p.started_at, clock())  # what it has cost so far, at $10/h
        if ran - _job(rt, job_id).spent_usd >= 4:
            break
        _run(rt, clock, 1)
    assert _job(rt, job_id).state == "running" and ran - _job(rt, job_id).spent_usd >= 4
    assert Decimal(api.get(f"/v1/budgets/{budget['id']}").json()["spent_usd"]) >= ran
    below = api.patch(f"/v1/jobs/{job_id}", json={"max_total_usd": str((ran - 1).quantize(Decimal("0.01")))})
    assert below.status_code == 422 and "already spent" in below.json()["message"]
    ceiling = (ran + 2).quantize(Decimal("0.01"))  # above what it spent, below it + one accrual cadence
    assert api.patch(f"/v1/jobs/{job_id}", json={"max_total_usd": str(ceiling)}).status_code == 200
    _run(rt, clock, 12)
    job = _job(rt, job_id)
    assert job.state == "paused" and "max_total_usd" in job.wait_reason
    spent = sum((e.usd for e in _ledger(rt, job_id)), Decimal("0"))
    assert 0 < spent == job.spent_usd <= ceiling
    assert cloud.running() == []
