"""A synthetic but realistic ledger for report tests and the report benchmark: jobs of several teams and projects
on spot, on-demand and on-prem pools of several providers, with wasted work, egress and a correction, written
with one bulk INSERT per table (the same rows the accrual step would write)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import Engine

from broker.store.tables import CostEntryRow, Job

TEAMS = ("nlp", "vision", "speech", "recsys")
PROJECTS = ("atlas", "borealis", "cygnus")
POOLS = (  # provider, region, zone, instance type, capacity type, $/h, on-demand $/h
    ("aws", "us-east-1", "us-east-1a", "p4d.24xlarge", "spot", Decimal("9.8304"), Decimal("32.7726")),
    ("aws", "us-west-2", "us-west-2b", "p5.48xlarge", "on_demand", Decimal("55.04"), Decimal("55.04")),
    ("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "spot", Decimal("1.1012"), Decimal("3.6733")),
    ("azure", "eastus", "", "Standard_NC24ads_A100_v4", "spot", Decimal("1.47"), Decimal("3.673")),
    ("onprem-slurm", "onprem", "dc1", "gpu", "on_prem", Decimal("8.80"), Decimal("8.80")),
)


def seed_ledger(engine: Engine, tenant: str, start: datetime, days: int, entries: int, seed: int = 1) -> Decimal:
    """Write `entries` cost entries (and their jobs) for `tenant` over `days` days from `start`. Returns their
    exact total."""
    rng = random.Random(seed)
    n_jobs = max(1, entries // 50)
    jobs: list[dict[str, Any]] = []
    for j in range(n_jobs):
        jobs.append(
            {
                "id": f"job_{tenant}_{j:06d}",
                "tenant": tenant,
                "team": TEAMS[j % len(TEAMS)],
                "project": PROJECTS[j % len(PROJECTS)],
                "name": f"train-{j}",
                "spec": {},
                "state": "succeeded",
                "wait_reason": "",
                "priority": 0,
                "max_total_usd": Decimal("100000"),
                "spent_usd": Decimal("0"),
                "work_hours": Decimal("1"),
                "remaining_work_hours": Decimal("0"),
                "attempts": 1,
                "origin_settled": False,
                "created_at": start,
                "updated_at": start,
            }
        )
    rows: list[dict[str, Any]] = []
    total = Decimal("0")
    span = days * 24 * 6  # 10-minute slots
    starts = [rng.randrange(span) for _ in range(n_jobs)]
    for i in range(entries):
        j, k = i % n_jobs, i // n_jobs  # job j's k-th 10-minute accrual: jobs run in contiguous stretches
        job = jobs[j]
        pool = (j + k // 10) % len(POOLS)  # re-placed on another pool every 10 entries
        provider, region, zone, itype, cap, hourly, od = POOLS[pool]
        slot = (starts[j] + k) % span
        begin = start + timedelta(minutes=10 * slot)
        end = begin + timedelta(minutes=10)
        hours = Decimal(1) / Decimal(6)
        kind, unit, usd, od_usd, qty = "compute", "Hours", (hourly * hours).quantize(Decimal("1e-10")), None, hours
        roll = i % 97
        if roll == 13 and cap == "spot":
            kind = "wasted"
        elif roll == 29:
            kind, unit, qty, usd = "egress", "GB", Decimal("12"), Decimal("1.08")
        elif roll == 61:
            kind, usd = "correction", Decimal("-0.25")
        if od_usd is None:
            od_usd = (od * hours).quantize(Decimal("1e-10")) if kind in ("compute", "wasted") else usd
        total += usd
        rows.append(
            {
                "job_id": job["id"],
                "placement_id": f"plc_{job['id']}_{pool}",
                "tenant": tenant,
                "team": job["team"],
                "project": job["project"],
                "provider": provider,
                "region": region,
                "zone": zone,
                "instance_type": itype,
                "resource_id": f"i-{j:010x}{pool:02d}",
                "capacity_type": cap,
                "kind": kind,
                "period_start_at": begin,
                "period_end_at": end,
                "hourly_usd": hourly,
                "usd": usd,
                "on_demand_usd": od_usd,
                "quantity": qty,
                "unit": unit,
                "corrects_id": None,
                "note": "",
                "created_at": end,
            }
        )
    with engine.begin() as conn:
        conn.execute(insert(Job.__table__), jobs)  # type: ignore[attr-defined]
        for k in range(0, len(rows), 5000):
            conn.execute(insert(CostEntryRow.__table__), rows[k : k + 5000])  # type: ignore[attr-defined]
    return total
