"""Bursting an opted-in job out of a real Slurm queue: it is held on-prem while it runs in the cloud and then
cancelled there (it ran exactly once); when the cloud cannot take it, it is released back into the queue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from broker.config.settings import Settings
from broker.loop.tick import tick
from broker.observe.metrics import BurstReason
from broker.runtime import Runtime, build_runtime
from broker.store.tables import AuditEntry, Job, JobEvent
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud, admin_api
from tests.test_provider_slurm import fill_gpus, job, sbatch, wait_until


def decisions(rt: Runtime) -> dict[tuple[str, str], float]:
    """Burst decision counts by (decision, reason), from this runtime's loop metrics."""
    out: dict[tuple[str, str], float] = {}
    for family in rt.metrics.registry.collect():
        for s in family.samples:
            if s.name == "overspill_burst_decisions_total":
                out[(s.labels["decision"], s.labels["reason"])] = s.value
    return out


@pytest.fixture
def slurm(cluster: Any) -> Iterator[Any]:
    (cluster.root / "out").mkdir(exist_ok=True)
    cluster.cancel_all()
    yield cluster
    cluster.cancel_all()


ACCOUNTS: dict[str, Any] = {  # alice's account acme bursts into the bootstrap tenant; bob's beta may not burst
    "acme": {"tenant": "demo", "team": "nlp", "project": "atlas", "burst": True, "max_job_usd": "100",
             "allowed_images": ["ghcr.io/example/*"]},
    "beta": {"tenant": "demo", "burst": False},
}  # fmt: skip


def site_paths(cluster: Any) -> dict[str, str]:
    """The cluster's shared dir (the jobs' working directory) and the tests' own (where sbatch runs: the jobs'
    SLURM_SUBMIT_DIR), as a site maps its shared filesystems into the cloud image."""
    return {str(cluster.root): "/mnt/site", str(Path.cwd()): "/mnt/submit"}


def _runtime(
    cluster: Any,
    tmp_path: Path,
    cloud: ScriptedCloud,
    accounts: dict[str, Any] | None = None,
    transport: str = "cli",
    **extra: Any,
) -> Runtime:
    """A broker on the real cluster, its Slurm commands run as the non-root operator `ovsbroker`, through the tools
    or slurmrestd (`transport`, set as a site would: OVERSPILL_SLURM_TRANSPORT and its URL, user and token file)."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'burst.db'}",
        data_dir=tmp_path,
        simulated=False,
        slurm_partitions={
            cluster.partition: {"accelerator": "A100", "rate_usd_per_gpu_hour": "1.10", "gpus_per_node": "4"}
        },
        slurm_conf=str(cluster.conf),
        slurm_accounts=ACCOUNTS if accounts is None else accounts,
        burst_give_up_minutes=5,
        wait_value_usd_per_gpu_hour=0,
        # the economic rule, with waiting dear enough that a queued job bursts (unless a test says otherwise)
        **{
            "burst_value_usd_per_gpu_hour": 50,
            "slurm_cloud_paths": site_paths(cluster),
            "slurm_require_environment": False,
            **cluster.transport_settings(transport),
            **extra,
        },
    )
    rt = build_runtime(settings)
    rt.providers["onprem-slurm"].run = cluster.broker_runner()  # type: ignore[attr-defined]
    rt.providers[cloud.name] = cloud
    rt.offering_sources.append(cloud)
    return rt


def _opted_in(slurm: Any, max_total: str = "40", user: str = "alice", *extra: str, **fields: Any) -> int:
    spec = {"max_total_usd": max_total, "image": "ghcr.io/example/train:1", "work_gpu_hours": "2", **fields}
    return sbatch(
        slurm,
        "--job-name=opted-in",
        "--gres=gpu:a100:1",
        "--time=60",
        f"--comment=overspill-burst {json.dumps(spec)}",
        *extra,
        "--wrap=sleep 1",
        user=user,
    )


def _broker_job(rt: Runtime, slurm_id: int) -> Job:
    with Session(rt.engine) as s:
        found = s.exec(select(Job).where(Job.origin == f"onprem-slurm:{slurm_id}")).first()
        assert found is not None, "the Slurm job was not burst"
        return found


@pytest.mark.integration
def test_burst_holds_the_slurm_job_and_cancels_it_after_the_cloud_run(
    slurm: Any, tmp_path: Path, slurm_transport: str
) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    rt = _runtime(slurm, tmp_path, cloud, transport=slurm_transport)
    fill_gpus(slurm, minutes=60)
    not_opted = sbatch(slurm, "--job-name=other", "--gres=gpu:a100:1", "--time=60", "--wrap=sleep 1")
    slurm_id = _opted_in(slurm)
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")

    tick(rt, clock())
    broker_job = _broker_job(rt, slurm_id)
    held = job(provider, slurm_id)
    assert held.state_reason == "JobHeldAdmin" and broker_job.id in held.comment
    assert (broker_job.tenant, broker_job.team, broker_job.project) == ("demo", "nlp", "atlas")  # from the mapping
    assert not job(provider, not_opted).state_reason.startswith("JobHeld")  # never burst without opting in
    with Session(rt.engine) as s:  # audited with who asked, in Slurm's terms
        (audit,) = s.exec(select(AuditEntry).where(AuditEntry.method == "BURST")).all()
    assert (audit.tenant, audit.role, audit.path) == ("demo", "system", f"/slurm/onprem-slurm/jobs/{slurm_id}")
    assert (audit.client, audit.request_id) == ("slurm user=alice account=acme", broker_job.id)
    tick(rt, clock())  # a second tick must not burst it twice
    with Session(rt.engine) as s:
        assert len(s.exec(select(Job).where(Job.origin == f"onprem-slurm:{slurm_id}")).all()) == 1

    tick(rt, clock())
    assert _broker_job(rt, slurm_id).state == "running" and len(cloud.running()) == 1
    clock.advance(hours=3)
    tick(rt, clock())
    tick(rt, clock())
    done = _broker_job(rt, slurm_id)
    assert done.state == "succeeded" and done.origin_settled
    wait_until(lambda: job(provider, slurm_id).state == "CANCELLED", "the held Slurm job to be cancelled")
    with Session(rt.engine) as s:  # the scripted cloud runs no agent: no log, so its --output is not touched
        kinds = set(s.exec(select(JobEvent.kind).where(JobEvent.job_id == done.id)).all())
    assert "onprem_output_none" in kinds and not (slurm.root / "shared" / f"{slurm_id}.out").exists()


@pytest.mark.integration
def test_failed_burst_releases_the_slurm_job_which_then_runs_once(
    slurm: Any, tmp_path: Path, slurm_transport: str
) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    cloud.no_capacity = {"z1", "z2"}  # every launch fails
    rt = _runtime(slurm, tmp_path, cloud, transport=slurm_transport)
    fillers = fill_gpus(slurm, minutes=60)
    slurm_id = _opted_in(slurm)
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
    tick(rt, clock())
    assert job(provider, slurm_id).state_reason.startswith("JobHeld")
    for _ in range(3):
        tick(rt, clock())
    assert cloud.running() == [] and _broker_job(rt, slurm_id).state == "pending"
    with Session(rt.engine) as s:  # pretend the give-up window has passed
        row = s.exec(select(Job).where(Job.origin == f"onprem-slurm:{slurm_id}")).one()
        row.created_at = row.created_at - timedelta(minutes=10)
        s.add(row)
        s.commit()
    tick(rt, clock())
    back = _broker_job(rt, slurm_id)
    assert back.state == "cancelled" and back.origin_settled and "on-prem" in back.wait_reason
    assert not job(provider, slurm_id).state_reason.startswith("JobHeld")
    slurm.run(["scancel", *map(str, fillers)])
    wait_until(lambda: job(provider, slurm_id).state == "COMPLETED", "the released job to run on-prem", timeout=30)
    assert sum(1 for j in provider.squeue() if j.job_id == slurm_id) == 1


@pytest.mark.integration
def test_a_burst_paused_at_its_ceiling_goes_back_on_prem_and_cannot_be_resumed_in_the_cloud(
    slurm: Any, tmp_path: Path
) -> None:
    """The cloud side paused (a price spike would break its ceiling): the held Slurm job is released and runs
    on-prem, so the broker's job ends as cancelled and a later PATCH cannot send it to the cloud a second time."""
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    rt = _runtime(slurm, tmp_path, cloud)
    fillers = fill_gpus(slurm, minutes=60)
    slurm_id = _opted_in(slurm, max_total="20")
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
    tick(rt, clock())  # burst: held on-prem, pending in the broker
    tick(rt, clock())  # placed and running in the cloud
    assert _broker_job(rt, slurm_id).state == "running"
    clock.advance(minutes=30)
    cloud.prices = {"z1": Decimal("60"), "z2": Decimal("60")}  # 1.5 h left at $60/h cannot fit $20
    tick(rt, clock())  # the ceiling guard pauses the cloud side
    assert _broker_job(rt, slurm_id).state == "paused"
    tick(rt, clock())  # the burst step settles: the Slurm job is released
    back = _broker_job(rt, slurm_id)
    assert back.state == "cancelled" and back.origin_settled
    assert not job(provider, slurm_id).state_reason.startswith("JobHeld")
    answer = admin_api(rt).patch(f"/v1/jobs/{back.id}", json={"max_total_usd": "500"})
    assert answer.status_code == 409, answer.text
    for _ in range(3):
        tick(rt, clock.advance(minutes=1))
    assert _broker_job(rt, slurm_id).state == "cancelled" and cloud.running() == []
    slurm.run(["scancel", *map(str, fillers)])
    wait_until(lambda: job(provider, slurm_id).state == "COMPLETED", "the released job to run on-prem", timeout=30)


@pytest.mark.integration
def test_an_account_monthly_budget_counts_what_running_bursts_may_still_spend(
    slurm: Any, tmp_path: Path, slurm_transport: str
) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    accounts = {"acme": {**ACCOUNTS["acme"], "monthly_budget_usd": "60"}}
    rt = _runtime(slurm, tmp_path, cloud, accounts, transport=slurm_transport)
    fill_gpus(slurm, minutes=60)
    first, second = _opted_in(slurm), _opted_in(slurm)  # $40 ceilings: one fits $60, two do not
    provider = rt.providers["onprem-slurm"]
    for i in (first, second):
        wait_until(lambda i=i: job(provider, i).state_reason in ("Resources", "Priority"), "the jobs to pend")
    tick(rt, clock())
    assert _broker_job(rt, first).state in ("pending", "running")
    with Session(rt.engine) as s:
        assert s.exec(select(Job).where(Job.origin == f"onprem-slurm:{second}")).first() is None
    assert not job(provider, second).state_reason.startswith("JobHeld")
    assert decisions(rt)[("refuse", BurstReason.ACCOUNT_BUDGET)] == 1


@pytest.mark.integration
def test_governance_refuses_a_ceiling_above_policy_and_an_account_not_allowed_to_burst(
    slurm: Any, tmp_path: Path, slurm_transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On the real cluster, through either transport: alice asks for $500 where her account allows $100 per job, bob's
    account may not burst at all. Neither is held or burst, each refusal is audited with its reason and the Slurm
    user and account, and the log says what the policy allows; alice's job within policy still bursts."""
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    rt = _runtime(slurm, tmp_path, cloud, transport=slurm_transport)
    fill_gpus(slurm, minutes=60)
    too_dear = _opted_in(slurm, "500")
    not_allowed = _opted_in(slurm, "40", "bob")
    within = _opted_in(slurm, "40")
    provider = rt.providers["onprem-slurm"]
    for i in (too_dear, not_allowed, within):
        wait_until(lambda i=i: job(provider, i).state_reason in ("Resources", "Priority"), "the jobs to pend")
    caplog.set_level("WARNING", logger="broker.loop.onprem_burst")
    tick(rt, clock())
    tick(rt, clock.advance(seconds=10))
    assert _broker_job(rt, within).spec["max_total_usd"] == "40"
    for refused in (too_dear, not_allowed):
        with Session(rt.engine) as s:
            assert s.exec(select(Job).where(Job.origin == f"onprem-slurm:{refused}")).first() is None
        assert not job(provider, refused).state_reason.startswith("JobHeld")  # never held, not even for a moment
    with Session(rt.engine) as s:
        refusals = {
            a.path.rsplit("/", 1)[1]: (a.client, a.status, a.route)
            for a in s.exec(select(AuditEntry).where(AuditEntry.method == "REFUSE")).all()
        }
    assert refusals[str(too_dear)][:2] == ("slurm user=alice account=acme", 403)
    assert BurstReason.CEILING_ABOVE_POLICY in refusals[str(too_dear)][2]
    assert refusals[str(not_allowed)][:2] == ("slurm user=bob account=beta", 403)
    assert BurstReason.ACCOUNT_NOT_ALLOWED in refusals[str(not_allowed)][2]
    assert len(refusals) == 2  # audited once per job and reason, not every tick
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"{too_dear} asks to burst, refused (ceiling_above_policy)" in said and "100" in said
    assert decisions(rt)[("refuse", BurstReason.CEILING_ABOVE_POLICY)] == 2  # one per tick
    assert decisions(rt)[("refuse", BurstReason.ACCOUNT_NOT_ALLOWED)] == 2


@pytest.mark.integration
def test_a_hold_left_by_a_crash_before_the_commit_is_given_back(slurm: Any, tmp_path: Path) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    rt = _runtime(slurm, tmp_path, cloud)
    fillers = fill_gpus(slurm, minutes=60)
    slurm_id = _opted_in(slurm)
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
    assert provider.hold(slurm_id, "bursting").held  # type: ignore[attr-defined]  # ...and the broker died here
    tick(rt, clock())  # within the grace: a replica may still be committing it
    assert job(provider, slurm_id).state_reason == "JobHeldAdmin"
    tick(rt, clock.advance(minutes=11))
    released = job(provider, slurm_id)
    assert released.state_reason != "JobHeldAdmin" and "overspill-hold" not in released.comment
    tomb = _broker_job(rt, slurm_id)  # its origin is taken, so a late commit elsewhere fails
    assert tomb.state == "cancelled" and tomb.origin_settled and cloud.requests == []
    assert decisions(rt)[("release", BurstReason.ORPHAN_HOLD)] == 1
    slurm.run(["scancel", *map(str, fillers)])
    wait_until(lambda: job(provider, slurm_id).state == "COMPLETED", "the job to run on-prem", timeout=30)


@pytest.mark.integration
def test_a_burst_whose_slurm_job_its_user_cancels_stops_in_the_cloud_even_after_it_left_squeue(
    slurm: Any, tmp_path: Path
) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    rt = _runtime(slurm, tmp_path, cloud)
    provider = rt.providers["onprem-slurm"]
    with slurm.min_job_age(2):
        fill_gpus(slurm, minutes=60)
        slurm_id = _opted_in(slurm)
        wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
        tick(rt, clock())
        tick(rt, clock())
        assert _broker_job(rt, slurm_id).state == "running" and len(cloud.running()) == 1
        slurm.run_as("alice", ["scancel", str(slurm_id)], check=True)  # the user withdraws the held job
        wait_until(lambda: all(j.job_id != slurm_id for j in provider.squeue()), "it to leave squeue", timeout=150)
        tick(rt, clock())  # only accounting knows how it ended now
        tick(rt, clock())  # the sync step stops the cloud instance of the cancelled job
    gone = _broker_job(rt, slurm_id)
    assert gone.state == "cancelled" and gone.origin_settled and "withdrawn" in gone.wait_reason
    assert "CANCELLED" in gone.wait_reason and cloud.running() == []
    assert decisions(rt)[("withdraw", BurstReason.ENDED_ON_PREM)] == 1
    with Session(rt.engine) as s:
        (audit,) = s.exec(select(AuditEntry).where(AuditEntry.method == "WITHDRAW")).all()
    assert audit.client == "slurm user=alice account=acme"


@pytest.mark.integration
def test_the_fixed_wait_threshold_stays_available_as_a_fallback(slurm: Any, tmp_path: Path) -> None:
    """OVERSPILL_BURST_POLICY=wait_threshold: the job bursts when its wait passes burst_after_wait_hours, however
    dear the cloud (the economic rule would keep it: waiting is worth $0 here), and stays below it."""
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    fill_gpus(slurm, minutes=60)
    slurm_id = _opted_in(slurm)
    cheap_wait = {"burst_policy": "wait_threshold", "burst_value_usd_per_gpu_hour": 0}
    for name in ("patient", "economic", "eager"):
        (tmp_path / name).mkdir()
    patient = _runtime(slurm, tmp_path / "patient", cloud, burst_after_wait_hours=5, **cheap_wait)
    provider = patient.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
    tick(patient, clock())
    assert decisions(patient)[("stay", BurstReason.SHORT_WAIT)] == 1
    assert not job(provider, slurm_id).state_reason.startswith("JobHeld")
    economic = _runtime(slurm, tmp_path / "economic", cloud, burst_value_usd_per_gpu_hour=0)
    tick(economic, clock())
    assert decisions(economic)[("stay", BurstReason.PREMIUM)] == 1  # the wait costs nothing: never worth a premium
    eager = _runtime(slurm, tmp_path / "eager", cloud, burst_after_wait_hours=0.5, **cheap_wait)
    tick(eager, clock())
    assert _broker_job(eager, slurm_id).state in ("pending", "running")
    assert decisions(eager)[("burst", BurstReason.LONG_WAIT)] == 1
    assert job(provider, slurm_id).state_reason == "JobHeldAdmin"
