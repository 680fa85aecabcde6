"""Outcomes of finished Slurm jobs come from accounting, so nothing depends on MinJobAge (real cluster).

With `MinJobAge=2` the controller forgets a finished job within about a minute of its end. Jobs that succeeded,
exited 3, killed themselves with SIGKILL and ran past their time limit are still classified right after they
leave squeue (sacct through slurmdbd, as the non-root operator), and a broker job whose Slurm job exited 3 fails
for good after it left squeue: it is not re-placed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime
from broker.store.tables import Placement
from providers.base import Instance, InstanceState
from providers.model import Outcome
from tests.builders import job_body
from tests.provider_contract import ContractEnv
from tests.test_provider_slurm import make_provider


def wait_for(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


TRANSPORTS = ("cli", "rest")


@pytest.mark.integration
def test_finished_jobs_are_classified_after_they_leave_squeue(cluster: Any, tmp_path: Path) -> None:
    """Both transports at once (the tools and slurmrestd): one set of jobs, one wait for them to be forgotten (the
    wait is most of this test's minute and a half), then each transport's reading of accounting and each one's
    broker."""
    cluster.cancel_all()
    runtimes = {}
    for transport in TRANSPORTS:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / f'outcomes-{transport}.db'}",
            data_dir=tmp_path / transport,
            simulated=False,
            slurm_partitions={
                cluster.partition: {"accelerator": "A100", "rate_usd_per_gpu_hour": "1.80", "gpus_per_node": "4"}
            },
            slurm_conf=str(cluster.conf),
            slurm_submit_as={"demo": "tenant-demo"},
            **cluster.transport_settings(transport),
        )
        rt = build_runtime(settings)
        rt.providers["onprem-slurm"].run = cluster.broker_runner()  # type: ignore[attr-defined]  # the operator
        runtimes[transport] = rt
    apis = {
        t: TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
        for t, rt in runtimes.items()
    }
    with cluster.min_job_age(2):
        broker_jobs = {}
        for transport, rt in runtimes.items():
            tick(rt, datetime.now(UTC))
            body = job_body(
                command=["sh", "-c", "exit 3"], work_gpu_hours=None, runtime_hours="0.01", max_total_usd="5"
            )
            del body["work_gpu_hours"]
            broker_jobs[transport] = apis[transport].post("/v1/jobs", json=body).json()

        providers = {t: make_provider(cluster, transport=t) for t in TRANSPORTS}
        offering = next(o for o in providers["cli"].offerings(datetime.now(UTC)) if o.accelerator_count == 1)

        def launch(command: str, minutes: int = 5) -> str:
            p = make_provider(cluster, command=lambda _r: command)
            req = ContractEnv(provider=p, offering=offering).request()
            return p.launch(replace(req, remaining_work_hours=Decimal(minutes) / 60)).id

        ids = {
            "ok": launch("true"),
            "exit3": launch("exit 3"),
            "sigkill": launch("kill -9 $$"),
            "timeout": launch("sleep 600", minutes=1),
        }
        placements = {}
        for transport, rt in runtimes.items():

            def placed(rt: Any = rt, job_id: str = broker_jobs[transport]["id"]) -> bool:
                tick(rt, datetime.now(UTC))
                with Session(rt.engine) as s:
                    return s.exec(select(Placement).where(Placement.job_id == job_id)).first() is not None

            wait_for(placed, f"the broker job's placement ({transport})", 30)
            with Session(rt.engine) as s:
                (placement,) = s.exec(select(Placement).where(Placement.job_id == broker_jobs[transport]["id"])).all()
            assert placement.instance_id is not None
            placements[transport] = placement.instance_id
        watched = {*ids.values(), *placements.values()}

        def forgotten() -> bool:
            return not watched & {str(j.job_id) for j in providers["cli"].squeue()}

        wait_for(forgotten, "the finished jobs to leave squeue (MinJobAge=2, timeout at 1 min)", 240)
        for transport, provider in providers.items():
            got = provider.get_many(list(ids.values()))
            views = {name: got[i] for name, i in ids.items()}
            assert all(isinstance(v, Instance) for v in views.values()), (transport, views)
            summary = {n: (v.state, v.outcome) for n, v in views.items() if isinstance(v, Instance)}
            assert summary == {
                "ok": (InstanceState.SUCCEEDED, Outcome.SUCCEEDED),
                "exit3": (InstanceState.FAILED, Outcome.USER_FAILED),
                "sigkill": (InstanceState.FAILED, Outcome.USER_FAILED),
                "timeout": (InstanceState.FAILED, Outcome.USER_FAILED),
            }, transport
            assert views["timeout"].detail.startswith("TIMEOUT"), transport  # type: ignore[union-attr]
            assert views["sigkill"].detail == "FAILED, signal 9", transport  # type: ignore[union-attr]

        for rt in runtimes.values():
            tick(rt, datetime.now(UTC))  # each broker sees its job only in accounting now
    for transport, rt in runtimes.items():
        done = apis[transport].get(f"/v1/jobs/{broker_jobs[transport]['id']}").json()
        assert done["state"] == "failed", (transport, done)
        with Session(rt.engine) as s:
            states = [p.state for p in s.exec(select(Placement).where(Placement.job_id == done["id"])).all()]
        assert states == ["failed"], transport  # final: never re-placed
        assert "user_failed" in done["wait_reason"], transport
