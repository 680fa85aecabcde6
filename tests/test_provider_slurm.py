"""`SlurmProvider` against a real Slurm 22.05 cluster (2 nodes x 4 fake A100, see tests/slurm_cluster.py).

The provider runs every Slurm command as the non-root operator `ovsbroker` and submits tenant `t`'s jobs as
`tenant-acme` through its default `sudo -n -u <user> --` wrapper; other users' jobs are `alice`'s. Integration
tests skip with the reason when the Slurm binaries are missing (CI installs them). A few tests drive the provider
through a fake runner and need no cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from federation.pressure import QueueModel
from providers.base import InstanceState, InvalidRequest, NotFound, QuotaExceeded
from providers.model import CapacityType, Offering, Price
from providers.slurm.json_api import SlurmJob
from providers.slurm.provider import (
    CommandBuilder,
    PartitionInfo,
    SlurmProvider,
    SlurmUnavailable,
    default_command,
    hold_note,
)
from tests.provider_contract import BROKER_ID, ContractEnv, ProviderContract
from tests.slurm_cluster import SlurmCluster

PARTITIONS = {"gpu": PartitionInfo("A100", Decimal("1.10"), 4)}


@pytest.fixture
def slurm(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The shared cluster with no job active before and after the test."""
    cluster.cancel_all()
    yield cluster
    cluster.cancel_all()


SUBMIT_AS = {"t": "tenant-acme"}  # the contract's tenant runs as an unprivileged identity


def make_provider(
    cluster: SlurmCluster, command: CommandBuilder = default_command, transport: str = "cli"
) -> SlurmProvider:
    """The provider on the test cluster as the non-root operator, through the tools or slurmrestd (`transport`)."""
    shared = cluster.root / "shared"
    return SlurmProvider(
        broker_id=BROKER_ID,
        partitions=PARTITIONS,
        queue_model=QueueModel,
        transport=cluster.transport(transport),
        command=command,
        output=f"{shared}/%j.out",
        workdir=str(shared),
        submit_as=SUBMIT_AS,
        hold_key=b"test-hold-key",
    )


def sbatch(cluster: SlurmCluster, *args: str, user: str = "alice") -> int:
    """Submit a job as a Slurm user (default alice, account acme); output in the cluster's shared dir."""
    shared = cluster.root / "shared"
    argv = ["sbatch", "--parsable", f"--output={shared}/%j.out", f"--chdir={shared}", *args]
    done = cluster.run_as(user, argv, check=True)
    return int(done.stdout.strip().split(";")[0])


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def settled(provider: SlurmProvider) -> Callable[[], None]:
    """Wait until no job is mid-transition (starting or still ending, or pending before the scheduler has looked at
    it: reason "None", which a busy slurmctld may turn into RUNNING between two reads) so reads see a final state."""

    def wait() -> None:
        def calm() -> bool:
            moving = ("CONFIGURING", "COMPLETING")
            unseen = "PENDING"  # with no reason yet
            return not [
                j
                for j in provider.squeue()
                if j.state in moving or j.state_flags or (j.state == unseen and not j.state_reason)
            ]

        wait_until(calm, "jobs to settle")

    return wait


def job(provider: SlurmProvider, job_id: int) -> SlurmJob:
    return next(j for j in provider.squeue() if j.job_id == job_id)


def fill_gpus(cluster: SlurmCluster, minutes: int = 30) -> list[int]:
    """Occupy every GPU with a long sleep job (one 4-GPU job per node) and wait until they run."""
    ids = [sbatch(cluster, "--job-name=fill", "--gres=gpu:a100:4", f"--time={minutes}", "--wrap=sleep 600")]
    ids.append(sbatch(cluster, "--job-name=fill", "--gres=gpu:a100:4", f"--time={minutes}", "--wrap=sleep 600"))

    def running() -> bool:
        jobs = {j["job_id"]: j["job_state"] for j in cluster.jobs()}
        return all(jobs.get(i) == "RUNNING" for i in ids)

    wait_until(running, "filler jobs to run")
    return ids


@pytest.mark.integration
class TestSlurmContract(ProviderContract):
    @pytest.fixture
    def env(self, slurm: SlurmCluster, slurm_transport: str) -> ContractEnv:
        provider = make_provider(slurm, command=lambda _request: "sleep 60", transport=slurm_transport)
        offering = next(o for o in provider.offerings(datetime.now(UTC)) if o.accelerator_count == 1)

        def make_foreign() -> str:
            return str(sbatch(slurm, "--job-name=someone-else", "--gres=gpu:a100:1", "--wrap=sleep 60"))

        return ContractEnv(
            provider=provider,
            offering=offering,
            make_foreign=make_foreign,
            settle=settled(provider),
            unknown_id="999999",
        )


@pytest.mark.integration
def test_launch_shape_states_and_requeue(slurm: SlurmCluster, slurm_transport: str) -> None:
    provider = make_provider(slurm, transport=slurm_transport)
    now = datetime.now(UTC)
    offerings = {o.accelerator_count: o for o in provider.offerings(now)}
    assert sorted(offerings) == [1, 2, 4]  # 4 GPUs per node: no 8-GPU shape
    two = offerings[2]
    assert two.capacity_type is CapacityType.ON_PREM and two.zone == "gpu" and two.accelerator == "A100"
    assert two.hourly_usd == Decimal("2.2000") and two.expected_wait_hours == 0.0 and two.available
    assert (two.vcpus, two.gpu_memory_gib) == (4, 40)

    def launch(command: str, hours: str, offering_gpus: int = 2) -> str:
        p = make_provider(slurm, command=lambda _r: command, transport=slurm_transport)
        req = ContractEnv(provider=p, offering=offerings[offering_gpus]).request()
        return p.launch(replace(req, remaining_work_hours=Decimal(hours))).id

    ok, bad, long = launch("true", "0.01"), launch("exit 3", "1.5"), launch("sleep 300", "1.001", 1)
    shape = job(provider, int(ok))
    assert shape.gpus == {"a100": 2} and shape.time_limit == 1 and shape.name.startswith("ovs-")
    assert job(provider, int(bad)).time_limit == 90 and job(provider, int(long)).time_limit == 61
    states = {"ok": InstanceState.SUCCEEDED, "bad": InstanceState.FAILED}

    def finished() -> bool:
        return provider.get(ok).state == states["ok"] and provider.get(bad).state == states["bad"]

    wait_until(finished, "the short jobs to finish")
    got = provider.get(ok)
    assert got.started_at is not None and got.ended_at is not None and got.ended_at >= got.started_at
    wait_until(lambda: provider.get(long).state is InstanceState.RUNNING, "the long job to run")
    provider.requeue(long)  # the job ends (COMPLETING), then waits again under a BeginTime delay, same id
    wait_until(lambda: provider.get(long).state is InstanceState.PENDING, "the requeued job to wait again")
    requeued = provider.get(long)
    assert requeued.state is InstanceState.PENDING and "BeginTime" in requeued.detail
    assert job(provider, int(long)).restart_count == 1
    provider.terminate(long)
    settled(provider)()
    assert provider.get(long).state is InstanceState.TERMINATED


@pytest.mark.integration
def test_pressure_while_gpus_are_full(slurm: SlurmCluster) -> None:
    provider = make_provider(slurm)
    fillers = fill_gpus(slurm, minutes=30)
    big = sbatch(slurm, "--job-name=big", "--gres=gpu:a100:4", "--time=20", "--wrap=sleep 1")
    small = sbatch(slurm, "--job-name=small", "--gres=gpu:a100:2", "--time=20", "--wrap=sleep 1")
    held = sbatch(slurm, "--job-name=held", "--hold", "--gres=gpu:a100:1", "--wrap=sleep 1")
    after = sbatch(slurm, "--job-name=after", f"--dependency=afterok:{fillers[0]}", "--gres=gpu:a100:1", "--wrap=true")

    def evaluated() -> bool:  # the scheduler has looked at every pending job and estimated the two waiting ones
        jobs = {j.job_id: j for j in provider.squeue()}
        return all(jobs[i].state_reason for i in (big, small, held, after)) and all(
            jobs[i].start_time is not None for i in (big, small)
        )

    wait_until(evaluated, "pending reasons and estimated starts")
    now = datetime.now(UTC)
    (sample,) = provider.pressure(now)
    assert (sample.accelerator, sample.total_gpus, sample.free_gpus) == ("A100", 8, 0)
    assert (sample.pending_jobs, sample.pending_gpus) == (2, 6)  # the held and dependent jobs are not pressure
    assert sample.source == "onprem-slurm" and sample.observed_at == now

    # Slurm's own estimated start for the waiting jobs: when the 30-minute fillers end
    filler_end = job(provider, fillers[0]).end_time
    assert filler_end is not None
    for waiting in (big, small):
        est = job(provider, waiting).start_time
        assert est is not None and abs((est - filler_end).total_seconds()) <= 120

    queued = {q.job.job_id: q for q in provider.queued_jobs()}
    assert set(queued) == {big, small, held, after}
    assert [queued[i].burstable for i in (big, small, held, after)] == [True, True, False, False]
    assert (queued[held].reason, queued[after].reason) == ("JobHeldUser", "Dependency")
    assert queued[big].gpus == 4 and queued[big].accelerator == "A100" and queued[big].held_by is None

    with pytest.raises(InvalidRequest):  # the user's own hold is theirs: neither re-held nor released by us
        provider.hold(held, "burst")
    with pytest.raises(InvalidRequest):
        provider.release(held)
    blocked = {p.accelerator: p for p in provider.model().pressure(now)}["A100"].blocked_reasons
    assert blocked == {"Dependency": 1, "JobHeldUser": 1}
    # 1 GPU: after the fillers (~0.5 h); 4 GPUs: after `big` (20 min) too, or the fillers + small job on node 2
    one = sample.expected_wait_hours
    assert 0.4 < one <= 0.55
    waits = {o.accelerator_count: o.expected_wait_hours for o in provider.offerings(now)}
    assert waits[1] == one and 0.7 < waits[4] <= 0.9


@pytest.mark.integration
def test_burst_hold_then_release_runs_the_job_exactly_once(slurm: SlurmCluster, slurm_transport: str) -> None:
    provider = make_provider(slurm, transport=slurm_transport)
    fillers = fill_gpus(slurm, minutes=30)
    marker = slurm.root / "shared" / f"ran-{uuid.uuid4().hex[:8]}"
    foreign = sbatch(slurm, "--job-name=user-train", "--gres=gpu:a100:1", "--time=5", f"--wrap=echo ran >> {marker}")
    rival = sbatch(slurm, "--job-name=rival", "--gres=gpu:a100:4", "--time=5", "--wrap=sleep 30")
    wait_until(lambda: job(provider, foreign).state_reason in ("Resources", "Priority"), "the job to wait")
    original_priority = job(provider, foreign).priority
    (candidate,) = [q for q in provider.queued_jobs() if q.job.job_id == foreign]
    assert candidate.burstable and candidate.gpus == 1

    first = provider.hold(foreign, "bursting to aws/us-east-1 spot: 0.9 h wait on-prem")
    assert first.held and first.priority == original_priority
    assert provider.hold(foreign, "again").held  # already ours: nothing changes
    held = job(provider, foreign)
    assert held.state == "PENDING" and held.state_reason == "JobHeldAdmin"
    note = hold_note(held.comment)
    assert note is not None and note["broker"] == BROKER_ID and note["reason"].startswith("bursting to aws")
    (listed,) = [q for q in provider.queued_jobs() if q.job.job_id == foreign]
    assert listed.held_by == BROKER_ID and not listed.burstable and listed.hold_reason == note["reason"]
    assert provider.pressure(datetime.now(UTC))[0].pending_jobs == 1  # only the rival is pressure now

    # the cloud placement failed: give the job back to Slurm, at its old place in the queue (priority/basic here:
    # the recorded priority is set again; under multifactor the release alone lets Slurm recompute it)
    assert provider.priority_plugin() == "priority/basic"
    provider.release(foreign, priority=first.priority)
    provider.release(foreign, priority=first.priority)  # converges
    released = job(provider, foreign)
    assert released.state == "PENDING" and released.priority == original_priority
    assert hold_note(released.comment) is None
    assert released.priority is not None and released.priority > (job(provider, rival).priority or 0)
    for filler in fillers:
        slurm.run(["scancel", str(filler)], check=True)
    wait_until(lambda: job(provider, foreign).state == "COMPLETED", "the released job to run", timeout=15)
    assert marker.read_text() == "ran\n"  # ran once, not lost
    # nothing submitted a second copy of it (earlier tests' finished `user-train` jobs stay listed: MinJobAge)
    assert [j.job_id for j in provider.squeue() if j.name == "user-train" and j.job_id >= fillers[0]] == [foreign]


@pytest.mark.integration
def test_concurrent_duplicate_submission_converges(slurm: SlurmCluster) -> None:
    """A racing launch of the same token submits twice: the later job is cancelled, the first one returned."""

    broker = slurm.broker_runner()

    def racing(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if "sbatch" in argv:
            assert broker(argv).returncode == 0  # the other broker replica got there too
        return broker(argv)

    provider = make_provider(slurm, command=lambda _r: "sleep 60")
    provider.run = racing
    offering = next(o for o in provider.offerings(datetime.now(UTC)) if o.accelerator_count == 1)
    req = ContractEnv(provider=provider, offering=offering).request()
    inst = provider.launch(req)
    ours = sorted(j.job_id for j in provider.squeue() if req.launch_token in j.comment)
    assert len(ours) == 2 and inst.id == str(ours[0])
    settled(provider)()
    assert job(provider, ours[1]).state == "CANCELLED"
    assert [i.id for i in provider.list_instances() if i.launch_token == req.launch_token and not i.state.terminal] == [
        inst.id
    ]


# ---- no cluster needed ----------------------------------------------------------------------------------------


def canned(jobs: list[dict[str, object]], fail: dict[str, tuple[int, str]] | None = None) -> Callable[..., object]:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        command = next((a for a in argv if a in (fail or {})), None)  # past a submit wrapper (sudo -u ... --)
        if fail and command is not None:
            code, err = fail[command]
            return subprocess.CompletedProcess(argv, code, "", err)
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": jobs}), "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    run.calls = calls  # type: ignore[attr-defined]
    return run


def fake_job(job_id: int, comment: str, state: str = "RUNNING") -> dict[str, object]:
    return {
        "job_id": job_id,
        "name": "x",
        "job_state": state,
        "state_reason": "None",
        "partition": "gpu",
        "user_name": "root",
        "tres_per_node": "gres:gpu:a100:2",
        "node_count": 1,
        "submit_time": 1_700_000_000,
        "start_time": 1_700_000_100,
        "end_time": 1_700_003_700,
        "time_limit": 60,
        "comment": comment,
    }


def test_tags_read_back_and_foreign_jobs_are_not_ours() -> None:
    comment = f"overspill:{BROKER_ID}:tok-1 job=job-1 placement=plc%201 team=vision"
    run = canned(
        [
            fake_job(10, comment),
            fake_job(11, "overspill:other-broker:tok-2 job=j placement=p"),
            fake_job(12, ""),
            fake_job(13, comment.replace("tok-1", "tok-3"), "PREEMPTED"),
            {**fake_job(14, comment.replace("tok-1", "tok-4"), "PENDING"), "state_reason": "Resources"},
        ]
    )
    provider = SlurmProvider(broker_id=BROKER_ID, partitions=PARTITIONS, queue_model=QueueModel, run=run)  # type: ignore[arg-type]
    inst = provider.get("10")
    assert inst.launch_token == "tok-1" and inst.state is InstanceState.RUNNING
    assert inst.tags == {
        "overspill:broker": BROKER_ID,
        "overspill:job": "job-1",
        "overspill:placement": "plc 1",
        "team": "vision",
    }
    assert inst.offering_key == "onprem-slurm/onprem/gpu/slurm-a100-2gpu/on_prem"
    assert inst.started_at == datetime.fromtimestamp(1_700_000_100, UTC) and inst.ended_at is None
    assert provider.get("13").state is InstanceState.PREEMPTED
    assert provider.get("13").ended_at == inst.launched_at + timedelta(seconds=3700)
    for foreign in ("11", "12", "abc", "99"):
        with pytest.raises(NotFound):
            provider.get(foreign)
        provider.terminate(foreign)  # foreign or unknown: success, and never scancel'd
    assert not [c for c in run.calls if c[0] == "scancel"]  # type: ignore[attr-defined]
    queued = provider.get("14")  # Slurm's estimated start for a pending job shows in the detail
    assert queued.state is InstanceState.PENDING and queued.started_at is None
    assert queued.detail == "pending: Resources, estimated start 2023-11-14T22:15:00+00:00"
    assert [i.id for i in provider.list_instances()] == ["10", "13", "14"]


def test_command_failures_map_to_typed_errors() -> None:
    offering = make_offering()
    cases = [
        ("squeue", 1, "squeue: error: Unable to contact slurm controller (connect failure)", SlurmUnavailable),
        ("sbatch", 1, "sbatch: error: Batch job submission failed: Invalid partition name specified", InvalidRequest),
        ("sbatch", 1, "sbatch: error: QOSMaxSubmitJobPerUserLimit", QuotaExceeded),
    ]
    for command, code, err, error in cases:
        run = canned([], {command: (code, err)})
        provider = SlurmProvider(
            broker_id=BROKER_ID, partitions=PARTITIONS, queue_model=QueueModel, run=run, submit_as=SUBMIT_AS
        )  # type: ignore[arg-type]
        with pytest.raises(error):
            provider.launch(ContractEnv(provider=provider, offering=offering).request())

    def missing(argv: list[str]) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(argv[0])

    with pytest.raises(SlurmUnavailable) as exc:
        SlurmProvider(broker_id=BROKER_ID, partitions=PARTITIONS, queue_model=QueueModel, run=missing).list_instances()
    assert exc.value.retryable


def test_launch_rejects_offerings_it_does_not_have() -> None:
    provider = SlurmProvider(
        broker_id=BROKER_ID, partitions=PARTITIONS, queue_model=QueueModel, run=canned([]), submit_as=SUBMIT_AS
    )  # type: ignore[arg-type]
    env = ContractEnv(provider=provider, offering=make_offering(gpus=8))
    with pytest.raises(InvalidRequest):
        provider.launch(env.request())
    with pytest.raises(InvalidRequest):
        provider.launch(env.request(token="has spaces"))


def make_offering(gpus: int = 1) -> Offering:
    now = datetime.now(UTC)
    return Offering(
        provider="onprem-slurm",
        region="onprem",
        zone="gpu",
        instance_type=f"slurm-a100-{gpus}gpu",
        accelerator="A100",
        accelerator_count=gpus,
        gpu_memory_gib=40,
        vcpus=2,
        memory_gib=Decimal(2),
        capacity_type=CapacityType.ON_PREM,
        price=Price(Decimal("1.1") * gpus, "internal-rate", now),
    )
