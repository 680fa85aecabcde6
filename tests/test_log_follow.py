"""Followed logs cannot exhaust the API process (issue 32, point 5): over real HTTP (uvicorn on loopback), on
SQLite and PostgreSQL.

- Many clients following idle logs hold no worker thread: `/healthz`, a submission and a read still answer.
- `/healthz` answers even when every worker thread of the process is taken.
- Follows are capped per tenant and per process (429 naming the setting, with Retry-After); a follower that
  disconnects gives its slot back at once.
- The follow semantics the CLI (`overspill logs -f`) relies on are kept: the log as it grows, in order, ending once
  the attempt has ended and everything is read.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import httpx
import pytest
from fastapi import FastAPI
from sqlmodel import Session

from agent import protocol as proto
from broker.api.auth import Role, create_key
from broker.api.routes import logs as logs_route
from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.runtime import Runtime
from broker.services.job_logs import follow_log
from broker.store.tables import Placement
from overspill.client import Client
from tests.builders import agent_store, job_body, running_placement
from tests.conftest import MovableClock
from tests.served_api import served

ADMIN = {"Authorization": f"Bearer {DEV_API_KEY}"}
STORE_PLACE = "aws/us-east-1"


@pytest.fixture
def follow_rt(db_url: str, make_runtime: Callable[..., Runtime], tmp_path: Path) -> Runtime:
    return make_runtime(
        db_url,
        checkpoint_stores=agent_store(tmp_path, (STORE_PLACE,)),
        log_follow_max_per_tenant=100,
        log_follow_max_per_process=200,
    )


def running_attempt(rt: Runtime, clock: MovableClock, job_id: str, tenant: str) -> tuple[str, Path]:
    """A running placement of the job whose agent logs to a file store: (its id, its logs directory)."""
    pid = "plc_" + uuid.uuid4().hex[:12]
    uri = f"{rt.settings.checkpoint_stores[STORE_PLACE]}tenants/{tenant}/jobs/{job_id}/attempts/{pid}/"
    with Session(rt.engine) as s:
        s.add(running_placement(pid, job_id, tenant, clock(), attempt_uri=uri))
        s.commit()
    logs = Path(uri.removeprefix("file://")) / "logs"
    logs.mkdir(parents=True)
    return pid, logs


def end_attempt(rt: Runtime, pid: str) -> None:
    with Session(rt.engine) as s:
        row = s.get(Placement, pid)
        assert row is not None
        row.state = "succeeded"
        s.add(row)
        s.commit()


def submit(base: str, headers: dict[str, str], **overrides: Any) -> str:
    resp = httpx.post(f"{base}/v1/jobs", json=job_body(**overrides), headers=headers, timeout=10)
    assert resp.status_code in (201, 202), resp.text
    return str(resp.json()["id"])


class Follower:
    """A raw HTTP client following a log: sends the request and reads only the status line (then sits idle)."""

    def __init__(self, base: str, job_id: str, key: str) -> None:
        url = urlsplit(base)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=10)
        request = (
            f"GET /v1/jobs/{job_id}/logs?follow=true HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {key}\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self.head = b""

    def status(self, timeout: float = 10) -> int:
        """The answer's status code (0 when none came within `timeout`); reads the head only."""
        self.sock.settimeout(timeout)
        try:
            while b"\r\n\r\n" not in self.head:
                data = self.sock.recv(4096)
                if not data:
                    break
                self.head += data
        except TimeoutError:
            return 0
        line = self.head.split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) > 1 else 0

    def answer(self, timeout: float = 2) -> bytes:
        """Everything received so far and within `timeout` more (for a short, complete answer)."""
        self.sock.settimeout(timeout)
        data = self.head
        try:
            while b"}" not in data and (more := self.sock.recv(4096)):
                data += more
        except TimeoutError:
            pass
        return data

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def app(follow_rt: Runtime) -> FastAPI:
    return create_app(runtime=follow_rt)


@pytest.fixture
def base(app: FastAPI) -> Iterator[str]:
    with served(app) as url:
        yield url


def wait_for(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_many_idle_followers_leave_healthz_submissions_and_reads_answering(
    follow_rt: Runtime, clock: MovableClock, base: str, app: FastAPI
) -> None:
    """60 followers of an idle log (more than the 40 worker threads Starlette runs sync routes on): every one is
    answered, and /healthz, a submission and a job read still answer at once; once they disconnect, their slots
    are free."""
    job_id = submit(base, ADMIN)
    pid, logs = running_attempt(follow_rt, clock, job_id, "demo")
    (logs / proto.log_chunk_name(0)).write_bytes(b"epoch 1\n")
    followers: list[Follower] = []
    try:
        for _ in range(60):
            followers.append(Follower(base, job_id, DEV_API_KEY))
        statuses = [f.status() for f in followers]
        assert statuses == [200] * 60, f"followers answered {sorted(set(statuses))}"
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        other = submit(base, ADMIN, name="still-accepted")
        read = httpx.get(f"{base}/v1/jobs/{other}", headers=ADMIN, timeout=5)
        assert read.status_code == 200 and read.json()["name"] == "still-accepted"
        assert app.state.log_follows.active("demo") == 60
        # the 60 followers of one attempt share its looks (state + listing): far fewer than one per follower
        time.sleep(2)
        assert 1 <= app.state.log_watch.looks < 20
    finally:
        for f in followers:
            f.close()
        released = wait_for(lambda: app.state.log_follows.active() == 0)
        end_attempt(follow_rt, pid)  # lets a stream that outlived its client end
    assert released, "disconnected followers still hold their slots"


def test_healthz_answers_when_every_worker_thread_is_taken(base: str, app: FastAPI) -> None:
    """/healthz never waits on the thread pool: with all of the process's worker threads borrowed, it answers,
    while a route that needs a thread does not."""
    borrowed = threading.Event()
    give_back = threading.Event()

    @app.get("/test-hold-threads")
    async def hold() -> dict[str, int]:
        limiter = anyio.to_thread.current_default_thread_limiter()
        holders = [object() for _ in range(int(limiter.total_tokens))]
        for h in holders:
            await limiter.acquire_on_behalf_of(h)
        borrowed.set()
        while not give_back.is_set():
            await anyio.sleep(0.02)
        for h in holders:
            limiter.release_on_behalf_of(h)
        return {"held": len(holders)}

    holder = threading.Thread(target=lambda: httpx.get(f"{base}/test-hold-threads", timeout=60))
    holder.start()
    try:
        assert borrowed.wait(10)
        assert httpx.get(f"{base}/healthz", timeout=5).json() == {"status": "ok"}
        with pytest.raises(httpx.TimeoutException):  # the check can fail: a threaded route does wait meanwhile
            httpx.get(f"{base}/v1/jobs", headers=ADMIN, timeout=1)
    finally:
        give_back.set()
        holder.join(timeout=30)


def test_follows_are_capped_per_tenant_and_per_process_and_a_disconnect_frees_a_slot(
    db_url: str, make_runtime: Callable[..., Runtime], tmp_path: Path, clock: MovableClock
) -> None:
    rt = make_runtime(
        db_url,
        checkpoint_stores=agent_store(tmp_path, (STORE_PLACE,)),
        log_follow_max_per_tenant=3,
        log_follow_max_per_process=5,
    )
    beta_key = create_key(rt.engine, tenant="beta", role=Role.SUBMITTER, name="b", now=clock())
    app = create_app(runtime=rt)
    followers: list[Follower] = []
    pids: list[str] = []
    with served(app) as base:
        try:
            acme_job = submit(base, ADMIN)
            beta_job = submit(base, {"Authorization": f"Bearer {beta_key}"})
            pids += [running_attempt(rt, clock, acme_job, "demo")[0], running_attempt(rt, clock, beta_job, "beta")[0]]
            demo = [Follower(base, acme_job, DEV_API_KEY) for _ in range(3)]
            followers += demo
            assert [f.status() for f in demo] == [200] * 3
            over = httpx.get(f"{base}/v1/jobs/{acme_job}/logs", params={"follow": "true"}, headers=ADMIN, timeout=5)
            assert over.status_code == 429 and over.headers["retry-after"] == "5"
            assert "OVERSPILL_LOG_FOLLOW_MAX_PER_TENANT=3" in over.json()["detail"]
            # the tenant's cap does not touch another tenant: beta follows until the process is full
            beta = [Follower(base, beta_job, beta_key) for _ in range(2)]
            followers += beta
            assert [f.status() for f in beta] == [200] * 2
            full = Follower(base, beta_job, beta_key)
            followers.append(full)
            assert full.status() == 429 and b"OVERSPILL_LOG_FOLLOW_MAX_PER_PROCESS=5" in full.answer()
            # a plain read is never capped
            plain = httpx.get(f"{base}/v1/jobs/{acme_job}/logs", headers=ADMIN, timeout=5)
            assert plain.status_code == 200
            # one demo follower goes away: its slot is free again at once
            demo[0].close()
            assert wait_for(lambda: app.state.log_follows.active("demo") == 2, 5)
            again = Follower(base, acme_job, DEV_API_KEY)
            followers.append(again)
            assert again.status() == 200
        finally:
            for f in followers:
                f.close()
            for pid in pids:
                end_attempt(rt, pid)
            assert wait_for(lambda: app.state.log_follows.active() == 0)


def test_follow_streams_the_log_as_it_grows_and_ends_with_the_attempt(
    follow_rt: Runtime, clock: MovableClock, base: str, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `overspill logs -f` relies on: from the offset, every byte in order as chunks land, and the stream
    ends once the attempt has ended and everything is read."""
    monkeypatch.setattr(logs_route, "FOLLOW_POLL_SECONDS", 0.05)
    monkeypatch.setattr(logs_route, "FOLLOW_MAX_POLL_SECONDS", 0.2)
    job_id = submit(base, ADMIN)
    pid, logs = running_attempt(follow_rt, clock, job_id, "demo")
    (logs / proto.log_chunk_name(0)).write_bytes(b"step 1\n")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(Client(base, DEV_API_KEY).follow_logs(job_id, offset=2)))
    reader.start()
    assert wait_for(lambda: b"".join(got) == b"ep 1\n")
    (logs / proto.log_chunk_name(7)).write_bytes(b"step 2\n")
    assert wait_for(lambda: b"".join(got) == b"ep 1\nstep 2\n")
    (logs / proto.log_chunk_name(14)).write_bytes(b"done\n")
    end_attempt(follow_rt, pid)
    reader.join(timeout=10)
    assert not reader.is_alive(), "the follow did not end with its attempt"
    assert b"".join(got) == b"ep 1\nstep 2\ndone\n"
    assert wait_for(lambda: app.state.log_follows.active() == 0)


def test_follow_log_backs_off_while_idle_and_stops_on_disconnect() -> None:
    """The stream's own rules, with a scripted poll: idle polls double the wait up to the cap, data resets it,
    and a disconnected client ends the stream without another poll."""
    answers = [(b"", 0, False), (b"", 0, False), (b"", 0, False), (b"a", 1, False), (b"", 1, False), (b"", 1, False)]
    slept: list[float] = []
    gone = {"now": False}

    async def poll(at: int) -> tuple[bytes, int, bool]:
        return answers.pop(0)

    async def disconnected() -> bool:
        return gone["now"]

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if not answers:
            gone["now"] = True

    async def run() -> list[bytes]:
        stream = follow_log(
            poll, 0, disconnected=disconnected, poll_seconds=1, max_poll_seconds=3, sleep=sleep, jitter=lambda: 1.0
        )
        return [piece async for piece in stream]

    assert anyio.run(run) == [b"a"]
    assert slept == [1, 2, 3, 1, 2]


def test_follow_log_ends_after_a_read_that_began_once_the_attempt_had_ended() -> None:
    answers = [(b"x", 1, False), (b"y", 2, True), (b"", 2, True)]

    async def poll(at: int) -> tuple[bytes, int, bool]:
        return answers.pop(0)

    async def never() -> bool:
        return False

    async def run() -> list[bytes]:
        return [piece async for piece in follow_log(poll, 0, disconnected=never, poll_seconds=0)]

    assert anyio.run(run) == [b"x", b"y"] and not answers


def test_a_log_chunk_that_is_a_hard_link_to_another_file_is_not_served(
    follow_rt: Runtime, clock: MovableClock, base: str, tmp_path: Path
) -> None:
    """Hard links are refused wherever symlinks are (issue 32, Low): a chunk hard-linked to a broker-readable file
    (here a stand-in for its database) is left out of the log like a symlinked one, never served."""
    secret = tmp_path / "broker-secret.db"
    secret.write_bytes(b"SQLite format 3\0 every tenant's key hashes\n")
    job_id = submit(base, ADMIN)
    _, logs = running_attempt(follow_rt, clock, job_id, "demo")
    (logs / proto.log_chunk_name(0)).write_bytes(b"epoch 1\n")
    os.link(secret, logs / proto.log_chunk_name(8))
    for params in ({}, {"tail": 4096}, {"offset": 8}):
        resp = httpx.get(f"{base}/v1/jobs/{job_id}/logs", params=params, headers=ADMIN, timeout=10)
        assert resp.status_code == 200 and b"key hashes" not in resp.content
    whole = httpx.get(f"{base}/v1/jobs/{job_id}/logs", headers=ADMIN, timeout=10)
    assert whole.content == b"epoch 1\n" and whole.headers["X-Overspill-Next-Offset"] == "8"
