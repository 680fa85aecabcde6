"""Builders for test inputs."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

from federation.simulate.traces import SpotTrace


def job_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "resnet-finetune",
        "team": "vision",
        "project": "atlas",
        "image": "ghcr.io/acme/train:1.0",
        "command": ["python", "train.py"],
        "accelerators": ["A100"],
        "gpu_count": 1,
        "work_gpu_hours": "2",
        "max_total_usd": "50",
    }
    body.update(overrides)
    return body


def offering(
    *,
    provider: str = "aws",
    region: str = "us-east-1",
    zone: str = "us-east-1a",
    instance_type: str = "p4d.24xlarge",
    accelerator: str = "A100",
    count: int = 8,
    gpu_memory: int = 40,
    vcpus: int = 96,
    memory: str = "1152",
    capacity: str = "spot",
    price: str = "10",
    rate: float = 0.0,
    egress: str = "0.09",
    wait: float = 0.0,
    available: bool = True,
) -> Any:
    from datetime import UTC, datetime
    from decimal import Decimal

    from providers.model import CapacityType, Offering, Price

    return Offering(
        provider=provider,
        region=region,
        zone=zone,
        instance_type=instance_type,
        accelerator=accelerator,
        accelerator_count=count,
        gpu_memory_gib=gpu_memory,
        vcpus=vcpus,
        memory_gib=Decimal(memory),
        capacity_type=CapacityType(capacity),
        price=Price(Decimal(price), "test", datetime(2026, 11, 2, tzinfo=UTC)),
        interruption_rate_per_hour=rate,
        egress_usd_per_gb=Decimal(egress),
        expected_wait_hours=wait,
        available=available,
    )


def spec(**overrides: Any) -> Any:
    from decimal import Decimal

    from providers.model import JobSpec

    fields: dict[str, Any] = {
        "tenant": "t",
        "team": "vision",
        "project": "atlas",
        "name": "job",
        "image": "img",
        "command": (),
        "accelerators": ("A100",),
        "gpu_count": 8,
        "max_total_usd": Decimal("1000"),
        "work_gpu_hours": Decimal("80"),
    }
    fields.update(overrides)
    return JobSpec(**fields)


def agent_store(
    tmp_path: Path, places: tuple[str, ...] = ("aws/us-east-1", "gcp/us-central1", "azure/eastus")
) -> dict[str, str]:
    """File checkpoint stores for clouds whose instances run the agent (it needs one: spec, logs, reports), beside
    `tmp_path` (a test's data dir, which no store may be near)."""
    root = tmp_path.parent / f"{tmp_path.name}-stores"
    out = {}
    for place in places:
        (root / place.replace("/", "-")).mkdir(parents=True, exist_ok=True)
        out[place] = f"file://{root / place.replace('/', '-')}/"
    return out


def future_randomised(trace: SpotTrace, cut: int, seed: int, on_demand_usd: float = 3.0) -> SpotTrace:
    """`trace` (one price per zone) with every zone's availability from tick `cut` on drawn at random: what a
    policy decides before `cut` must not change (it may not look ahead)."""
    rng = random.Random(seed)
    bits = {
        z.zone: "".join("1" if b else "0" for b in z.available[:cut])
        + "".join(rng.choice("01") for _ in range(len(trace) - cut))
        for z in trace.zones
    }
    return SpotTrace.from_bits(bits, {z.zone: z.spot_usd[0] for z in trace.zones}, on_demand_usd, trace.gap_seconds)


def running_placement(pid: str, job_id: str, tenant: str, created_at: Any, **overrides: Any) -> Any:
    """A `Placement` row of `job_id` running on a one-GPU AWS spot pool (launch token = its id), for tests that need
    one in the database without launching it."""
    from broker.store.tables import Placement

    fields: dict[str, Any] = {
        "id": pid,
        "job_id": job_id,
        "tenant": tenant,
        "offering_key": "aws/us-east-1/us-east-1a/p4d.24xlarge/spot",
        "provider": "aws",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "instance_type": "p4d.24xlarge",
        "capacity_type": "spot",
        "accelerator": "A100",
        "accelerator_count": 1,
        "hourly_usd": Decimal("1"),
        "on_demand_hourly_usd": Decimal("3"),
        "expected_cost_usd": Decimal("2"),
        "launch_token": pid,
        "state": "running",
        "created_at": created_at,
        **overrides,
    }
    return Placement(**fields)
