"""Shard leases (broker.store.shards): tick replicas split the shards disjointly and cover all of them, a replica that
stops has its shards taken over once its leases run out, the SQL shard filter agrees with `shard_of`, and with two
replicas ticking each placement is synced and accrued by the replica holding its shard, never twice."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import pytest
from sqlalchemy import column, table, text
from sqlalchemy import select as core_select
from sqlmodel import Session, col, select

from broker.api.schemas import JobCreate
from broker.finance.ledger import LEDGER_QUANTUM
from broker.loop.interrupts import sweep_orphans
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.services.jobs import new_id, submit_job
from broker.store.shards import SHARDS, ShardScope, claim_shards, release_shards, shard_of
from broker.store.tables import CostEntryRow, Job, Placement, TickShard
from providers.model import hours_between
from tests.builders import job_body
from tests.conftest import MovableClock

LEASE = timedelta(seconds=30)


@pytest.fixture
def quiet(rt: Runtime) -> None:
    """The `rt` fixture ticked once (so it holds every shard): it stops cleanly, leaving the leases to a test's
    own replica names."""
    release_shards(rt.engine, rt.replica_id)


def _rounds(rt: Runtime, replicas: list[str], now: datetime, rounds: int = 3) -> dict[str, ShardScope]:
    """Each replica claims in turn, `rounds` times (a tick each, 1 s apart): what each holds at the end."""
    held: dict[str, ShardScope] = {}
    for _ in range(rounds):
        for name in replicas:
            held[name] = claim_shards(rt.engine, name, now, LEASE)
        now += timedelta(seconds=1)
    return held


def _assert_partition(held: dict[str, ShardScope]) -> None:
    union: set[int] = set()
    for scope in held.values():
        assert not union & scope.shards, "two replicas hold one shard"
        union |= scope.shards
    assert union == set(range(SHARDS)), f"shards nobody holds: {sorted(set(range(SHARDS)) - union)}"
    fair = -(-SHARDS // len(held))
    assert all(len(s.shards) <= fair for s in held.values()), {k: len(v.shards) for k, v in held.items()}


@pytest.mark.usefixtures("quiet")
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_replicas_split_the_shards_disjointly_and_cover_all(rt: Runtime, clock: MovableClock, replicas: int) -> None:
    names = [f"replica-{i}" for i in range(replicas)]
    held = _rounds(rt, names, clock())
    _assert_partition(held)
    assert sorted(len(s.shards) for s in held.values()) == sorted([SHARDS // replicas] * replicas)
    with Session(rt.engine) as s:
        rows = s.exec(select(TickShard)).all()
    assert {r.owner for r in rows} == set(names)


@pytest.mark.usefixtures("quiet")
def test_a_joining_replica_gets_its_share_and_a_stopped_one_is_taken_over_after_its_lease(
    rt: Runtime, clock: MovableClock
) -> None:
    now = clock()
    assert claim_shards(rt.engine, "a", now, LEASE).everything  # alone: every shard
    held = _rounds(rt, ["a", "b"], now + timedelta(seconds=1))
    _assert_partition(held)
    assert len(held["b"].shards) == SHARDS // 2
    # "a" stops without a word: until its leases run out, "b" keeps to its own half
    later = now + timedelta(seconds=10)
    assert claim_shards(rt.engine, "b", later, LEASE).shards == held["b"].shards
    after = now + timedelta(seconds=5) + LEASE  # past a's last renewal + the lease
    assert claim_shards(rt.engine, "b", after, LEASE).everything
    # "a" comes back: it finds nothing free, "b" gives back half at its next tick, "a" takes it at its next
    assert not claim_shards(rt.engine, "a", after + timedelta(seconds=1), LEASE).shards
    _assert_partition(_rounds(rt, ["b", "a"], after + timedelta(seconds=2)))


@pytest.mark.usefixtures("quiet")
def test_a_replica_stopping_cleanly_hands_its_shards_over_at_once(rt: Runtime, clock: MovableClock) -> None:
    held = _rounds(rt, ["a", "b", "c"], clock())
    _assert_partition(held)
    release_shards(rt.engine, "c")
    _assert_partition(_rounds(rt, ["a", "b"], clock() + timedelta(seconds=5), rounds=2))


def test_the_sql_shard_filter_picks_the_ids_shard_of_picks(rt: Runtime) -> None:
    ids = [new_id("plc") for _ in range(300)] + ["p1", "x", "plc_ZZ", "plc_0G", "plc_ff", "plc_00", "a"]
    with Session(rt.engine) as s:
        s.connection().execute(text("CREATE TEMPORARY TABLE shard_probe (id VARCHAR(40) PRIMARY KEY)"))
        s.connection().execute(text("INSERT INTO shard_probe (id) VALUES (:id)"), [{"id": i} for i in ids])
        rng = random.Random(7)
        scopes = [ShardScope(frozenset(rng.sample(range(SHARDS), k))) for k in (1, 5, 31, 63)]
        scopes.append(ShardScope(frozenset({0})))
        for scope in scopes:
            t = table("shard_probe", column("id"))
            got = set(s.connection().execute(core_select(t.c.id).where(scope.clause(t.c.id))).scalars())
            assert got == {i for i in ids if shard_of(i) in scope.shards}
    assert shard_of("p1") == shard_of("plc_ZZ") == 0
    assert shard_of("plc_ff") == 0xFF % SHARDS


def _submit(rt: Runtime, clock: MovableClock, n: int) -> None:
    for i in range(n):
        body = job_body(
            name=f"s{i}",
            accelerators=["A100", "V100", "A10G", "L4", "H100"],
            work_gpu_hours="50",
            max_total_usd="5000",
        )
        submit_job(rt.engine, rt.catalog, tenant="demo", create=JobCreate(**body), idempotency_key=None, now=clock())


def test_two_replicas_each_sync_and_accrue_only_their_shards_and_nothing_twice(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    # every tick accrues every running placement of its shards up to its own time (no cadence), so each
    # placement's mark names the replica that accrued it
    a = make_runtime(db_url, accrual_cadence_seconds=0)
    b = make_runtime(db_url, accrual_cadence_seconds=0)
    a.shares_work = b.shares_work = True
    tick(a, clock())
    _submit(a, clock, 40)
    for _ in range(3):  # both replicas tick: jobs placed, instances started, shards rebalanced
        for r in (a, b):
            tick(r, clock.advance(minutes=1))
    with Session(a.engine) as s:
        running = s.exec(select(Placement).where(Placement.state == "running")).all()
    assert len(running) == 40
    reports = {}
    for _ in range(3):
        for name, r in (("a", a), ("b", b)):
            reports[name] = tick(r, clock.advance(minutes=1))
            assert reports[name].ok, reports[name].steps
    assert reports["a"].shards + reports["b"].shards == SHARDS
    assert 0 < reports["a"].shards < SHARDS
    b_time, a_time = clock(), clock() - timedelta(minutes=1)
    with Session(a.engine) as s:
        owner = {r.shard: r.owner for r in s.exec(select(TickShard)).all()}
        placements = s.exec(select(Placement).where(Placement.state == "running")).all()
        entries = s.exec(select(CostEntryRow).order_by(col(CostEntryRow.period_start_at))).all()
        jobs = {j.id: j for j in s.exec(select(Job)).all()}
    by_owner = defaultdict(set)
    for p in placements:  # each placement accrued up to its own replica's last tick, by that replica alone
        expected = a_time if owner[shard_of(p.id)] == a.replica_id else b_time
        assert p.accrued_until == expected, (p.id, owner[shard_of(p.id)])
        by_owner[owner[shard_of(p.id)]].add(p.id)
    assert by_owner[a.replica_id] and by_owner[b.replica_id], "both replicas hold running placements"
    by_placement: dict[str, list[CostEntryRow]] = defaultdict(list)
    for e in entries:
        if e.kind == "compute":
            by_placement[e.placement_id].append(e)
    for p in placements:
        mine = by_placement[p.id]
        assert mine[0].period_start_at == p.started_at
        for x, y in pairwise(mine):
            assert x.period_end_at == y.period_start_at, (
                f"{p.id}: a gap or an overlap (double accrual) at {x.period_end_at}"
            )
        assert mine[-1].period_end_at == p.accrued_until
        hourly = mine[-1].hourly_usd
        exact = (hourly * hours_between(p.started_at, p.accrued_until)).quantize(LEDGER_QUANTUM)
        assert sum((e.usd for e in mine), Decimal("0")) == exact
    spent: dict[str, Decimal] = defaultdict(Decimal)
    for e in entries:
        spent[e.job_id] += e.usd
    assert all(spent[j.id] == j.spent_usd for j in jobs.values())


def test_a_one_shot_tick_holds_no_lease_and_works_on_every_placement(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """`overspill tick` from cron or the serverless schedule: a replica holding every shard does not stop it, and
    it leaves no lease behind that would keep the next one-shot tick (a new process) from working."""
    rt = make_runtime(db_url, accrual_cadence_seconds=0)  # each tick accrues every running placement up to now
    tick(rt, clock())
    _submit(rt, clock, 6)
    for _ in range(6):
        tick(rt, clock.advance(minutes=1))
    with Session(rt.engine) as s:
        assert len(s.exec(select(Placement).where(Placement.state == "running")).all()) == 6
    assert claim_shards(rt.engine, "long-running", clock(), LEASE).everything
    report = tick(rt, clock.advance(minutes=1))
    assert report.shards == SHARDS and report.count("accrue_costs") >= 6
    with Session(rt.engine) as s:
        assert all(p.accrued_until == clock() for p in s.exec(select(Placement).where(Placement.state == "running")))
        assert not s.exec(select(TickShard).where(TickShard.owner == rt.replica_id)).all()


def test_one_long_running_replica_sweeps_orphans_per_interval(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orphan sweep lists every cloud's instances: among replicas sharing the work, one per interval does."""
    replicas = [make_runtime(db_url, orphan_sweep_seconds=300) for _ in range(2)]
    listed: list[str] = []
    for r in replicas:
        r.shares_work = True
        for provider in r.providers.values():
            original = provider.list_instances

            def counting(original: Callable[[], list[object]] = original, who: str = r.replica_id) -> list[object]:
                listed.append(who)
                return original()

            monkeypatch.setattr(provider, "list_instances", counting)
    a, b = replicas
    sweep_orphans(a, clock())
    sweep_orphans(b, clock())
    assert listed and set(listed) == {a.replica_id}
    listed.clear()
    later = clock() + timedelta(seconds=301)
    sweep_orphans(b, later)  # a's lease ran out: b may take it
    sweep_orphans(a, later)
    assert listed and len(set(listed)) == 1
