"""Attacks on bursting out of Slurm and on broker-placed Slurm jobs, against the real test cluster.

Anyone who can `sbatch` can write an `overspill-burst` comment, and holds no API key: the comment must not choose
where checkpoints go, which image runs outside the site's list, a ceiling above the account's policy, who pays
(team, project), or burst at all for an account not allowed to. Jobs the broker places on Slurm must run as the
tenant's own unprivileged identity, never as the broker's operator account (which may hold and cancel anyone's
jobs). Each test bursts (or places) a legitimate job in the same tick as the attack, so a broker that bursts
nothing cannot pass it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import Runtime, build_runtime
from broker.store.tables import AuditEntry, Job
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud
from tests.test_e2e_slurm_burst import _opted_in, _runtime
from tests.test_metrics_burst import decisions
from tests.test_provider_slurm import fill_gpus, job, wait_until


@pytest.fixture
def slurm(cluster: Any) -> Iterator[Any]:
    cluster.cancel_all()
    yield cluster
    cluster.cancel_all()


def _cloud(clock: MovableClock) -> ScriptedCloud:
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    return cloud


def _burst_origin(rt: Runtime, slurm_id: int) -> Job | None:
    with Session(rt.engine) as s:
        return s.exec(select(Job).where(Job.origin == f"onprem-slurm:{slurm_id}")).first()


def _attack(slurm: Any, tmp_path: Path, attack: dict[str, Any], user: str = "alice") -> tuple[Runtime, int, int]:
    """A legitimate opted-in job of alice and the attacker's one, both pending for GPUs; one tick."""
    clock = MovableClock(datetime.now(UTC))
    rt = _runtime(slurm, tmp_path, _cloud(clock))
    fill_gpus(slurm, minutes=60)
    control = _opted_in(slurm)
    bad = _opted_in(slurm, attack.pop("max_total_usd", "40"), user, **attack)
    provider = rt.providers["onprem-slurm"]
    for i in (control, bad):
        wait_until(lambda i=i: job(provider, i).state_reason in ("Resources", "Priority"), "the jobs to pend")
    tick(rt, clock())
    assert _burst_origin(rt, control) is not None, "the legitimate job must burst"
    return rt, control, bad


def _refused(rt: Runtime, slurm_id: int, reason: str, user: str = "alice", account: str = "acme") -> None:
    assert _burst_origin(rt, slurm_id) is None
    assert not job(rt.providers["onprem-slurm"], slurm_id).state_reason.startswith("JobHeld")  # type: ignore[arg-type]
    assert decisions(rt)[("refuse", reason)] >= 1
    with Session(rt.engine) as s:
        audit = s.exec(select(AuditEntry).where(col(AuditEntry.path).endswith(f"/jobs/{slurm_id}"))).all()
    assert [(a.role, a.method, a.route, a.status) for a in audit] == [("system", "REFUSE", reason, 403)]
    assert audit[0].client == f"slurm user={user} account={account}"


@pytest.mark.integration
def test_slurm_comment_naming_a_checkpoint_uri_cannot_choose_where_checkpoints_go(slurm: Any, tmp_path: Path) -> None:
    rt, control, bad = _attack(slurm, tmp_path, {"checkpoint_uri": "s3://victim-bucket/tenants/other/ckpt/"})
    _refused(rt, bad, "comment_field_not_allowed")
    legit = _burst_origin(rt, control)
    assert legit is not None and legit.checkpoint_uri is None and "checkpoint_uri" not in legit.spec.get("slurm", {})


@pytest.mark.integration
def test_slurm_comment_asking_a_ceiling_above_the_account_policy_is_refused(slurm: Any, tmp_path: Path) -> None:
    rt, _, bad = _attack(slurm, tmp_path, {"max_total_usd": "100000"})  # policy max_job_usd: 100
    _refused(rt, bad, "ceiling_above_policy")


@pytest.mark.integration
def test_slurm_comment_naming_an_image_outside_the_allowed_list_is_refused(slurm: Any, tmp_path: Path) -> None:
    rt, _, bad = _attack(slurm, tmp_path, {"image": "docker.io/attacker/miner:latest"})
    _refused(rt, bad, "image_not_allowed")


@pytest.mark.integration
def test_slurm_comment_choosing_who_pays_is_refused(slurm: Any, tmp_path: Path) -> None:
    rt, _, bad = _attack(slurm, tmp_path, {"team": "finance", "project": "someone-elses"})
    _refused(rt, bad, "comment_field_not_allowed")


@pytest.mark.integration
def test_slurm_account_not_allowed_to_burst_is_never_burst(slurm: Any, tmp_path: Path) -> None:
    rt, _, bad = _attack(slurm, tmp_path, {}, user="bob")  # account beta: burst false
    _refused(rt, bad, "account_not_allowed", user="bob", account="beta")


@pytest.mark.integration
def test_slurm_account_without_a_policy_is_never_burst(slurm: Any, tmp_path: Path) -> None:
    rt, _, bad = _attack(slurm, tmp_path, {}, user="carol")  # account gamma: not mapped, no "*" entry
    _refused(rt, bad, "account_not_mapped", user="carol", account="gamma")


def _onprem_runtime(cluster: Any, tmp_path: Path, submit_as: dict[str, str]) -> tuple[Runtime, TestClient]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'onprem.db'}",
        data_dir=tmp_path,
        simulated=False,
        slurm_partitions={
            cluster.partition: {"accelerator": "A100", "rate_usd_per_gpu_hour": "1.80", "gpus_per_node": "4"}
        },
        slurm_conf=str(cluster.conf),
        slurm_submit_as=submit_as,
    )
    rt = build_runtime(settings)
    rt.providers["onprem-slurm"].run = cluster.broker_runner()  # type: ignore[attr-defined]
    api = TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    return rt, api


def _submit(api: TestClient) -> str:
    body = job_body(command=["sleep", "1"], work_gpu_hours=None, runtime_hours="0.01", max_total_usd="5")
    del body["work_gpu_hours"]
    return str(api.post("/v1/jobs", json=body).json()["id"])


@pytest.mark.integration
def test_onprem_job_placed_by_the_broker_runs_as_the_tenant_identity_not_the_operator(
    slurm: Any, tmp_path: Path
) -> None:
    rt, api = _onprem_runtime(slurm, tmp_path, {"demo": "tenant-demo"})
    job_id = _submit(api)
    tick(rt, datetime.now(UTC))
    (placed,) = [j for j in slurm.jobs() if f"job={job_id}" in str(j["comment"])]
    assert placed["user_name"] == "tenant-demo"  # not ovsbroker (the operator), not root
    assert placed["account"] == "demo"


@pytest.mark.integration
def test_tenant_without_a_slurm_identity_is_never_placed_on_prem(slurm: Any, tmp_path: Path) -> None:
    rt, api = _onprem_runtime(slurm, tmp_path, {"someone-else": "tenant-acme"})
    job_id = _submit(api)
    for _ in range(3):
        tick(rt, datetime.now(UTC))
        time.sleep(0.2)
    assert not [j for j in slurm.jobs() if f"job={job_id}" in str(j["comment"])]
    answer = api.get(f"/v1/jobs/{job_id}").json()
    assert answer["state"] == "pending" and "no Slurm submit identity" in answer["wait_reason"]
