"""Cloud faults scenario: the broker places jobs on one cloud (AWS on moto, GCP or Azure on their local stand-ins, or
the generic libcloud adapter) through a proxy that fails 20% of the cloud's API calls (tests/fault_proxy.py: capacity
errors, throttling, 5xx, timeouts, lost responses, each in the cloud's own shape), and must still place every job
exactly once, with bounded, spaced retries and the capacity blocklist in use.

`fault_cloud(name, ...)` starts what one cloud needs and yields a `FaultCloud`: the fault proxy in front of the
cloud's API, the broker settings that enable launching there (the real wiring: `build_runtime` ->
`build_providers(settings)` builds the adapter and its SDK clients, endpoint overrides pointing at the proxy), and
how to read the cloud's own state for the invariants:
- aws: moto behind the EC2 dialect; prices from the AWS feed on moto (A10G, g5.xlarge in us-east-1's zones);
- gcp: tests/gcp_compute_fake.py behind the Compute Engine dialect; the GCP price feed's SKU and machine-type calls
  share the endpoint override and pass through the proxy to tests/gcp_fake.py (T4 pools in us-central1-a and -b);
  credentials are Application Default Credentials from a `GOOGLE_APPLICATION_CREDENTIALS` file (`adc_file`), so
  both the provider and the feed go through google.auth.default as in production and send its bearer token;
- azure: tests/azure_compute_fake.py behind the ARM dialect (static test token, plain http); prices from the Retail
  Prices stand-in (tests/azure_fake.py: T4 pools in eastus, the one location the provider launches in);
- libcloud: the generic libcloud adapter built from `OVERSPILL_LIBCLOUD_*` settings with libcloud's EC2 driver
  (query-string GETs) on moto behind the EC2 dialect; on-demand g5.xlarge priced by configuration in three zones.

`run_fault_scenario` drives an in-process broker on a clock that moves one minute per tick (each SDK's own retries
off as in production, a 1 s timeout per call), until every job runs on an instance seen running (a launch returns
once accepted; a stockout in the operation reaches the broker at a later tick) or `max_ticks` pass,
then sweeps orphans and checks the invariants: the crash harness's (tests/crash_harness.py `check_invariants`: no
job lost or placed twice, ledger = placements, ceilings honoured; on AWS also no instance without a live
placement) and, for every cloud, against the cloud itself: no instance/VM left running without a live placement,
none running twice for one job, none launched twice for one launch token. It returns the figures: launch calls per
placement, the most launch calls for one token, adapter retries and the backoff they slept, server wait hints
handed back to the broker, the median gap between retries of one launch, faults by kind, capacity errors ->
blocklist entries, ticks needed.

Used by tests/test_faults.py (small, in CI) and benchmarks/faults_bench.py (large, prints the tables).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlmodel import Session, col, select

from broker.api.schemas import JobCreate
from broker.config.settings import Settings
from broker.loop.interrupts import sweep_orphans
from broker.loop.tick import tick
from broker.market.catalog import CatalogCache
from broker.runtime import build_runtime
from broker.services.jobs import submit_job
from broker.store.tables import Job, JobEvent, Placement
from providers.aws import tag_dict
from providers.model import BROKER_TAG, JOB_TAG, LAUNCH_TOKEN_TAG, PlacementState
from tests.azure_compute_fake import AzureComputeFake
from tests.azure_fake import AzureFake
from tests.builders import agent_store, job_body
from tests.crash_harness import BROKER_ID, REGION, check_invariants
from tests.fault_proxy import ArmDialect, Ec2Dialect, FaultProxy, GceDialect, running_fault_proxy
from tests.gcp_compute_fake import GcpComputeFake, adc_file
from tests.gcp_fake import GcpFake
from tests.moto_server import moto_client, running_moto_server

CLOUDS = ("aws", "gcp", "azure", "libcloud")
KINDS = ("capacity", "throttle", "server", "timeout")
LIVE = {PlacementState.LAUNCHING.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value}
LIBCLOUD_EC2_IMAGE = "ami-12c6146b"  # one of moto's built-in AMIs
GCP_PROJECT = "proj"
GCP_TOKEN = "ya29.overspill-faults"
GCP_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
AZURE_SUB = "00000000-0000-0000-0000-000000000001"
AZURE_RG = "overspill-burst"
AZURE_SUBNET = (
    f"/subscriptions/{AZURE_SUB}/resourceGroups/{AZURE_RG}"
    "/providers/Microsoft.Network/virtualNetworks/burst/subnets/gpu"
)
AZURE_IMAGE = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
AZURE_SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOverspillTestKeyOnly overspill@test"
# The GCP price feed's calls (Cloud Billing SKUs, machine and accelerator types) go to its own stand-in.
GCP_FEED_ROUTE = r"^/v1/services/|/aggregated/(machineTypes|acceleratorTypes)$"


@dataclass(frozen=True)
class CloudVm:
    """One tagged instance as the cloud itself holds it (not as the adapter reports it)."""

    id: str  # the id the broker records (AWS "region:i-...", GCP "zone/name", Azure the VM name)
    job: str
    token: str
    running: bool


@dataclass
class FaultCloud:
    """One cloud under faults: its proxy, the broker settings that launch there, and its own state for checks."""

    name: str
    proxy: FaultProxy
    settings: dict[str, Any]
    accelerators: list[str]
    launch_label: str  # what the table calls a launch call: "RunInstances", "instances.insert", "VM PUT"
    api_label: str  # "EC2", "Compute Engine", "ARM"
    replay_label: str
    reset: Callable[[], None]
    vms: Callable[[], list[CloudVm]]  # every instance tagged for BROKER_ID, in any state
    launches_per_token: Callable[[], dict[str, int]]  # instances ever made per launch token
    env: dict[str, str] = field(default_factory=dict)  # process environment the broker needs while it runs
    aws_ec2: Any = None  # the moto EC2 client (AWS only: crash_harness.check_invariants reads EC2 itself)
    provider: str = ""  # the broker's provider name, when it is not the cloud's name

    @property
    def provider_name(self) -> str:
        return self.provider or self.name


@dataclass
class FaultReport:
    cloud: str
    launch_label: str
    api_label: str
    replay_label: str
    jobs: int
    placed: int
    ticks: int
    launch_calls: int
    attempts_per_placement: float
    max_attempts_one_launch: int
    adapter_retries: int
    backoff_seconds: float
    deferred_hints: int
    median_retry_gap_seconds: float
    faults: dict[str, int]
    capacity_failures_seen: int
    blocklist_entries: int
    failed_placements: int
    replayed_tokens: int
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        launch = self.launch_label
        rows = [
            ("jobs submitted / placed exactly once", f"{self.jobs} / {self.placed}"),
            ("ticks until every job ran", str(self.ticks)),
            ("faults injected (capacity/throttle/5xx/timeout)", "/".join(str(self.faults[k]) for k in KINDS)),
            (f"{launch} calls", str(self.launch_calls)),
            (f"attempts per placement ({launch} calls / job)", f"{self.attempts_per_placement:.2f}"),
            (f"most {launch} calls for one launch token", str(self.max_attempts_one_launch)),
            (
                f"adapter retries (all {self.api_label} calls) / backoff slept",
                f"{self.adapter_retries} / {self.backoff_seconds:.2f} s",
            ),
            ("Retry-After over the cap, handed to the next tick", str(self.deferred_hints)),
            ("median gap between retries of one launch", f"{self.median_retry_gap_seconds:.3f} s"),
            (
                "capacity errors seen by the broker -> blocklist",
                f"{self.capacity_failures_seen} -> {self.blocklist_entries}",
            ),
            ("failed placements (re-placed elsewhere)", str(self.failed_placements)),
            (self.replay_label, str(self.replayed_tokens)),
            ("invariant violations", str(len(self.violations))),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


# -- the three clouds -------------------------------------------------------------------------------------------------


@contextmanager
def fault_cloud(
    name: str, *, rate: float, seed: int, workdir: Path, moto_url: str | None = None, hold_seconds: float = 1.5
) -> Iterator[FaultCloud]:
    """Start cloud `name` (one of `CLOUDS`) behind a fault proxy; AWS and libcloud use `moto_url` (or their own
    moto)."""
    if name == "aws":
        with _aws(rate, seed, moto_url, hold_seconds) as cloud:
            yield cloud
    elif name == "gcp":
        with _gcp(rate, seed, workdir, hold_seconds) as cloud:
            yield cloud
    elif name == "azure":
        with _azure(rate, seed, hold_seconds) as cloud:
            yield cloud
    elif name == "libcloud":
        with _libcloud(rate, seed, moto_url, hold_seconds) as cloud:
            yield cloud
    else:
        raise ValueError(f"unknown cloud {name!r}: one of {CLOUDS}")


@contextmanager
def _aws(rate: float, seed: int, moto_url: str | None, hold: float) -> Iterator[FaultCloud]:
    if moto_url is None:
        with running_moto_server() as url, _aws(rate, seed, url, hold) as cloud:
            yield cloud
        return
    ec2, reset, vms = _moto_ec2(moto_url, id_prefix=f"{REGION}:")
    with running_fault_proxy(moto_url, rate=rate, seed=seed, hold_seconds=hold, dialect=Ec2Dialect()) as proxy:
        reset()
        ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
        settings = {
            "aws_regions": [REGION],
            "aws_instance_types": ["g5.xlarge"],
            "aws_endpoint_url": proxy.url,
            "aws_launch": True,
            "aws_image_id": ami,
        }
        yield FaultCloud(
            name="aws",
            proxy=proxy,
            settings=settings,
            accelerators=["A10G"],
            launch_label="RunInstances",
            api_label="EC2",
            replay_label="retried launches answered from the ClientToken",
            reset=reset,
            vms=vms,
            launches_per_token=lambda: dict(Counter(vm.token for vm in vms())),
            aws_ec2=ec2,
        )


def _moto_ec2(moto_url: str, *, id_prefix: str) -> tuple[Any, Callable[[], None], Callable[[], list[CloudVm]]]:
    """EC2 on moto as the checks read it: a client, a reset, and the broker's tagged instances (ids as the
    broker records them: `id_prefix` + the instance id)."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    ec2 = moto_client("ec2", REGION, moto_url)

    def reset() -> None:
        request = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST", data=b"")
        urllib.request.urlopen(request, timeout=30).close()

    def vms() -> list[CloudVm]:
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{BROKER_TAG}", "Values": [BROKER_ID]}]
        )
        return [
            CloudVm(
                id=f"{id_prefix}{raw['InstanceId']}",
                job=tag_dict(raw).get(JOB_TAG, ""),
                token=tag_dict(raw).get(LAUNCH_TOKEN_TAG, ""),
                running=raw["State"]["Name"] in ("pending", "running"),
            )
            for page in pages
            for res in page["Reservations"]
            for raw in res["Instances"]
        ]

    return ec2, reset, vms


@contextmanager
def _libcloud(rate: float, seed: int, moto_url: str | None, hold: float) -> Iterator[FaultCloud]:
    """The generic libcloud adapter with libcloud's EC2 driver, on moto: the only libcloud driver with a real
    server on this machine. moto's EC2 namespace lacks the trailing slash libcloud looks elements up under
    (tests/test_provider_libcloud.py), so the module constant is patched while the cloud runs."""
    if moto_url is None:
        with running_moto_server() as url, _libcloud(rate, seed, url, hold) as cloud:
            yield cloud
        return
    from libcloud.compute.drivers import ec2 as libcloud_ec2

    _, reset, vms = _moto_ec2(moto_url, id_prefix="")
    namespace = libcloud_ec2.NAMESPACE
    libcloud_ec2.NAMESPACE = namespace.rstrip("/")
    try:
        with running_fault_proxy(moto_url, rate=rate, seed=seed, hold_seconds=hold, dialect=Ec2Dialect()) as proxy:
            reset()
            port = urlsplit(proxy.url).port
            settings = {
                "libcloud_provider": "ec2",
                "libcloud_key": "AKIDMOTOEXAMPLE",
                "libcloud_secret": "testing-secret",
                "libcloud_image_id": LIBCLOUD_EC2_IMAGE,
                "libcloud_options": {
                    "region": REGION, "host": "127.0.0.1", "port": port, "secure": False, "signature_version": "4",
                },
                "libcloud_prices": {"g5.xlarge": "1.006"},
                "libcloud_gpus": {"g5.xlarge": "A10G:1"},
                "libcloud_region": REGION,
                "libcloud_zones": [f"{REGION}a", f"{REGION}b", f"{REGION}c"],
            }  # fmt: skip
            yield FaultCloud(
                name="libcloud",
                provider="ec2",
                proxy=proxy,
                settings=settings,
                accelerators=["A10G"],
                launch_label="RunInstances",
                api_label="EC2 (libcloud driver)",
                replay_label="retried launches answered from the ClientToken",
                reset=reset,
                vms=vms,
                launches_per_token=lambda: dict(Counter(vm.token for vm in vms())),
            )
    finally:
        libcloud_ec2.NAMESPACE = namespace


@contextmanager
def _gcp(rate: float, seed: int, workdir: Path, hold: float) -> Iterator[FaultCloud]:
    with (
        GcpComputeFake(GCP_PROJECT, zones=("us-central1-a", "us-central1-b"), op_seconds=0.1) as compute,
        GcpFake(project=GCP_PROJECT) as prices,
        running_fault_proxy(
            compute.endpoint,
            rate=rate,
            seed=seed,
            hold_seconds=hold,
            dialect=GceDialect(),
            routes=[(GCP_FEED_ROUTE, prices.endpoint)],
        ) as proxy,
    ):
        adc = adc_file(workdir / "gcp-adc.json", GCP_TOKEN)

        def vms() -> list[CloudVm]:
            out = []
            for (zone, name), vm in sorted(compute.instances.items()):
                meta = {i["key"]: i["value"] for i in vm.get("metadata", {}).get("items", [])}
                tags = json.loads(meta.get("overspill-tags", "{}"))
                if tags.get(BROKER_TAG) != BROKER_ID:
                    continue
                running = vm["status"] in ("PROVISIONING", "STAGING", "RUNNING", "REPAIRING")
                out.append(CloudVm(f"{zone}/{name}", tags.get(JOB_TAG, ""), meta["overspill-launch-token"], running))
            return out

        settings = {
            "gcp_project": GCP_PROJECT,
            "gcp_regions": ["us-central1"],
            "gcp_endpoint": proxy.url,
            "gcp_launch": True,
            "gcp_image": GCP_IMAGE,
        }
        yield FaultCloud(
            name="gcp",
            proxy=proxy,
            settings=settings,
            accelerators=["T4"],
            launch_label="instances.insert",
            api_label="Compute Engine",
            replay_label="retried inserts answered from the requestId",
            reset=lambda: None,
            vms=vms,
            launches_per_token=lambda: dict(compute.created),  # names are 1:1 with launch tokens
            env={"GOOGLE_APPLICATION_CREDENTIALS": str(adc)},
        )


@contextmanager
def _azure(rate: float, seed: int, hold: float) -> Iterator[FaultCloud]:
    with (
        AzureComputeFake(AZURE_SUB) as compute,
        AzureFake() as prices,
        running_fault_proxy(compute.url, rate=rate, seed=seed, hold_seconds=hold, dialect=ArmDialect()) as proxy,
    ):

        def vms() -> list[CloudVm]:
            out = []
            for key, vm in sorted(compute.vms.items()):
                tags = vm.get("tags") or {}
                if tags.get(BROKER_TAG) != BROKER_ID:
                    continue
                creating = vm["properties"].get("provisioningState") in ("Creating", "Updating")
                running = creating or compute.power.get(key) in ("starting", "running")
                out.append(CloudVm(vm["name"], tags.get(JOB_TAG, ""), tags.get(LAUNCH_TOKEN_TAG, ""), running))
            return out

        settings = {
            "azure_regions": ["eastus"],
            "azure_prices_url": prices.prices_url,
            "azure_subscription_id": AZURE_SUB,
            "azure_launch": True,
            "azure_resource_group": AZURE_RG,
            "azure_location": "eastus",
            "azure_subnet_id": AZURE_SUBNET,
            "azure_image_reference": AZURE_IMAGE,
            "azure_ssh_public_key": AZURE_SSH_KEY,
            "azure_endpoint": proxy.url,
            "azure_static_test_token": True,
        }
        yield FaultCloud(
            name="azure",
            proxy=proxy,
            settings=settings,
            accelerators=["T4"],
            launch_label="VM PUT",
            api_label="ARM",
            replay_label="retried PUTs answered by the VM they made",
            reset=lambda: None,
            vms=vms,
            launches_per_token=lambda: dict(compute.created),  # VM names are 1:1 with launch tokens
        )


# -- the scenario -----------------------------------------------------------------------------------------------------


@contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_fault_scenario(cloud: FaultCloud, *, db_url: str, workdir: Path, jobs: int, max_ticks: int = 40) -> FaultReport:
    proxy = cloud.proxy
    cloud.reset()
    now = datetime.now(UTC).replace(microsecond=0)
    clock_now = [now]
    settings = Settings(
        database_url=db_url,
        data_dir=workdir,
        simulated=False,
        broker_id=BROKER_ID,
        orphan_grace_seconds=0,
        orphan_sweep_seconds=3600,  # the sweep runs once, after the scenario (a live launch is never an orphan)
        tick_interval_seconds=60,
        cloud_timeout_seconds=1.0,
        price_refresh_seconds=3600,
        checkpoint_stores=agent_store(workdir, ("aws/us-east-1", "ec2/us-east-1", "gcp/us-central1", "azure/eastus")),
        **cloud.settings,
    )
    rate = proxy.rate
    proxy.rate = 0.0  # the price catalog loads cleanly; the faults are about launching
    with _environment(cloud.env):
        rt = build_runtime(settings, clock=lambda: clock_now[0])
        tick(rt, clock_now[0])
        catalog = CatalogCache(rt.engine)
        job_ids = []
        for i in range(jobs):
            body = job_body(name=f"fault-{i}", accelerators=cloud.accelerators, work_gpu_hours="3", max_total_usd="50")
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
            if _all_launched(rt.engine):
                break
        proxy.rate = 0.0
        rt.marks.pop("sweep_orphans", None)
        sweep_orphans(rt, clock_now[0] + timedelta(minutes=1))
    violations = check_invariants(rt.engine, cloud.aws_ec2 or _NoEc2(), job_ids)
    violations += cloud_violations(rt.engine, cloud)
    return _report(rt, cloud, job_ids, ticks, violations)


def _all_launched(engine: Any) -> bool:
    """Every job running, on a placement whose instance the broker has seen start (none left waiting on an
    unanswered launch, nor on an accepted one whose operation may still fail: launches do not wait for it)."""
    with Session(engine) as s:
        waiting = s.exec(select(Job.id).where(col(Job.state) != "running")).first()
        unstarted = s.exec(
            select(Placement.id).where(col(Placement.state).in_(LIVE), col(Placement.state) != "running")
        ).first()
    return waiting is None and unstarted is None


class _NoEc2:
    """Stands in for EC2 in crash_harness.check_invariants when the cloud is not AWS (its database checks still
    run; the cloud's own are `cloud_violations`)."""

    def get_paginator(self, name: str) -> _NoEc2:
        return self

    def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
        return []


def cloud_violations(engine: Any, cloud: FaultCloud) -> list[str]:
    """The invariants checked against the cloud itself: nothing left running without a live placement, no job
    running twice, no launch token that made two instances."""
    with Session(engine) as s:
        placements = s.exec(select(Placement)).all()
    live = {p.instance_id for p in placements if p.state in LIVE and p.instance_id}
    bad: list[str] = []
    running_per_job: dict[str, int] = defaultdict(int)
    for vm in cloud.vms():
        if not vm.running:
            continue
        running_per_job[vm.job] += 1
        if vm.id not in live and cloud.aws_ec2 is None:  # with aws_ec2, check_invariants has said it already
            bad.append(f"{cloud.name} instance {vm.id} is running without a live placement (job {vm.job})")
    for job, n in running_per_job.items():
        if n > 1 and cloud.aws_ec2 is None:
            bad.append(f"job {job} runs on {n} {cloud.name} instances")
    for token, n in cloud.launches_per_token().items():
        if n > 1:
            bad.append(f"launch token {token} made {n} {cloud.name} instances")
    return bad


def _report(rt: Any, cloud: FaultCloud, job_ids: list[str], ticks: int, violations: list[str]) -> FaultReport:
    with Session(rt.engine) as s:
        placements = s.exec(select(Placement)).all()
        events = s.exec(select(JobEvent).where(JobEvent.kind == "launch_failed")).all()
        jobs = s.exec(select(Job)).all()
    provider = rt.providers[cloud.provider_name]
    retry = provider.retry
    stats = cloud.proxy.stats
    gaps = [b - a for times in stats.launch_attempts.values() for a, b in itertools.pairwise(times) if len(times) > 1]
    capacity_seen = [e for e in events if "InsufficientCapacity" in e.message]
    blocked = [e for e in capacity_seen if e.data.get("blocked")]
    placed = sum(1 for j in jobs if j.state == "running")
    calls = stats.requests[cloud.proxy.dialect.launch_action]
    return FaultReport(
        cloud=cloud.name,
        launch_label=cloud.launch_label,
        api_label=cloud.api_label,
        replay_label=cloud.replay_label,
        jobs=len(job_ids),
        placed=placed,
        ticks=ticks,
        launch_calls=calls,
        attempts_per_placement=calls / placed if placed else float("nan"),
        max_attempts_one_launch=max((len(t) for t in stats.launch_attempts.values()), default=0),
        adapter_retries=retry.retries_made,
        backoff_seconds=retry.slept_seconds,
        deferred_hints=retry.deferred,
        median_retry_gap_seconds=statistics.median(gaps) if gaps else 0.0,
        faults={k: stats.faults_of(k) for k in KINDS},
        capacity_failures_seen=len(capacity_seen),
        blocklist_entries=len(blocked),
        failed_placements=sum(1 for p in placements if p.state == "failed"),
        replayed_tokens=stats.replayed_tokens,
        violations=violations,
    )
