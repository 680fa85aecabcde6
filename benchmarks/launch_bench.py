"""Launching on GCP and Azure: how long each tick step takes with hundreds of launches in flight.

One broker process (no API) launches `--jobs` jobs on the Compute Engine or ARM stand-in (tests/gcp_compute_fake.py,
tests/azure_compute_fake.py), with the adapters built from settings as in production (`build_providers`: the real
google-cloud-compute and azure-mgmt-compute clients). Every create takes `--op-seconds` to finish at the stand-in
(the insert operation / the ARM long-running operation; real clouds take 30 s to several minutes), and a GCP VM stays
PROVISIONING that long. The script submits the jobs, then ticks `--ticks` times back to back and prints, per tick,
the duration of each step that touches the cloud (place_pending launches, sync_instances follows the launches) and
how many creates were still running at the stand-in when the tick ended.

Target: no step waits on a cloud operation, so place_pending costs a few API calls per launch whatever the
operation takes, and sync_instances one batched read per tick. Before (a launch waited for its operation: GCP up to
300 s through zoneOperations.wait, Azure up to 900 s polling the LRO), place_pending took about jobs x op-seconds.
Measure before by running this same script against the older code: `--code /path/to/that/checkout` puts it first on
the import path (its adapters, its stand-ins); Azure's LRO is then polled every 0.25 s.

Run (from the repository root, in the environment where the project is installed):
    python benchmarks/launch_bench.py                                  # 200 jobs on each stand-in, 1 s operations
    python benchmarks/launch_bench.py --cloud gcp --op-seconds 60      # operations longer than the run: all in flight
    python benchmarks/launch_bench.py --code ../main --jobs 50         # the code before, for comparison
    python benchmarks/launch_bench.py --json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

STEPS = ("place_pending", "sync_instances", "accrue_costs", "sweep_orphans")
SUB = "00000000-0000-0000-0000-000000000001"
RG = "overspill-bench"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/v/subnets/s"
GCP_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"


def _path(code: str | None) -> None:
    root = Path(code).resolve() if code else Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))


class Market:
    """Spot T4 pools in a few zones of the cloud under test, priced low enough for every job's ceiling."""

    def __init__(self, provider: str, places: list[tuple[str, str]], instance_type: str) -> None:
        self.name = f"{provider}-bench-prices"
        self.provider = provider
        self.places = places
        self.instance_type = instance_type

    def offerings(self, now: datetime) -> list[Any]:
        from providers.model import CapacityType, Offering, Price

        return [
            Offering(
                provider=self.provider,
                region=region,
                zone=zone,
                instance_type=self.instance_type,
                accelerator="T4",
                accelerator_count=1,
                gpu_memory_gib=16,
                vcpus=4,
                memory_gib=Decimal(28),
                capacity_type=CapacityType.SPOT,
                price=Price(Decimal("0.20") + Decimal(n) / 100, "bench", now),
            )
            for n, (region, zone) in enumerate(self.places)
        ]


@contextmanager
def stand_in(cloud: str, op_seconds: float) -> Iterator[tuple[dict[str, Any], Market, Any]]:
    """The cloud's stand-in, the settings that launch there, its prices, and a function counting running creates."""
    if cloud == "gcp":
        from tests.gcp_compute_fake import GcpComputeFake

        with GcpComputeFake(op_seconds=op_seconds, boot_seconds=op_seconds) as fake:
            settings = {
                "gcp_launch": True,
                "gcp_project": fake.project,
                "gcp_regions": ["us-central1"],
                "gcp_image": GCP_IMAGE,
                "gcp_endpoint": fake.endpoint,
                "gcp_anonymous_credentials": True,
            }
            market = Market(
                "gcp",
                [("us-central1", "us-central1-a"), ("us-central1", "us-central1-b")],
                "n1-standard-4+1xnvidia-tesla-t4",
            )

            def running() -> int:
                with fake._lock:
                    fake._advance()
                    return sum(
                        1
                        for op in fake.operations.values()
                        if op["operationType"] == "insert" and op["status"] != "DONE"
                    )

            yield settings, market, running
    else:
        from tests.azure_compute_fake import AzureComputeFake

        with AzureComputeFake(SUB, op_seconds=op_seconds) as fake:
            settings = {
                "azure_launch": True,
                "azure_subscription_id": SUB,
                "azure_resource_group": RG,
                "azure_location": "eastus",
                "azure_subnet_id": SUBNET,
                "azure_image_reference": {
                    "publisher": "microsoft-dsvm",
                    "offer": "ubuntu-hpc",
                    "sku": "2204",
                    "version": "latest",
                },
                "azure_ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOverspillBenchKeyOnly bench@overspill",
                "azure_endpoint": fake.url,
                "azure_static_test_token": True,
                "azure_polling_interval_seconds": 0.25,  # older code only: how often it polled a create
            }
            market = Market("azure", [("eastus", "eastus")], "Standard_NC4as_T4_v3")

            def running() -> int:
                with fake._lock:
                    fake._advance()
                    return sum(1 for op in fake.operations.values() if op.kind == "put" and op.status == "InProgress")

            yield settings, market, running


def run(cloud: str, jobs: int, op_seconds: float, ticks: int, progress: bool) -> dict[str, Any]:
    from sqlmodel import Session, col, select

    from broker.api.schemas import JobCreate
    from broker.config.settings import DEV_API_KEY, Settings
    from broker.loop.tick import tick
    from broker.runtime import build_runtime
    from broker.services.jobs import submit_job
    from broker.store.tables import Placement
    from tests.builders import job_body

    workdir = Path(tempfile.mkdtemp(prefix="launch-bench-"))
    with stand_in(cloud, op_seconds) as (cloud_settings, market, running):
        known = set(Settings.model_fields)
        values = {k: v for k, v in cloud_settings.items() if k in known}
        if "agent_root" in known:  # instances run the agent: it needs a checkpoint store of their cloud
            from tests.builders import agent_store

            values["checkpoint_stores"] = agent_store(workdir)
        settings = Settings(
            database_url=f"sqlite:///{workdir / 'broker.store.db'}",
            data_dir=workdir,
            simulated=False,
            bootstrap_api_key=DEV_API_KEY,
            broker_id="overspill-bench",
            max_placements_per_tick=jobs,
            orphan_sweep_seconds=3600,
            wait_value_usd_per_gpu_hour=0,
            **values,
        )
        rt = build_runtime(settings)
        rt.offering_sources.append(market)
        tick(rt, datetime.now(UTC))
        for i in range(jobs):
            body = job_body(name=f"launch-{i}", accelerators=["T4"], work_gpu_hours="20", max_total_usd="500")
            submit_job(
                rt.engine,
                rt.catalog,
                tenant="demo",
                create=JobCreate(**body),
                idempotency_key=None,
                now=datetime.now(UTC),
            )
        rows = []
        started = time.perf_counter()
        for n in range(ticks):
            report = tick(rt, datetime.now(UTC))
            with Session(rt.engine) as s:
                states = s.exec(
                    select(Placement.state).where(col(Placement.state).in_(("launching", "queued", "running")))
                ).all()
            steps = {s.name: {"count": s.count, "seconds": round(s.seconds, 3), "error": s.error} for s in report.steps}
            row = {
                "tick": n,
                "seconds": round(sum(s.seconds for s in report.steps), 3),
                "steps": {name: steps[name] for name in STEPS if name in steps},
                "placements_launching": sum(1 for s in states if s in ("launching", "queued")),
                "placements_running": sum(1 for s in states if s == "running"),
                "creates_running_at_cloud": running(),
            }
            rows.append(row)
            if progress:
                print(f"{cloud} tick {n}: {row['seconds']:.1f} s", file=sys.stderr, flush=True)
        rt.engine.dispose()
    return {
        "cloud": cloud,
        "jobs": jobs,
        "op_seconds": op_seconds,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "ticks": rows,
    }


def table(result: dict[str, Any]) -> str:
    head = (
        f"{'tick':>4} {'total s':>8}  "
        + "  ".join(f"{name:>22}" for name in STEPS)
        + "   launching/running  creates at cloud"
    )
    lines = [
        f"{result['cloud']}: {result['jobs']} jobs, each create takes {result['op_seconds']} s at the stand-in",
        head,
        "-" * len(head),
    ]
    for row in result["ticks"]:
        cells = []
        for name in STEPS:
            step = row["steps"].get(name)
            cells.append(f"{step['count']:>7} in {step['seconds']:>8.2f} s" if step else f"{'-':>22}")
        lines.append(
            f"{row['tick']:>4} {row['seconds']:>8.2f}  "
            + "  ".join(f"{c:>22}" for c in cells)
            + f"   {row['placements_launching']:>9}/{row['placements_running']:<7}"
            + f"  {row['creates_running_at_cloud']:>16}"
        )
        for name, step in row["steps"].items():
            if step["error"]:
                lines.append(f"     ERROR {name}: {step['error']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cloud", choices=["gcp", "azure", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--op-seconds", type=float, default=1.0, help="how long a create takes at the stand-in")
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--code", help="the checkout whose broker to measure (default: this one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    _path(args.code)
    logging.disable(logging.WARNING)
    clouds = ["gcp", "azure"] if args.cloud == "both" else [args.cloud]
    results = [run(c, args.jobs, args.op_seconds, args.ticks, not args.json) for c in clouds]
    if args.json:
        print(json.dumps(results))
    else:
        print("\n\n".join(table(r) for r in results))
    failed = any(step["error"] for r in results for row in r["ticks"] for step in row["steps"].values())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
