"""The orphan sweep converges on the built-in simulated providers: over many passes it terminates each orphan
exactly once, and never "terminates" an instance that already ended (a finished job's, a reclaimed spot one's).

Before the fix the sweep re-terminated every ended instance on every pass (one demo logged 2,671 such warnings)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.loop.interrupts import sweep_orphans
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import Job
from providers.base import LaunchRequest
from providers.model import CapacityType, Tags
from tests.builders import job_body, spec
from tests.conftest import MovableClock


def _count_terminations(rt: Runtime) -> Counter[tuple[str, str]]:
    """Wrap every provider's `terminate` to count the calls per (provider, instance)."""
    calls: Counter[tuple[str, str]] = Counter()
    for provider in rt.providers.values():

        def counted(instance_id: str, _p: object = provider, _real: Callable[[str], None] = provider.terminate) -> None:
            calls[(_p.name, instance_id)] += 1  # type: ignore[attr-defined]
            _real(instance_id)

        provider.terminate = counted  # type: ignore[method-assign]
    return calls


def _orphan(rt: Runtime, clock: MovableClock, token: str, work_hours: str) -> str:
    """Launch an instance carrying this broker's tags that no placement records (a crash after the launch)."""
    cloud = rt.providers["sim-aws"]
    offering = next(
        o
        for o in cloud.offerings(clock())  # type: ignore[attr-defined]
        if o.capacity_type is CapacityType.ON_DEMAND and o.accelerator == "A100"
    )
    inst = cloud.launch(
        LaunchRequest(
            offering=offering,
            launch_token=token,
            tags=Tags(rt.settings.broker_id, f"job-{token}", f"plc-{token}"),
            spec=spec(),
            remaining_work_hours=Decimal(work_hours),
        )
    )
    return inst.id


def test_the_sweep_terminates_each_orphan_once_and_never_an_ended_instance(
    rt: Runtime, client: TestClient, clock: MovableClock, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(4):
        assert client.post("/v1/jobs", json=job_body(name=f"j{i}", work_gpu_hours="1")).status_code == 202
    running_orphan = _orphan(rt, clock, "lost-long", "50")
    ended_orphan = _orphan(rt, clock, "lost-short", "0.2")  # its work runs out before the grace period ends
    calls = _count_terminations(rt)
    for _ in range(24):  # 8 simulated hours in 20-minute ticks: the jobs finish, the sweep runs every pass
        clock.advance(minutes=20)
        rt.marks.pop("sweep_orphans", None)
        tick(rt, clock())
        rt.marks.pop("sweep_orphans", None)
        sweep_orphans(rt, clock())  # a second pass at the same time: nothing new to do
    with Session(rt.engine) as session:
        states = {j.state for j in session.exec(select(Job)).all()}
    assert states == {"succeeded"}, states
    assert calls[("sim-aws", running_orphan)] == 1
    assert calls[("sim-aws", ended_orphan)] == 0, "an instance that already ended holds nothing to terminate"
    swept = [r for r in caplog.records if r.getMessage().startswith("terminated orphan instance")]
    assert len(swept) == 1 and running_orphan in swept[0].getMessage()
    # every other termination came from the jobs' own lifecycle, at most once per instance
    assert all(n == 1 for n in calls.values()), calls
    # and later passes find nothing at all
    clock.advance(hours=1)
    rt.marks.pop("sweep_orphans", None)
    assert sweep_orphans(rt, clock()) == 0
