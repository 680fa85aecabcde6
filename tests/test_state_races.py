"""A cancel is never undone: PATCH (which resumes a paused job), cancel and the placement round race on the same
jobs, thousands of times, on SQLite and PostgreSQL, and every job the user was told is cancelled stays cancelled
(never pending, paused or running again, never placed after its cancel).

Each round makes a batch of paused jobs and starts three threads at one barrier: one PATCHes every job (paused ->
pending), one cancels every job, one runs placement rounds until both are done. Whatever the interleaving, a
cancel that answered "cancelled" must be the job's last word."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import update
from sqlmodel import Session, col, select

from broker.api.schemas import JobCreate, JobUpdate
from broker.loop.place import place_pending
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.services.errors import Conflict
from broker.services.jobs import cancel_job, submit_job, update_job
from broker.store.tables import Job, JobEvent
from tests.builders import job_body
from tests.conftest import MovableClock

ROUNDS, BATCH = 40, 50  # 2,000 races per database


def _paused_batch(rt: Runtime, now: datetime, n: int) -> list[str]:
    ids = []
    for i in range(n):
        job, _ = submit_job(
            rt.engine,
            rt.catalog,
            tenant="demo",
            create=JobCreate(**job_body(name=f"r{i}", max_total_usd="500")),
            idempotency_key=None,
            now=now,
        )
        ids.append(job.id)
    with Session(rt.engine) as s:
        s.exec(update(Job).where(col(Job.id).in_(ids)).values(state="paused"))  # type: ignore[call-overload]
        s.commit()
    return ids


def _race(rt: Runtime, now: datetime, ids: list[str]) -> tuple[set[str], list[str]]:
    """Run the three racers; returns (jobs the cancel answered `cancelled` for, errors the racers hit)."""
    barrier = threading.Barrier(3)
    told_cancelled: set[str] = set()
    errors: list[str] = []
    done = threading.Event()

    def patcher() -> None:
        barrier.wait()
        for job_id in ids:
            try:
                update_job(rt.engine, "demo", job_id, JobUpdate(priority=5), now)
            except Conflict:
                pass  # the job was cancelled first: a clear refusal is the right answer
            except Exception as exc:
                errors.append(f"patch {job_id}: {type(exc).__name__}: {exc}")

    def canceller() -> None:
        barrier.wait()
        for job_id in ids:
            try:
                job = cancel_job(rt.engine, "demo", job_id, now)
            except Exception as exc:
                errors.append(f"cancel {job_id}: {type(exc).__name__}: {exc}")
                continue
            if job.state == "cancelled":
                told_cancelled.add(job_id)

    def placer() -> None:
        barrier.wait()
        while not done.is_set():
            try:
                place_pending(rt, now)
            except Exception as exc:
                errors.append(f"place: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=f) for f in (patcher, canceller)]
    placing = threading.Thread(target=placer)
    for t in (*threads, placing):
        t.start()
    for t in threads:
        t.join()
    done.set()
    placing.join()
    place_pending(rt, now)  # one more round after both: a resurrected job would be placed here
    return told_cancelled, errors


def lost_cancels(rt: Runtime, ids: list[str], told: set[str]) -> list[str]:
    """The jobs told `cancelled` that are not cancelled now, or were placed or resumed after their cancel."""
    lost = []
    with Session(rt.engine) as s:
        states = dict(s.exec(select(Job.id, Job.state).where(col(Job.id).in_(ids))).all())  # type: ignore[call-overload]
        events = s.exec(
            select(JobEvent.job_id, JobEvent.kind)
            .where(col(JobEvent.job_id).in_(ids))
            .order_by(col(JobEvent.job_id), col(JobEvent.id))
        ).all()
    after: dict[str, list[str]] = {}
    for job_id, kind in events:
        if kind == "cancelled":
            after[job_id] = []
        elif job_id in after:
            after[job_id].append(kind)
    for job_id in sorted(told):
        later = [k for k in after.get(job_id, []) if k in ("placed", "resumed", "waiting", "paused")]
        if states[job_id] != "cancelled" or later:
            lost.append(f"{job_id}: now {states[job_id]}, after its cancel: {later}")
    return lost


def test_a_cancel_survives_patch_and_placement_races(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url)
    now = clock()
    tick(rt, now)  # the market's pools are in the catalog: the placement round places what it can
    lost: list[str] = []
    told_total = 0
    errors: list[str] = []
    for _ in range(ROUNDS):
        ids = _paused_batch(rt, now, BATCH)
        told, errs = _race(rt, now, ids)
        told_total += len(told)
        errors += errs
        lost += lost_cancels(rt, ids, told)
    print(f"races={ROUNDS * BATCH} told_cancelled={told_total} lost_cancels={len(lost)} errors={len(errors)}")
    assert told_total == ROUNDS * BATCH, errors[:5]  # every cancel of a job that had not ended succeeds
    assert not lost, f"{len(lost)} of {told_total} cancels undone: {lost[:5]}"
    assert not errors, errors[:5]
