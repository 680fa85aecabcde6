"""The poison harness's world: two tenants on one broker, acme (who poisons) and beta (who must not notice).

Real parts: the broker's runtime on SQLite or PostgreSQL, its tick, its API (TestClient), a `file://` checkpoint
store holding the tenants' mailboxes, and a scripted cloud (tests/scripted.py) whose instances run the agent
(`boots_agent`), so every placement gets its attempt spec, mailbox and report key exactly as on a real cloud; the
agent's reports are written here, signed with the placement's key as the agent signs them.

`run(world_factory, poison)` plays one fixed script, tick by tick, ten minutes apart:
- tick 0: acme submits A1, beta submits B1 (to complete) and B2 (to cancel); the round places and launches them;
- from tick 1 on, before every tick, `poison(world, tick)` does its worst for acme's job, or for one item;
- tick 2: beta's agent reports progress on B1 (half checkpointed) and beta cancels B2 through the API;
- tick 3: beta's agent reports B1's final outcome, succeeded;
and returns beta's `Outcome`: each job's state after every tick, its events' kinds, its ledger (every row's
amount and kind) and spend. A poison that leaves beta's outcome equal to the clean run's, tick for tick, is held.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from agent import protocol as proto
from broker.api.auth import Role, callback_token, create_key
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import TickReport, tick
from broker.runtime import Runtime, build_runtime
from broker.store.tables import CostEntryRow, Job, JobEvent, Placement
from providers.base import Instance
from tests.builders import job_body
from tests.conftest import T0, MovableClock
from tests.scripted import ScriptedCloud, admin_api, attach

TICKS = 7
STEP = timedelta(minutes=10)


class AgentCloud(ScriptedCloud):
    """A scripted cloud whose instances run the agent. `answers` replaces what `get` says of one instance (a
    function of the honest answer: the poison's), `listing` what `list_instances` adds."""

    boots_agent = True

    def __init__(self, name: str, clock: Callable[[], datetime]) -> None:
        super().__init__(name, clock)
        self.answers: dict[str, Callable[[Instance], Instance]] = {}
        self.poisoned_offerings: list[Any] = []

    def get(self, instance_id: str) -> Instance:
        honest = super().get(instance_id)
        poison = self.answers.get(instance_id)
        return poison(honest) if poison is not None else honest

    def offerings(self, now: datetime) -> list[Any]:
        return [*super().offerings(now), *self.poisoned_offerings]


@dataclass
class World:
    rt: Runtime
    clock: MovableClock
    cloud: AgentCloud
    api: TestClient
    store: Path
    keys: dict[str, str]
    jobs: dict[str, str] = field(default_factory=dict)  # A1, B1, B2 -> job id
    reports: list[TickReport] = field(default_factory=list)
    outcome: Outcome | None = None

    def placement(self, name: str) -> Placement:
        with Session(self.rt.engine) as s:
            rows = s.exec(
                select(Placement).where(Placement.job_id == self.jobs[name]).order_by(col(Placement.created_at))
            ).all()
        return rows[-1]

    def mailbox(self, tenant: str) -> Path:
        return self.store / "tenants" / tenant / "mailbox"

    def put_entry(self, tenant: str, name: str, data: bytes) -> None:
        box = self.mailbox(tenant)
        box.mkdir(parents=True, exist_ok=True)
        (box / name).write_bytes(data)

    def report(self, job: str, kind: proto.ReportKind, seq: int, **fields: Any) -> proto.Report:
        p = self.placement(job)
        r = proto.Report(p.id, seq, kind, self.clock().isoformat(), **fields)
        return r.signed(callback_token(self.rt.settings, p.id))

    def post_report(self, tenant: str, report: proto.Report) -> None:
        self.put_entry(tenant, proto.mailbox_entry_name(report), report.to_json())

    def signed_raw(self, job: str, body: dict[str, Any]) -> bytes:
        """`body` (a report's fields, any values) signed with the job's placement key over its canonical JSON, as
        an agent that signs whatever it sends would: the broker must refuse it for its values, not its signature."""
        p = self.placement(job)
        body = {**REPORT_DEFAULTS, "placement_id": p.id, **body}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return json.dumps({**body, "signature": proto.sign(callback_token(self.rt.settings, p.id), canonical)}).encode()

    def as_tenant(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}


# every field of `agent.protocol.Report` but the signature, at its default: the signature covers them all
REPORT_DEFAULTS: dict[str, Any] = {
    "outcome": None,
    "exit_code": None,
    "detail": "",
    "progress": None,
    "checkpointed": None,
    "notice": None,
    "log_tail": "",
}


def make_world(db_url: str, tmp_path: Path) -> World:
    data, store = tmp_path / "data", tmp_path / "store"
    data.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    if db_url.startswith("sqlite"):
        db_url = f"sqlite:///{data / 'broker.db'}"
    settings = Settings(
        data_dir=data,
        database_url=db_url,
        bootstrap_api_key=DEV_API_KEY,
        simulated=False,
        tick_interval_seconds=600,
        rate_limit_per_second=0,
        checkpoint_stores={"cloud/r1": f"file://{store}/"},
        agent_runtime={"cloud": "process"},
        agent_root=str(tmp_path / "instance"),
        wait_value_usd_per_gpu_hour=0,
    )
    clock = MovableClock(T0)
    rt = build_runtime(settings, clock=clock)
    cloud = AgentCloud("cloud", clock)
    attach(rt, cloud)
    api = admin_api(rt)
    keys = {t: create_key(rt.engine, tenant=t, role=Role.ADMIN, name="k", now=clock()) for t in ("acme", "beta")}
    return World(rt, clock, cloud, api, store, keys)


@dataclass(frozen=True)
class Outcome:
    """What beta saw, tick by tick, and what it was charged."""

    states: tuple[tuple[str, ...], ...]  # per tick: (B1 state, B2 state)
    events: tuple[tuple[str, ...], ...]  # per job: its event kinds in order
    ledger: tuple[tuple[str, str, str], ...]  # (job, kind, USD) summed over its cost entries
    spent: tuple[str, ...]
    failed_steps: tuple[str, ...] = ()  # steps that raised during the run (any tenant's)


Poison = Callable[[World, int], None]


def _submit(w: World, tenant: str) -> str:
    answer = w.api.post("/v1/jobs", json=job_body(command=["true"], work_gpu_hours="1"), headers=w.as_tenant(tenant))
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def run(w: World, poison: Poison | None) -> Outcome:
    """Play the script (module docstring) on world `w`, with `poison` applied before each tick from tick 1."""
    tick(w.rt, w.clock())
    w.jobs = {"A1": _submit(w, "acme"), "B1": _submit(w, "beta"), "B2": _submit(w, "beta")}
    states: list[tuple[str, ...]] = []
    for n in range(TICKS):
        if n:
            w.clock.advance(minutes=STEP.total_seconds() / 60)
        if n >= 1 and poison is not None:
            poison(w, n)
        if n == 2:
            w.post_report("beta", w.report("B1", proto.ReportKind.PROGRESS, 1, checkpointed=0.5))
            cancel = w.api.post(f"/v1/jobs/{w.jobs['B2']}/cancel", headers=w.as_tenant("beta"))
            assert cancel.status_code in (200, 202), cancel.text
        if n == 3:
            done = {"outcome": proto.Outcome.SUCCEEDED, "exit_code": 0, "checkpointed": 1.0}
            w.post_report("beta", w.report("B1", proto.ReportKind.FINAL, 2, **done))
        w.reports.append(tick(w.rt, w.clock()))
        states.append(tuple(_job(w, j).state for j in ("B1", "B2")))
    return Outcome(
        states=tuple(states),
        events=tuple(_events(w, j) for j in ("B1", "B2")),
        ledger=_ledger(w),
        spent=tuple(str(_job(w, j).spent_usd) for j in ("B1", "B2")),
        failed_steps=tuple(sorted({s.name for r in w.reports for s in r.steps if s.error})),
    )


def _job(w: World, name: str) -> Job:
    with Session(w.rt.engine) as s:
        job = s.get(Job, w.jobs[name])
        assert job is not None
        return job


def _events(w: World, name: str) -> tuple[str, ...]:
    with Session(w.rt.engine) as s:
        rows = s.exec(
            select(JobEvent.kind).where(JobEvent.job_id == w.jobs[name]).order_by(col(JobEvent.at), col(JobEvent.id))
        ).all()
    return tuple(rows)


def _ledger(w: World) -> tuple[tuple[str, str, str], ...]:
    names = {w.jobs["B1"]: "B1", w.jobs["B2"]: "B2"}
    with Session(w.rt.engine) as s:
        rows = s.exec(select(CostEntryRow).where(col(CostEntryRow.job_id).in_(list(names)))).all()
    sums: dict[tuple[str, str], Decimal] = {}
    for r in rows:  # summed per job and kind: how accrual cuts a run into rows depends on the placement's id
        key = (names[r.job_id], str(r.kind))
        sums[key] = sums.get(key, Decimal(0)) + r.usd
    return tuple(sorted((job, kind, str(usd)) for (job, kind), usd in sums.items()))
