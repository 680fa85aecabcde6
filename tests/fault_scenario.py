"""Cloud faults scenario: the broker places jobs on AWS (moto) through a proxy that fails 20% of EC2 calls
(tests/fault_proxy.py: capacity errors, throttling, 5xx, timeouts), and must still place every job exactly once,
with bounded, spaced retries and the capacity blocklist in use.

`run_fault_scenario` drives an in-process broker (the real AWS adapter and boto3 clients, pointed at the proxy,
botocore retries off as in production, a 1 s read timeout) on a clock that moves one minute per tick, until every
job runs or `max_ticks` pass, then sweeps orphans and checks the crash harness's invariants against moto directly
(no instance without a live placement, none running twice, ledger = placements, ceilings). It returns the figures:
RunInstances attempts per placement, adapter retries and their total backoff, faults by kind, blocklist entries
made by capacity errors, ticks needed.

Used by tests/test_faults.py (small, in CI) and benchmarks/faults_bench.py (large, prints the table).
"""

from __future__ import annotations

import itertools
import os
import statistics
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from broker.catalog import CatalogCache
from broker.loop.interrupts import sweep_orphans
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.schemas import JobCreate
from broker.services.jobs import submit_job
from broker.settings import Settings
from broker.tables import Job, JobEvent, Placement
from providers.aws import AwsProvider
from tests.builders import job_body
from tests.crash_harness import BROKER_ID, REGION, check_invariants
from tests.fault_proxy import FaultProxy
from tests.moto_server import moto_client


@dataclass
class FaultReport:
    jobs: int
    placed: int
    ticks: int
    run_instances_calls: int
    attempts_per_placement: float
    max_attempts_one_launch: int
    adapter_retries: int
    backoff_seconds: float
    median_retry_gap_seconds: float
    faults: dict[str, int]
    capacity_failures_seen: int
    blocklist_entries: int
    failed_placements: int
    replayed_tokens: int
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [
            ("jobs submitted / placed exactly once", f"{self.jobs} / {self.placed}"),
            ("ticks until every job ran", str(self.ticks)),
            ("faults injected (capacity/throttle/5xx/timeout)", "/".join(str(v) for v in self.faults.values())),
            ("RunInstances calls", str(self.run_instances_calls)),
            ("attempts per placement (RunInstances calls / job)", f"{self.attempts_per_placement:.2f}"),
            ("most RunInstances calls for one launch token", str(self.max_attempts_one_launch)),
            (
                "adapter retries (all EC2 calls) / backoff slept",
                f"{self.adapter_retries} / {self.backoff_seconds:.2f} s",
            ),
            ("median gap between retries of one launch", f"{self.median_retry_gap_seconds:.3f} s"),
            (
                "capacity errors seen by the broker -> blocklist",
                f"{self.capacity_failures_seen} -> {self.blocklist_entries}",
            ),
            ("failed placements (re-placed elsewhere)", str(self.failed_placements)),
            ("retried launches answered from the ClientToken", str(self.replayed_tokens)),
            ("invariant violations", str(len(self.violations))),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run_fault_scenario(
    *, db_url: str, moto_url: str, proxy: FaultProxy, workdir: Path, jobs: int, max_ticks: int = 40
) -> FaultReport:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    reset = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST", data=b"")
    urllib.request.urlopen(reset, timeout=30).close()
    ec2 = moto_client("ec2", REGION, moto_url)
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    now = datetime.now(UTC).replace(microsecond=0)
    clock_now = [now]
    settings = Settings(
        database_url=db_url,
        data_dir=workdir,
        simulated=False,
        broker_id=BROKER_ID,
        aws_regions=[REGION],
        aws_instance_types=["g5.xlarge"],
        aws_endpoint_url=proxy.url,
        aws_launch=True,
        aws_image_id=ami,
        orphan_grace_seconds=0,
        orphan_sweep_seconds=3600,  # the sweep runs once, after the scenario (a live launch is never an orphan)
        tick_interval_seconds=60,
        cloud_timeout_seconds=1.0,
        price_refresh_seconds=3600,
    )
    rate = proxy.rate
    proxy.rate = 0.0  # the price catalog loads cleanly; the faults are about launching
    rt = build_runtime(settings, clock=lambda: clock_now[0])
    tick(rt, clock_now[0])
    catalog = CatalogCache(rt.engine)
    job_ids = []
    for i in range(jobs):
        body = job_body(name=f"fault-{i}", accelerators=["A10G"], work_gpu_hours="3", max_total_usd="50")
        job, _ = submit_job(
            rt.engine, catalog, tenant="demo", create=JobCreate(**body), idempotency_key=None, now=clock_now[0]
        )
        job_ids.append(job.id)
    proxy.rate = rate
    ticks = 0
    while ticks < max_ticks:
        clock_now[0] += timedelta(minutes=1)
        tick(rt, clock_now[0])
        ticks += 1
        with Session(rt.engine) as s:
            waiting = s.exec(select(Job.id).where(col(Job.state) != "running")).all()
        if not waiting:
            break
    proxy.rate = 0.0
    rt.marks.pop("sweep_orphans", None)
    sweep_orphans(rt, clock_now[0] + timedelta(minutes=1))
    violations = check_invariants(rt.engine, ec2, job_ids)
    return _report(rt, proxy, job_ids, ticks, violations)


def _report(rt: Any, proxy: FaultProxy, job_ids: list[str], ticks: int, violations: list[str]) -> FaultReport:
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement)).all()
        events = s.exec(select(JobEvent).where(JobEvent.kind == "launch_failed")).all()
        jobs = s.exec(select(Job)).all()
    provider = rt.providers["aws"]
    assert isinstance(provider, AwsProvider)
    stats = proxy.stats
    gaps = [b - a for times in stats.launch_attempts.values() for a, b in itertools.pairwise(times) if len(times) > 1]
    capacity_seen = [e for e in events if "InsufficientCapacity" in e.message]
    blocked = [e for e in capacity_seen if e.data.get("blocked")]
    placed = sum(1 for j in jobs if j.state == "running")
    calls = stats.requests["RunInstances"]
    return FaultReport(
        jobs=len(job_ids),
        placed=placed,
        ticks=ticks,
        run_instances_calls=calls,
        attempts_per_placement=calls / placed if placed else float("nan"),
        max_attempts_one_launch=max((len(t) for t in stats.launch_attempts.values()), default=0),
        adapter_retries=provider.retry.retries_made,
        backoff_seconds=provider.retry.slept_seconds,
        median_retry_gap_seconds=statistics.median(gaps) if gaps else 0.0,
        faults={k: stats.faults_of(k) for k in ("capacity", "throttle", "server", "timeout")},
        capacity_failures_seen=len(capacity_seen),
        blocklist_entries=len(blocked),
        failed_placements=sum(1 for p in placements if p.state == "failed"),
        replayed_tokens=stats.replayed_tokens,
        violations=violations,
    )
