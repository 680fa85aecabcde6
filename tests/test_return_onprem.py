"""Pressure drops and cloud work returns on-prem, driven through `tick()` with a scripted cloud and a scripted
on-prem cluster whose queue wait the test sets.

Numbers used throughout: a 1-GPU job of 4 GPU-hours; the cloud pool costs $10/h, the on-prem pool $2/h at its
internal rate; waiting is worth $5 per GPU-hour. With 10 h of on-prem queue the on-prem pool scores
4 x $2 + 10 h x $5 = $58 against the cloud's 4.05 h x $10 = $40.50, so the job bursts to the cloud. When the
queue drains (wait 0) the on-prem pool scores $8 for the whole job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.loop import return_onprem as return_onprem_step
from broker.loop.feeds import refresh_prices
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import CostEntryRow, Job, JobEvent, Placement
from federation.strategies import Plan, RunState
from pricing.book import PriceBook
from providers.base import Instance
from providers.model import CapacityType, Offering
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, admin_api


@pytest.fixture
def cloud(clock: MovableClock) -> ScriptedCloud:
    c = ScriptedCloud("aws", clock, zones=("us-east-1a",), region="us-east-1")
    c.prices = {"us-east-1a": Decimal("10")}
    return c


@pytest.fixture
def onprem(clock: MovableClock) -> ScriptedCloud:
    c = ScriptedCloud("dc", clock, zones=("dc1",), region="dc1", capacity=CapacityType.ON_PREM)
    c.prices = {"dc1": Decimal("2")}
    c.wait_hours = 10.0
    return c


@pytest.fixture
def rt(
    db_url: str, make_runtime: Callable[..., Runtime], cloud: ScriptedCloud, onprem: ScriptedCloud, clock: MovableClock
) -> Runtime:
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=5.0)  # ticks are 600 s
    for source in (cloud, onprem):
        rt.providers[source.name] = source
        rt.offering_sources.append(source)
    tick(rt, clock())
    return rt


@pytest.fixture
def api(rt: Runtime) -> TestClient:
    return admin_api(rt)


def _run(rt: Runtime, clock: MovableClock, ticks: int) -> None:
    for _ in range(ticks):
        clock.advance(minutes=10)
        tick(rt, clock())


def _placements(rt: Runtime, job_id: str) -> list[Placement]:
    with Session(rt.engine) as s:
        return list(s.exec(select(Placement).where(Placement.job_id == job_id).order_by(Placement.created_at)).all())


def _events(rt: Runtime, job_id: str) -> list[str]:
    with Session(rt.engine) as s:
        return [e.kind for e in s.exec(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))]


def _submit(api: TestClient, rt: Runtime, clock: MovableClock) -> str:
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="4", max_total_usd="100")).json()["id"]
    tick(rt, clock())
    [first] = _placements(rt, job_id)
    assert first.provider == "aws", "with 10 h of on-prem queue the job bursts to the cloud"
    return job_id


def test_running_job_returns_on_prem_at_its_next_checkpoint(
    rt: Runtime, api: TestClient, cloud: ScriptedCloud, onprem: ScriptedCloud, clock: MovableClock
) -> None:
    job_id = _submit(api, rt, clock)
    _run(rt, clock, 4)  # 40 minutes in the cloud: one checkpoint, at 30
    onprem.wait_hours = 0.0  # the on-prem queue drains
    _run(rt, clock, 1)  # at 50 minutes: 20 minutes since the checkpoint, more than a tick's worth: wait
    assert [p.provider for p in _placements(rt, job_id)] == ["aws"]
    assert _events(rt, job_id).count("return_planned") == 1
    _run(rt, clock, 1)  # at 60 minutes the job checkpoints: stop it now and place it on-prem
    cloud_p, onprem_p = _placements(rt, job_id)
    assert cloud_p.state == "stopped" and onprem_p.provider == "dc"
    assert onprem_p.work_hours_at_start == Decimal("3")  # 4 h less the hour its checkpoint saved
    events = _events(rt, job_id)
    assert events.count("return_planned") == 1 and "returning_onprem" in events
    assert [vm.instance.state.value for vm in cloud.vms.values()] == ["terminated"]

    _run(rt, clock, 20)
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == "succeeded"
        ledger = s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id)).all()
    # 1 h in the cloud at $10, then 3 h on-prem at $2
    assert sum((e.usd for e in ledger), Decimal(0)) == job.spent_usd == Decimal("16.00")


def test_job_not_started_in_the_cloud_returns_at_once_with_all_its_work(
    rt: Runtime, api: TestClient, cloud: ScriptedCloud, onprem: ScriptedCloud, clock: MovableClock
) -> None:
    cloud.slow_start = {"us-east-1a"}  # the cloud instance stays pending
    job_id = _submit(api, rt, clock)
    onprem.wait_hours = 0.0
    _run(rt, clock, 1)
    cloud_p, onprem_p = _placements(rt, job_id)
    assert cloud_p.state == "stopped" and cloud_p.started_at is None and cloud_p.cost_usd == 0
    assert onprem_p.provider == "dc" and onprem_p.work_hours_at_start == Decimal("4")
    assert "return_planned" not in _events(rt, job_id)


def test_cloud_work_stays_while_on_prem_is_busy_or_moving_saves_too_little(
    rt: Runtime, api: TestClient, cloud: ScriptedCloud, onprem: ScriptedCloud, clock: MovableClock
) -> None:
    job_id = _submit(api, rt, clock)
    onprem.wait_hours = 2.0  # drained a little, not enough: 2 h x $5 + $6 > $30 of cloud left at 60 min
    _run(rt, clock, 21)  # to 3.5 h: the checkpoint at 3.5 h leaves 0.5 h of work
    assert [p.provider for p in _placements(rt, job_id)] == ["aws"]
    onprem.wait_hours = 0.0  # now free, but finishing 0.5 h costs $5.50 in the cloud vs $1.20 after a restart
    _run(rt, clock, 3)
    assert [p.provider for p in _placements(rt, job_id)] == ["aws"]
    assert "returning_onprem" not in _events(rt, job_id)


def test_jobs_no_open_pool_would_take_back_are_screened_out_before_the_placement_policy(
    rt: Runtime,
    api: TestClient,
    onprem: ScriptedCloud,
    clock: MovableClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    policy = return_onprem_step.choose_pool

    def spy(rt: Runtime, session: Session, job: Job, *args: object, **kwargs: object) -> object:
        asked.append(job.id)
        return policy(rt, session, job, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(return_onprem_step, "choose_pool", spy)
    job_id = _submit(api, rt, clock)
    onprem.wait_hours = 0.0
    onprem.prices = {"dc1": Decimal("12")}  # free, but dearer than the $10/h cloud: moving can never pay
    _run(rt, clock, 3)
    assert asked == [] and [p.provider for p in _placements(rt, job_id)] == ["aws"]
    onprem.prices = {"dc1": Decimal("2")}  # now it pays: the job passes the screen and the policy decides
    _run(rt, clock, 3)
    assert asked and set(asked) == {job_id}
    assert [p.provider for p in _placements(rt, job_id)] == ["aws", "dc"]


def test_a_job_is_screened_again_only_when_its_inputs_moved(
    rt: Runtime,
    api: TestClient,
    cloud: ScriptedCloud,
    onprem: ScriptedCloud,
    clock: MovableClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A steady tick costs a dict lookup per cloud job: one found to stay is screened again only when its pool's
    price rose, an on-prem pool got cheaper (or opened), it saved a checkpoint (less work left) or the job itself
    changed; never twice on the same inputs."""
    screened: list[tuple[Decimal | None, Decimal]] = []  # (its checkpointed work, its pool's price) when screened
    screen = return_onprem_step._could_return

    def spy(
        rt: Runtime, p: Placement, job: Job, spec: object, inst: Instance, current: Offering, *args: object
    ) -> bool:
        screened.append((inst.checkpointed_work_hours, current.price.hourly_usd))
        return screen(rt, p, job, spec, inst, current, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(return_onprem_step, "_could_return", spy)
    job_id = _submit(api, rt, clock)
    onprem.wait_hours = 0.0
    onprem.prices = {"dc1": Decimal("12")}  # free, but dearer than the $10/h cloud: moving can never pay
    _run(rt, clock, 2)
    assert screened
    screened.clear()
    for _ in range(7):
        _run(rt, clock, 1)
        assert len(screened) == len(set(screened)) <= 3  # at most once per checkpoint (every 30 min)
    cloud.prices = {"us-east-1a": Decimal("9")}  # staying got cheaper: the verdict still stands
    before = len(screened)
    _run(rt, clock, 1)
    assert all(price == 10 for _, price in screened[before:])  # a checkpoint's screen, if any, was at $10
    cloud.prices = {"us-east-1a": Decimal("11")}  # staying got dearer: screened again at once (it still stays)
    _run(rt, clock, 1)
    assert screened[-1][1] == 11
    before = len(screened)
    assert api.patch(f"/v1/jobs/{job_id}", json={"max_total_usd": "150"}).status_code == 200  # its own change
    _run(rt, clock, 1)
    assert len(screened) == before + 1
    onprem.prices = {"dc1": Decimal("2")}  # on-prem got cheaper: screened again, and now it moves
    _run(rt, clock, 3)
    assert [p.provider for p in _placements(rt, job_id)] == ["aws", "dc"]


def test_the_return_check_never_explains_a_job_it_cannot_place(
    rt: Runtime,
    api: TestClient,
    onprem: ScriptedCloud,
    clock: MovableClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When no pool fits a running cloud job right now, the check moves on: it does not build the full `quote`
    (every pool of the job's accelerators judged) whose explanation it would throw away, every tick, per job."""
    from datetime import timedelta

    import broker.loop.place as place_module
    from broker.loop.common import block
    from broker.loop.return_onprem import return_onprem

    job_id = _submit(api, rt, clock)
    _run(rt, clock, 1)
    onprem.wait_hours = 0.0  # on-prem is open again, but now too dear for what is left of the ceiling
    onprem.prices = {"dc1": Decimal("1000")}
    _run(rt, clock, 1)  # the new on-prem price is in the catalog
    with Session(rt.engine) as s:
        block(s, "aws", clock() + timedelta(hours=1), "test: the cloud pool is out of the choice too")
        s.commit()

    def no_quote(*_: object) -> object:
        raise AssertionError("quote() built for a job the return check only asks about")

    monkeypatch.setattr(place_module, "quote", no_quote)
    assert return_onprem(rt, clock()) == 0
    assert [p.provider for p in _placements(rt, job_id)] == ["aws"]


def test_a_job_the_placement_policy_keeps_in_the_cloud_is_remembered_as_its_verdict(
    rt: Runtime, api: TestClient, cloud: ScriptedCloud, onprem: ScriptedCloud, clock: MovableClock
) -> None:
    """On-prem drains and would take the job back by the return rule, but the placement policy cannot put this
    tenant there (the cluster refuses it): the job stays, and the verdict is kept as the policy's, not asked again
    until its inputs move."""
    job_id = _submit(api, rt, clock)
    _run(rt, clock, 4)
    onprem.wait_hours = 0.0
    onprem.refuses_tenant = lambda tenant: "no submit identity for this tenant"  # type: ignore[attr-defined]
    _run(rt, clock, 1)
    [placement] = _placements(rt, job_id)
    assert placement.provider == "aws" and placement.state == "running"
    assert rt.return_memo[placement.id][1] == "policy"


@dataclass
class Told:
    """A deadline policy that records the reclaims each question tells it of, and answers as `inner` does."""

    inner: Any
    reclaims: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        self.reclaims.append(len(state.preemptions))
        return self.inner.decide(state, book)  # type: ignore[no-any-return]


def test_the_screen_tells_the_deadline_policy_of_each_jobs_reclaims(
    rt: Runtime, api: TestClient, cloud: ScriptedCloud, onprem: ScriptedCloud, clock: MovableClock
) -> None:
    """The screen reads every screened job's reclaims in one query; the policy still hears of each job's own."""
    cloud.on_demand = {"us-east-1b": Decimal("12")}  # where the policy goes once the spot zone has been reclaimed
    deadline = (clock() + timedelta(hours=8)).isoformat()  # too soon to wait out 10 h of on-prem queue
    body = job_body(work_gpu_hours="4", max_total_usd="100", deadline=deadline)
    job_id = api.post("/v1/jobs", json=body).json()["id"]
    tick(rt, clock())
    [first] = _placements(rt, job_id)
    assert first.provider == "aws" and first.instance_id
    cloud.preempt(first.instance_id)
    _run(rt, clock, 2)  # the reclaim is seen and the job placed again, in the cloud
    assert [p.provider for p in _placements(rt, job_id)] == ["aws", "aws"], _events(rt, job_id)
    told = Told(rt.deadline_strategy())
    rt.deadline_policy = told
    onprem.wait_hours = 0.0
    refresh_prices(rt, clock(), force=True)  # the book now shows the on-prem queue drained
    assert return_onprem_step.return_onprem(rt, clock()) == 1, "on-prem at $2/h against on-demand at $12/h"
    assert told.reclaims and set(told.reclaims) == {1}, told.reclaims


def test_a_fresh_process_asks_the_policy_about_at_most_return_checks_per_tick_jobs_per_tick(
    rt: Runtime, api: TestClient, cloud: ScriptedCloud, onprem: ScriptedCloud, clock: MovableClock
) -> None:
    """Three jobs that would all return, with `return_checks_per_tick` 2: two are asked (and return) in the first
    tick, the third in the next, none forgotten."""
    cloud.slow_start = {"us-east-1a"}  # pending in the cloud: each returns as soon as the policy is asked
    jobs = [_submit(api, rt, clock) for _ in range(3)]
    rt.settings = rt.settings.model_copy(update={"return_checks_per_tick": 2})
    onprem.wait_hours = 0.0
    refresh_prices(rt, clock(), force=True)
    assert return_onprem_step.return_onprem(rt, clock()) == 2
    assert sum(_placements(rt, j)[0].state == "stopped" for j in jobs) == 2
    assert return_onprem_step.return_onprem(rt, clock()) == 1
    assert [_placements(rt, j)[0].state for j in jobs] == ["stopped"] * 3
