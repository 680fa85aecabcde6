"""Malformed input from outside the API: a broken catalog file and broken Slurm output are refused with an error
naming what is wrong, and the last good data stays in use. (Price feeds failing mid-refresh keep their last good
prices too: tests/test_price_feeds_store.py.)"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlmodel import Session, select

from broker.loop.feeds import refresh_prices, sample_pressure
from broker.runtime import Runtime
from broker.services.prices import import_catalog_files
from broker.store.tables import FeedStatus, OfferingRow, Placement, PressureRow
from federation.pressure import QueueModel
from pricing.advisor import Band
from pricing.feeds import FeedError
from providers.slurm.provider import PartitionInfo, SlurmProvider
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import admin_api
from tests.slurm_cluster import SlurmCluster

HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone,Arch"
GOOD = "p3.2xlarge,V100,1,8,61,3.06,0.9,us-east-1,use1-az1,x86_64"


def _rows(rt: Runtime, feed: str) -> list[OfferingRow]:
    with Session(rt.engine) as s:
        return list(s.exec(select(OfferingRow).where(OfferingRow.feed == feed)).all())


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        (
            HEADER + "\np3.2xlarge,V100,1,8,61,abc,0.9,us-east-1,use1-az1,x86_64\n",
            r"line 2: Price 'abc' is not a number",
        ),
        ("InstanceType,Region\np3.2xlarge,us-east-1\n", r"missing column\(s\)"),
        ("", r"empty file"),
        ("\x00\xff\xfe garbage", r"aws_vms\.csv"),
    ],
)
def test_a_broken_catalog_file_is_refused_and_the_last_good_one_stays(
    tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock, broken: str, says: str
) -> None:
    rt = make_runtime(f"sqlite:///{tmp_path / 'b.db'}", simulated=False)
    path = tmp_path / "aws_vms.csv"
    path.write_text(HEADER + "\n" + GOOD + "\n")
    import_catalog_files(rt, [path], clock())
    before = _rows(rt, "catalog:aws_vms.csv")
    assert len(before) == 2 and {r.hourly_usd for r in before} == {Decimal("3.06"), Decimal("0.9")}
    path.write_bytes(broken.encode("latin-1"))
    with pytest.raises(FeedError, match=says):
        import_catalog_files(rt, [path], clock.advance(hours=1))
    after = _rows(rt, "catalog:aws_vms.csv")
    assert [(r.key, r.hourly_usd) for r in after] == [(r.key, r.hourly_usd) for r in before]
    assert rt.catalog.book(clock()).get(before[0].key) is not None, "the placement catalog still has the pool"


@pytest.mark.integration
def test_broken_slurm_output_keeps_the_last_good_pools_and_pressure(
    cluster: SlurmCluster, tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """The real Slurm tools answer first; then their output arrives cut in half (a tool killed mid-write, a
    version printing another shape): the feeds record a clear error and the last good data is kept."""
    cluster.cancel_all()
    broken = {"on": False}

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        done = cluster.run(argv)
        if broken["on"] and argv[0] in ("squeue", "sinfo"):
            return subprocess.CompletedProcess(argv, 0, done.stdout[: len(done.stdout) // 2], done.stderr)
        return done

    provider = SlurmProvider(
        broker_id="hostile",
        partitions={"gpu": PartitionInfo("A100", Decimal("1.10"), 4)},
        queue_model=QueueModel,
        run=run,
    )
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}", simulated=False)
    rt.providers[provider.name] = provider
    rt.offering_sources.append(provider)
    rt.pressure_sources.append(provider)
    refresh_prices(rt, clock(), force=True)
    sample_pressure(rt, clock())
    with Session(rt.engine) as s:
        pools = s.exec(
            select(OfferingRow.key, OfferingRow.hourly_usd).where(OfferingRow.provider == provider.name)
        ).all()
        pressure = s.exec(select(PressureRow).where(PressureRow.source == provider.name)).all()
    assert pools and pressure, "the real cluster's pools and pressure were read"
    good_pressure = [(p.accelerator, p.total_gpus) for p in pressure]

    broken["on"] = True
    refresh_prices(rt, clock.advance(minutes=10), force=True)
    sample_pressure(rt, clock())
    with Session(rt.engine) as s:
        pools_after = s.exec(
            select(OfferingRow.key, OfferingRow.hourly_usd).where(OfferingRow.provider == provider.name)
        ).all()
        pressure_after = s.exec(select(PressureRow).where(PressureRow.source == provider.name)).all()
        status = {f.name: f for f in s.exec(select(FeedStatus)).all()}
    assert sorted(pools_after) == sorted(pools)
    assert [(p.accelerator, p.total_gpus) for p in pressure_after] == good_pressure
    for feed in (f"prices:{provider.name}", f"pressure:{provider.name}"):
        assert status[feed].last_error_at == clock(), feed
        assert "JSON" in status[feed].last_error or "json" in status[feed].last_error, status[feed].last_error
        assert status[feed].last_success_at is not None and status[feed].last_success_at < clock()


def test_imported_spot_pools_carry_a_prior_that_the_brokers_own_reclaims_update(
    tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """A catalog has no interruption data: its AWS spot pool gets the assumed Spot Advisor band. Once the broker
    has seen that pool reclaim an instance of its own after 2 h, the next import blends that in (gamma-Poisson,
    50 h of prior: (prior x 50 + 1) / (50 + 2) per hour)."""
    rt = make_runtime(f"sqlite:///{tmp_path / 'b.db'}", simulated=False)
    path = tmp_path / "aws_vms.csv"
    path.write_text(HEADER + "\n" + GOOD + "\n")
    import_catalog_files(rt, [path], clock())
    [spot] = [r for r in _rows(rt, "catalog:aws_vms.csv") if r.capacity_type == "spot"]
    prior = Band.of(2).rate_per_hour
    assert spot.interruption_rate_per_hour == pytest.approx(prior) and "band 2" in spot.interruption_basis
    start = clock()
    job = admin_api(rt).post("/v1/jobs", json=job_body(accelerators=["V100"])).json()
    with Session(rt.engine) as s:
        s.add(
            Placement(
                id="plc-1",
                job_id=job["id"],
                tenant="t",
                offering_key=spot.key,
                provider="aws",
                region=spot.region,
                zone=spot.zone,
                instance_type=spot.instance_type,
                capacity_type="spot",
                accelerator="V100",
                accelerator_count=1,
                launch_token="tok-1",
                state="preempted",
                created_at=start,
                started_at=start,
                ended_at=start + timedelta(hours=2),
            )
        )
        s.commit()
    import_catalog_files(rt, [path], clock.advance(hours=2))
    [after] = [r for r in _rows(rt, "catalog:aws_vms.csv") if r.capacity_type == "spot"]
    assert after.interruption_rate_per_hour == pytest.approx((prior * 50 + 1) / 52)
    assert "observed 1.0 reclaims in 2.0 h" in after.interruption_basis
