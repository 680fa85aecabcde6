"""Pre-staging a job's checkpoint next to where it launches, driven through `tick()`.

A job checkpoints to S3 (a moto server) while it runs on one cloud, is preempted, and is re-placed on another
whose checkpoint store is GCS (gcp-storage-emulator): before the launch the broker copies the checkpoint into that
store, repoints the job at it, books the transfer in the ledger at the sender's egress rate, and the new instance
resumes from the copy. Also: a transfer the ceiling cannot pay pauses the job; a storage outage leaves the
placement to be retried and, after three failures, launches from the remote checkpoint; resume state in the
database carries a copy across a crash; and the staging lease admits one replica at a time.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.loop.accrue import LEDGER_QUANTUM
from broker.loop.place import _place_one, launch_placement
from broker.loop.stage import Staging, stage_checkpoint
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.copystate import DbCopyStateStore, claim_lease, release_lease
from broker.store.tables import CostEntryRow, Job, JobEvent, Placement
from providers.storage import LocalStore, copy_checkpoint
from providers.storage.copy import BYTES_PER_GB
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.moto_server import CREDS
from tests.scripted import ScriptedCloud, admin_api, attach
from tests.storage_emulators import Crash, crash_after

pytest_plugins = ["tests.storage_emulators"]

MiB = 1024 * 1024


def _clouds(clock: MovableClock) -> tuple[ScriptedCloud, ScriptedCloud]:
    aws = ScriptedCloud("aws", clock, zones=("us-east-1a",), region="us-east-1")
    gcp = ScriptedCloud("gcp", clock, zones=("us-central1-a",), region="us-central1")
    aws.prices = {"us-east-1a": Decimal("10")}
    gcp.prices = {"us-central1-a": Decimal("12")}
    return aws, gcp


def _runtime(
    make_runtime: Callable[..., Runtime], db_url: str, clouds: tuple[ScriptedCloud, ...], **kw: Any
) -> Runtime:
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0, **kw)
    for cloud in clouds:
        attach(rt, cloud)
    return rt


def _api(rt: Runtime) -> TestClient:
    return admin_api(rt)


def _run(rt: Runtime, clock: MovableClock, ticks: int, minutes: float = 10) -> None:
    for _ in range(ticks):
        clock.advance(minutes=minutes)
        tick(rt, clock())


def _job(rt: Runtime, job_id: str) -> Job:
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _events(rt: Runtime, job_id: str, kind: str) -> list[JobEvent]:
    with Session(rt.engine) as s:
        return list(s.exec(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)).all())


def _ledger(rt: Runtime, job_id: str) -> list[CostEntryRow]:
    with Session(rt.engine) as s:
        return list(s.exec(select(CostEntryRow).where(CostEntryRow.job_id == job_id)).all())


@pytest.mark.integration
def test_preempted_job_resumes_from_a_checkpoint_staged_next_to_its_new_pool(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    s3_endpoint: str,
    s3_client: Any,
    gcs_endpoint: str,
    gcs_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in CREDS.items():
        monkeypatch.setenv(name.upper(), value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    run = uuid.uuid4().hex[:8]
    s3_bucket, gcs_bucket = f"ckpt-use1-{run}", f"ckpt-usc1-{run}"
    s3_client.create_bucket(Bucket=s3_bucket)
    gcs_client.create_bucket(gcs_bucket)
    aws, gcp = _clouds(clock)
    rt = _runtime(
        make_runtime,
        db_url,
        (aws, gcp),
        checkpoint_stores={"aws/us-east-1": f"s3://{s3_bucket}/", "gcp/us-central1": f"gs://{gcs_bucket}/"},
        s3_endpoint_url=s3_endpoint,
        gcs_endpoint=gcs_endpoint,
    )
    api = _api(rt)
    tick(rt, clock())
    source = f"s3://{s3_bucket}/tenants/demo/runs/llm-7b/"  # in the demo tenant's area of the AWS store
    body = job_body(work_gpu_hours="3", max_total_usd="80", checkpoint_uri=source, checkpoint_size_gb="0.004")
    job_id = api.post("/v1/jobs", json=body).json()["id"]
    tick(rt, clock())
    assert [r.offering.provider for r in aws.requests + gcp.requests] == ["aws"]
    assert aws.requests[0].resume_from is None  # nothing to move: the checkpoint store is in the same region
    _run(rt, clock, 7)  # 70 minutes: two 30-minute checkpoints
    model, optim = os.urandom(3 * MiB + 17), os.urandom(MiB)
    s3_client.put_object(Bucket=s3_bucket, Key="tenants/demo/runs/llm-7b/model.pt", Body=model)
    s3_client.put_object(Bucket=s3_bucket, Key="tenants/demo/runs/llm-7b/optim/state.pt", Body=optim)

    aws.preempt(next(iter(aws.vms)))
    aws.prices = {"us-east-1a": Decimal("30")}  # the reclaimed pool comes back dear: GCP wins despite the egress
    tick(rt, clock())  # sees the preemption
    tick(rt, clock())  # re-places on GCP: stages, then launches

    job = _job(rt, job_id)
    staged = f"gs://{gcs_bucket}/tenants/demo/jobs/{job_id}/checkpoint/"  # the job's prefix in the GCS store
    assert job.checkpoint_uri == staged
    assert (job.checkpoint_provider, job.checkpoint_region) == ("gcp", "us-central1")
    [launch] = gcp.requests
    assert launch.resume_from == staged
    bucket = gcs_client.bucket(gcs_bucket)
    prefix = f"tenants/demo/jobs/{job_id}/checkpoint/"
    assert bucket.blob(f"{prefix}model.pt").download_as_bytes() == model
    assert bucket.blob(f"{prefix}optim/state.pt").download_as_bytes() == optim

    [egress] = [e for e in _ledger(rt, job_id) if e.kind == "egress"]
    sent = Decimal(len(model) + len(optim))
    assert egress.provider == "aws"  # the sender pays
    assert egress.usd == (sent / BYTES_PER_GB * Decimal("0.09")).quantize(LEDGER_QUANTUM)
    assert [e.data["target_uri"] for e in _events(rt, job_id, "checkpoint_staged")] == [staged]

    _run(rt, clock, 20)
    job = _job(rt, job_id)
    assert job.state == "succeeded"
    ledger = _ledger(rt, job_id)
    assert sum(e.usd for e in ledger) == job.spent_usd <= job.max_total_usd
    assert len([e for e in ledger if e.kind == "egress"]) == 1  # booked once across every later tick


@pytest.fixture
def stores_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where local checkpoint stores go: apart from the data dir (tmp_path), which no store may be near."""
    return tmp_path_factory.mktemp("stores")


def _local_stores(root: Path) -> dict[str, str]:
    return {"aws/us-east-1": f"file://{root}/use1/", "gcp/us-central1": f"file://{root}/usc1/"}


def _placed_on_gcp(rt: Runtime, clock: MovableClock, source: str, **body: Any) -> tuple[str, str]:
    """Submit a job whose checkpoint is in the AWS store and place it on GCP (cheaper), without launching."""
    api = _api(rt)
    tick(rt, clock())
    job_id = api.post("/v1/jobs", json=job_body(checkpoint_uri=source, **body)).json()["id"]
    placement_id, _ = _place_one(rt, job_id, rt.catalog.book(clock()), frozenset(), clock())
    assert placement_id is not None
    with Session(rt.engine) as s:
        p = s.get(Placement, placement_id)
        assert p is not None and p.provider == "gcp"
    return job_id, placement_id


def _seed_local_checkpoint(root: Path, size: int) -> str:
    source_dir = root / "use1" / "tenants" / "demo" / "runs" / "big"
    source_dir.mkdir(parents=True)
    (source_dir / "model.pt").write_bytes(os.urandom(size))
    return f"file://{source_dir}/"


def test_a_transfer_the_ceiling_cannot_pay_pauses_the_job_before_any_byte_moves(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, stores_dir: Path
) -> None:
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_stores(stores_dir))
    source = _seed_local_checkpoint(stores_dir, 2 * MiB)
    # the user declared no checkpoint size, so the placement priced no transfer
    job_id, placement_id = _placed_on_gcp(rt, clock, source, work_gpu_hours="1", max_total_usd="20")
    with Session(rt.engine) as s:  # earlier attempts have spent everything but this placement's expected cost
        p = s.get(Placement, placement_id)
        job = s.get(Job, job_id)
        assert p is not None and job is not None
        job.spent_usd = job.max_total_usd - p.expected_cost_usd
        s.add(job)
        s.commit()
    launch_placement(rt, placement_id, clock())
    job = _job(rt, job_id)
    assert job.state == "paused" and "ceiling" in job.wait_reason
    assert not (stores_dir / "usc1").exists()  # nothing was copied
    assert gcp.requests == []
    assert [e.kind for e in _ledger(rt, job_id)] == []
    [refusal] = _events(rt, job_id, "checkpoint_stage_refused")
    assert "2097152 byte checkpoint" in refusal.message
    assert stage_checkpoint(rt, placement_id, clock()) is Staging.NOT_NEEDED  # the placement is given up


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_store_outage_is_retried_then_the_job_resumes_from_the_remote_checkpoint(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    stores_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in CREDS.items():
        monkeypatch.setenv(name.upper(), value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(
        make_runtime,
        db_url,
        (aws, gcp),
        checkpoint_stores={"aws/us-east-1": "s3://down/", "gcp/us-central1": f"file://{stores_dir}/usc1/"},
        s3_endpoint_url=f"http://127.0.0.1:{_closed_port()}",  # S3 unreachable
    )
    source = "s3://down/tenants/demo/runs/llm/"
    job_id, placement_id = _placed_on_gcp(rt, clock, source, work_gpu_hours="1", max_total_usd="20")
    launch_placement(rt, placement_id, clock())
    assert gcp.requests == []  # not launched while the checkpoint could not be moved
    for _ in range(2):
        clock.advance(minutes=1)
        tick(rt, clock())
    assert len(_events(rt, job_id, "checkpoint_stage_failed")) == 3
    [launch] = gcp.requests  # the third failure gives up staging
    assert launch.resume_from is None and _job(rt, job_id).checkpoint_uri == source
    # (a first attempt resumes from the checkpoint it came with through OVERSPILL_CHECKPOINT_URI)


def test_copy_state_in_the_database_carries_a_copy_across_a_crash(db_url: str, tmp_path: Path) -> None:
    from broker.config.settings import Settings
    from broker.store import migrate
    from broker.store.db import make_engine

    engine = make_engine(Settings(database_url=db_url))
    migrate.upgrade(engine)
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    data = os.urandom(24 * MiB)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ckpt.bin").write_bytes(data)
    with pytest.raises(Crash):
        copy_checkpoint(
            src, "ckpt.bin", dst, "ckpt.bin", state=DbCopyStateStore(engine), progress=crash_after(16 * MiB)
        )
    # a new process: only the database remembers the upload
    result = copy_checkpoint(src, "ckpt.bin", dst, "ckpt.bin", state=DbCopyStateStore(engine))
    assert result.resumed_from_bytes >= 16 * MiB
    assert (tmp_path / "dst" / "ckpt.bin").read_bytes() == data
    with Session(engine) as s:  # a finished copy leaves no state behind
        from broker.store.tables import CheckpointCopyRow

        assert s.exec(select(CheckpointCopyRow)).all() == []


def test_the_staging_lease_admits_one_replica_at_a_time(db_url: str, clock: MovableClock) -> None:
    from broker.config.settings import Settings
    from broker.store import migrate
    from broker.store.db import make_engine

    engine = make_engine(Settings(database_url=db_url))
    migrate.upgrade(engine)
    now = clock()
    assert claim_lease(engine, "stage:p1", "a", now + timedelta(minutes=30), now)
    assert not claim_lease(engine, "stage:p1", "b", now + timedelta(minutes=30), now)
    assert claim_lease(engine, "stage:p1", "a", now + timedelta(minutes=60), now)  # the holder extends it
    later = now + timedelta(minutes=61)
    assert claim_lease(engine, "stage:p1", "b", later + timedelta(minutes=30), later)  # expired: b takes over
    release_lease(engine, "stage:p1", "a")  # a no longer holds it: no effect
    assert not claim_lease(engine, "stage:p1", "a", later + timedelta(minutes=30), later)
    release_lease(engine, "stage:p1", "b")
    assert claim_lease(engine, "stage:p1", "a", later + timedelta(minutes=30), later)


def test_a_job_without_a_checkpoint_uri_gets_its_prefix_in_the_store_where_it_launches(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, stores_dir: Path
) -> None:
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_stores(stores_dir))
    api = _api(rt)
    tick(rt, clock())
    job_id = api.post("/v1/jobs", json=job_body(work_gpu_hours="3", max_total_usd="80")).json()["id"]
    tick(rt, clock())  # placed on GCP and launched

    assigned = f"file://{stores_dir}/usc1/tenants/demo/jobs/{job_id}/checkpoint/"
    job = _job(rt, job_id)
    assert (job.checkpoint_uri, job.checkpoint_provider, job.checkpoint_region) == (assigned, "gcp", "us-central1")
    [launch] = gcp.requests
    assert launch.spec.checkpoint_uri == assigned and launch.resume_from is None  # nothing to resume yet
    [event] = _events(rt, job_id, "checkpoint_location_assigned")
    assert event.data["checkpoint_uri"] == assigned

    # the instance checkpoints there; reclaimed, the job moves to AWS with its checkpoint
    written = stores_dir / "usc1" / "tenants" / "demo" / "jobs" / job_id / "checkpoint" / "model.pt"
    written.parent.mkdir(parents=True)
    written.write_bytes(os.urandom(MiB))
    _run(rt, clock, 4)
    gcp.preempt(next(iter(gcp.vms)))
    gcp.prices = {"us-central1-a": Decimal("30")}
    tick(rt, clock())
    tick(rt, clock())
    staged = f"file://{stores_dir}/use1/tenants/demo/jobs/{job_id}/checkpoint/"
    [relaunch] = aws.requests
    assert relaunch.resume_from == staged and _job(rt, job_id).checkpoint_uri == staged
    copied = stores_dir / "use1" / "tenants" / "demo" / "jobs" / job_id / "checkpoint" / "model.pt"
    assert copied.read_bytes() == written.read_bytes()


def test_a_staging_attempt_stops_at_its_deadline_and_the_next_resumes_without_copying_again(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, stores_dir: Path
) -> None:
    from broker.store.tables import CheckpointCopyRow

    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_stores(stores_dir))
    source = stores_dir / "use1" / "tenants" / "demo" / "runs" / "big"
    source.mkdir(parents=True)
    sizes = {"a.pt": 2 * MiB, "b.pt": 3 * MiB, "c.pt": MiB}
    for name, size in sizes.items():
        (source / name).write_bytes(os.urandom(size))
    job_id, placement_id = _placed_on_gcp(rt, clock, f"file://{source}/", work_gpu_hours="1", max_total_usd="20")
    target = stores_dir / "usc1" / "tenants" / "demo" / "jobs" / job_id / "checkpoint"

    def expires_once_a_is_copied() -> float:  # a slow source: the attempt's time is up after the first object
        return 1e9 if (target / "a.pt").exists() else 0.0

    assert stage_checkpoint(rt, placement_id, clock(), clock=expires_once_a_is_copied) is Staging.FAILED
    [stopped] = _events(rt, job_id, "checkpoint_stage_failed")
    assert "staging stopped after 300 s" in stopped.message
    assert sorted(p.name for p in target.iterdir()) == ["a.pt"]
    first = (target / "a.pt").stat()

    assert stage_checkpoint(rt, placement_id, clock()) is Staging.STAGED
    again = (target / "a.pt").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # not copied a second time
    for name in sizes:
        assert (target / name).read_bytes() == (source / name).read_bytes()
    [egress] = [e for e in _ledger(rt, job_id) if e.kind == "egress"]
    assert egress.quantity == (Decimal(sum(sizes.values())) / BYTES_PER_GB).quantize(LEDGER_QUANTUM)
    with Session(rt.engine) as s:
        assert s.exec(select(CheckpointCopyRow)).all() == []  # no copy state or marks left behind
