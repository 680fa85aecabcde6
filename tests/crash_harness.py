"""Crash-consistency harness: run the real broker (`overspill tick` processes) on PostgreSQL with the AWS adapter
against a moto server, SIGKILL it at a named crash point (broker/crashpoints.py), restart it without the crash
point, and check the invariants against the database and EC2.

One injection = one fresh database and a reset moto account, a small deterministic scenario for its point, a tick
process that must die by SIGKILL at `point:nth`, then `RECOVERY_TICKS` clean tick processes (each runs the orphan
sweep, with no grace), then `check_invariants`:
- no job lost: every submitted job is there and, after recovery, running again (or cancelled, when the scenario
  cancelled it); a running job's current placement is live, any other job has none;
- none running twice: at most one live placement per job, at most one pending/running EC2 instance per job;
- no instance billing unseen: every pending/running instance tagged with this broker belongs to a live placement;
  no placement is left launching without its instance;
- ledger = placements: each placement's `cost_usd` is the sum of its ledger entries, each job's `spent_usd` the
  sum of its own, and every entry covers a stretch no other entry of that placement and kind covers (compute, boot
  disk and public IPv4 each cover the run once);
- every ceiling honoured: `spent_usd <= max_total_usd`.

Accrual writes a batch of placements per transaction (`loop_batch_size`): `accrue.before_commit` is reached after
each placement's entries are written into the open batch (a kill there loses the whole uncommitted batch), and
`accrue.after_commit` after each batch commits; its scenario runs with batches of one, so the kill falls between
two placements' accruals of one tick.

`copy.between_parts` is a checkpoint copy (local file -> S3 on moto, resumable state in JSON files) run by
`tests/crash_copy_worker.py`, killed after part N and rerun: the destination must equal the source byte for byte,
the parts already uploaded must be reused, and no multipart upload may be left open.

Used by tests/test_crash.py (a representative subset in CI) and benchmarks/crash_bench.py (every point, many N).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlmodel import Session, select

from broker.api.schemas import JobCreate
from broker.config.settings import Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.services.jobs import cancel_job, submit_job
from broker.store.tables import CostEntryRow, Job, Placement
from providers.aws import ensure_interruption_queue, parse_instance_ref, tag_dict
from providers.model import BROKER_TAG, JOB_TAG, PlacementState
from tests.builders import job_body
from tests.moto_server import moto_client

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
BROKER_ID = "overspill-crash"
JOBS = 4
RECOVERY_TICKS = 2
REDELIVER_SECONDS = 2  # an unacknowledged spot warning comes back this soon (60 s by default)
LIVE = {PlacementState.LAUNCHING.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value}
BROKER_POINTS = (
    "place.after_commit",
    "launch.after_cloud_call",
    "preempt.before_commit",
    "sync.after_terminate",
    "accrue.before_commit",
    "accrue.after_commit",
)
COPY_POINT = "copy.between_parts"
POINTS = (*BROKER_POINTS, COPY_POINT)


@dataclass
class Outcome:
    point: str
    nth: int
    crashed: bool
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""

    @property
    def survived(self) -> bool:
        return self.crashed and not self.violations


@dataclass
class Env:
    """What every injection shares: the PostgreSQL server, the moto server, the overspill executable."""

    pg_admin_url: str
    moto_url: str
    workdir: Path
    create_database: Callable[[], str]

    def __post_init__(self) -> None:
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the in-process set-up's boto3 clients
            os.environ.setdefault(key, "testing")

    def reset_moto(self) -> None:
        req = urllib.request.Request(f"{self.moto_url}/moto-api/reset", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=30).close()


def overspill_bin() -> str:
    found = Path(sys.executable).with_name("overspill")
    return str(found) if found.exists() else "overspill"


def broker_settings(env: Env, db_url: str, ami: str, queue_url: str) -> dict[str, Any]:
    """The broker's settings for one injection (the same for the in-process set-up and the tick processes)."""
    return {
        "database_url": db_url,
        "data_dir": str(env.workdir),
        "simulated": False,
        "broker_id": BROKER_ID,
        "aws_regions": [REGION],
        "aws_instance_types": ["g5.xlarge"],
        "aws_endpoint_url": env.moto_url,
        "aws_launch": True,
        "aws_image_id": ami,
        "aws_interruption_queue_url": queue_url,
        "orphan_grace_seconds": 0,
        "orphan_sweep_seconds": 0,
        "tick_interval_seconds": 10,
        # a cadence of a second: the placements the scenario started a second before are due in the crashing
        # tick, accrued up to their own grid points (`broker.loop.accrue`), and again in each recovery tick
        "accrual_cadence_seconds": 1,
        "aws_interruption_redeliver_seconds": REDELIVER_SECONDS,
        "checkpoint_stores": {"aws/us-east-1": _store(env)},  # the agent's spec, logs and reports
    }


def _store(env: Env) -> str:
    """A file checkpoint store beside the work dir (the data dir, which no store may be near)."""
    root = env.workdir.parent / f"{env.workdir.name}-store"
    root.mkdir(parents=True, exist_ok=True)
    return f"file://{root}/"


def process_env(settings: dict[str, Any]) -> dict[str, str]:
    """Those settings as the environment of an `overspill` process (plus moto's dummy AWS credentials)."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    out.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION})
    for key, value in settings.items():
        text = json.dumps(value) if isinstance(value, list | dict | bool) else str(value)
        out[f"OVERSPILL_{key.upper()}"] = text
    return out


def run_tick(env_vars: dict[str, str], crash: str | None = None, timeout: float = 180) -> int:
    """One `overspill tick` process; its return code (-9 when the crash point killed it)."""
    proc_env = dict(env_vars)
    if crash:
        proc_env["OVERSPILL_CRASHPOINT"] = crash
    done = subprocess.run(
        [overspill_bin(), "tick", "--json"], env=proc_env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"tick failed ({done.returncode}): {done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.returncode


def run_injection(env: Env, point: str, nth: int, *, jobs: int = JOBS) -> Outcome:
    """One injection: `point` killed at its `nth` arrival (`jobs` jobs in the broker scenarios)."""
    started = time.perf_counter()
    outcome = _copy_injection(env, nth) if point == COPY_POINT else _broker_injection(env, point, nth, jobs)
    outcome.seconds = time.perf_counter() - started
    return outcome


def _broker_injection(env: Env, point: str, nth: int, jobs: int) -> Outcome:
    env.reset_moto()
    ec2 = moto_client("ec2", REGION, env.moto_url)
    sqs = moto_client("sqs", REGION, env.moto_url)
    events = moto_client("events", REGION, env.moto_url)
    queue_url = ensure_interruption_queue(events, sqs, "overspill-crash")
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    db_url = env.create_database()
    settings = broker_settings(env, db_url, ami, queue_url)
    if point == "accrue.after_commit":
        settings["loop_batch_size"] = 1  # one commit per placement: a crash between two placements' accruals
    vars_ = process_env(settings)
    # the set-up runs in this process (a process start costs ~3 s here); the crash and the recovery run in
    # `overspill tick` processes
    rt = build_runtime(Settings(**settings))
    engine = rt.engine
    try:
        tick(rt, datetime.now(UTC))  # prices
        job_ids = _submit(engine, jobs)
        if point not in ("place.after_commit", "launch.after_cloud_call"):
            tick(rt, datetime.now(UTC))  # placed and launched
            tick(rt, datetime.now(UTC))  # started
            time.sleep(1.0)  # something to accrue
        if point == "preempt.before_commit":
            _warn_interruptions(engine, events)
        if point == "sync.after_terminate":
            now = datetime.now(UTC)
            for jid in job_ids:
                cancel_job(engine, "demo", jid, now)
        code = run_tick(vars_, crash=f"{point}:{nth}")
        if point == "preempt.before_commit":
            time.sleep(REDELIVER_SECONDS + 0.5)  # the warnings the crash left unacknowledged come back
        for _ in range(RECOVERY_TICKS):
            run_tick(vars_)
        violations = check_invariants(engine, ec2, job_ids)
        if point == "preempt.before_commit":
            violations += _warnings_acted_on(engine, job_ids)
    finally:
        engine.dispose()
    return Outcome(point, nth, crashed=code == -signal.SIGKILL, violations=violations)


def _submit(engine: Any, jobs: int) -> list[str]:
    from broker.market.catalog import CatalogCache

    catalog = CatalogCache(engine)
    ids = []
    for i in range(jobs):
        body = job_body(name=f"crash-{i}", accelerators=["A10G"], work_gpu_hours="3", max_total_usd="50")
        job, _ = submit_job(
            engine, catalog, tenant="demo", create=JobCreate(**body), idempotency_key=None, now=datetime.now(UTC)
        )
        ids.append(job.id)
    return ids


def _warnings_acted_on(engine: Any, job_ids: list[str]) -> list[str]:
    """After the restart every warned job was moved off its warned instance, or (an instance running the agent,
    which saves a final checkpoint first) has the warning's deadline recorded: no warning lost in the crash."""
    with Session(engine) as s:
        acted = {
            p.job_id
            for p in s.exec(select(Placement)).all()
            if p.state == PlacementState.PREEMPTED.value or p.notice_deadline_at is not None
        }
    return [f"the reclaim warning for job {j} was lost in the crash" for j in job_ids if j not in acted]


def _warn_interruptions(engine: Any, events: Any) -> None:
    with Session(engine) as s:
        refs = [p.instance_id for p in s.exec(select(Placement)).all() if p.instance_id and p.state in LIVE]
    entries = []
    for ref in refs:
        _, ec2_id = parse_instance_ref(ref)
        entries.append(
            {
                "Source": "aws.ec2",
                "DetailType": "EC2 Spot Instance Interruption Warning",
                "Detail": json.dumps({"instance-id": ec2_id, "instance-action": "terminate"}),
                "Resources": [f"arn:aws:ec2:{REGION}a:instance/{ec2_id}"],
            }
        )
    for i in range(0, len(entries), 10):
        events.put_events(Entries=entries[i : i + 10])


def check_invariants(engine: Any, ec2: Any, job_ids: list[str]) -> list[str]:
    """Every violated invariant, described (empty when the broker is consistent)."""
    bad: list[str] = []
    with Session(engine) as s:
        jobs = {j.id: j for j in s.exec(select(Job)).all()}
        placements = s.exec(select(Placement)).all()
        entries = s.exec(select(CostEntryRow)).all()
    for jid in job_ids:
        if jid not in jobs:
            bad.append(f"job {jid} lost")
    by_job: dict[str, list[Placement]] = defaultdict(list)
    for p in placements:
        by_job[p.job_id].append(p)
        if p.state == PlacementState.LAUNCHING.value and p.instance_id is None:
            bad.append(f"placement {p.id} left launching without an instance")
    for jid, job in jobs.items():
        live = [p for p in by_job[jid] if p.state in LIVE]
        if len(live) > 1:
            bad.append(f"job {jid} has {len(live)} live placements")
        if job.state == "running" and (not live or job.current_placement_id != live[0].id):
            bad.append(f"job {jid} running without its live placement")
        if job.state != "running" and live and job.state != "cancelled":
            bad.append(f"job {jid} is {job.state} but placement {live[0].id} is live")
        if job.state not in ("running", "cancelled", "succeeded"):
            bad.append(f"job {jid} did not recover: {job.state} ({job.wait_reason})")
        if job.spent_usd > job.max_total_usd:
            bad.append(f"job {jid} spent {job.spent_usd} over its ceiling {job.max_total_usd}")
    per_placement: dict[str, Decimal] = defaultdict(Decimal)
    per_job: dict[str, Decimal] = defaultdict(Decimal)
    # one stretch per kind: compute, and beside it the boot disk and public IPv4 of the same run
    stretches: dict[tuple[str, str], list[tuple[datetime, datetime]]] = defaultdict(list)
    for e in entries:
        per_job[e.job_id] += e.usd
        if e.placement_id:
            per_placement[e.placement_id] += e.usd
            stretches[(e.placement_id, e.kind)].append((e.period_start_at, e.period_end_at))
    for p in placements:
        if per_placement[p.id] != p.cost_usd:
            bad.append(f"placement {p.id} cost {p.cost_usd} != ledger {per_placement[p.id]}")
    for jid, job in jobs.items():
        if per_job[jid] != job.spent_usd:
            bad.append(f"job {jid} spent {job.spent_usd} != ledger {per_job[jid]}")
    for (pid, kind), spans in stretches.items():
        spans.sort()
        for (_, a_end), (b_start, _) in itertools.pairwise(spans):
            if b_start < a_end:
                bad.append(f"placement {pid} accrued one stretch of {kind} twice ({b_start} < {a_end})")
    live_instances = {p.instance_id for p in placements if p.state in LIVE and p.instance_id}
    running_per_job: dict[str, int] = defaultdict(int)
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": f"tag:{BROKER_TAG}", "Values": [BROKER_ID]}]
    )
    for page in pages:
        for res in page["Reservations"]:
            for raw in res["Instances"]:
                if raw["State"]["Name"] not in ("pending", "running"):
                    continue
                ref = f"{REGION}:{raw['InstanceId']}"
                tags = tag_dict(raw)
                running_per_job[tags.get(JOB_TAG, "")] += 1
                if ref not in live_instances:
                    bad.append(f"instance {ref} is running without a live placement (tags {tags})")
    for jid, n in running_per_job.items():
        if n > 1:
            bad.append(f"job {jid} runs on {n} instances")
    return bad


# -- checkpoint copy -------------------------------------------------------------------------------------------------

COPY_PART = 5 * 1024 * 1024
COPY_PARTS = 6


def _copy_injection(env: Env, nth: int) -> Outcome:
    env.reset_moto()
    s3 = moto_client("s3", REGION, env.moto_url)
    s3.create_bucket(Bucket="ckpt")
    work = Path(tempfile.mkdtemp(prefix="crash-copy-", dir=env.workdir))
    src = work / "src"
    src.mkdir()
    data = hashlib.sha256(f"seed-{nth}".encode()).digest() * ((COPY_PART * COPY_PARTS - COPY_PART // 2) // 32)
    (src / "ckpt.bin").write_bytes(data)
    vars_ = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    cmd = [sys.executable, "-m", "tests.crash_copy_worker", str(src), env.moto_url, "ckpt", str(work / "state")]
    crashed = subprocess.run(
        cmd, env={**vars_, "OVERSPILL_CRASHPOINT": f"{COPY_POINT}:{nth}"}, cwd=ROOT, capture_output=True, timeout=120
    )
    again = subprocess.run(cmd, env=vars_, cwd=ROOT, capture_output=True, text=True, timeout=120)
    bad = []
    if again.returncode != 0:
        bad.append(f"resumed copy failed: {again.stderr[-2000:]}")
        return Outcome(COPY_POINT, nth, crashed=crashed.returncode == -signal.SIGKILL, violations=bad)
    result = json.loads(again.stdout.strip().splitlines()[-1])
    body = s3.get_object(Bucket="ckpt", Key="ckpt.bin")["Body"].read()
    if hashlib.sha256(body).hexdigest() != hashlib.sha256(data).hexdigest():
        bad.append("the copied checkpoint differs from its source")
    expected = min(nth * COPY_PART, len(data))
    if result["resumed_from_bytes"] != expected:
        bad.append(f"resumed from {result['resumed_from_bytes']} bytes, expected {expected}")
    if s3.list_multipart_uploads(Bucket="ckpt").get("Uploads"):
        bad.append("a multipart upload was left open")
    if list((work / "state").glob("*.json")):
        bad.append("copy state left behind after completion")
    return Outcome(
        COPY_POINT,
        nth,
        crashed=crashed.returncode == -signal.SIGKILL,
        violations=bad,
        detail=f"resumed {result['resumed_from_bytes']} bytes",
    )


def format_table(outcomes: list[Outcome]) -> str:
    rows: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        rows[o.point].append(o)
    lines = [
        f"{'crash point':<26} {'injections':>10} {'killed':>7} {'survived':>9} {'violations':>10} {'s/injection':>11}",
    ]
    for point in POINTS:
        group = rows.get(point)
        if not group:
            continue
        lines.append(
            f"{point:<26} {len(group):>10} {sum(o.crashed for o in group):>7} {sum(o.survived for o in group):>9} "
            f"{sum(len(o.violations) for o in group):>10} {sum(o.seconds for o in group) / len(group):>11.1f}"
        )
    lines.append(
        f"{'total':<26} {len(outcomes):>10} {sum(o.crashed for o in outcomes):>7} "
        f"{sum(o.survived for o in outcomes):>9} {sum(len(o.violations) for o in outcomes):>10}"
    )
    return "\n".join(lines)
