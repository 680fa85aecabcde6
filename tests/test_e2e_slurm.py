"""The broker end to end on a real Slurm cluster: its partitions become on-prem pools priced at the internal rate,
its queue pressure is sampled, and a job placed there runs under Slurm, as the tenant's own unprivileged identity
(never the broker's operator account), and accrues on-prem cost."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.runtime import build_runtime
from tests.builders import job_body


@pytest.mark.integration
def test_job_runs_on_slurm_and_accrues_onprem_cost(cluster: Any, tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'slurm.db'}",
        data_dir=tmp_path,
        simulated=False,
        slurm_partitions={
            cluster.partition: {"accelerator": "A100", "rate_usd_per_gpu_hour": "1.80", "gpus_per_node": "4"}
        },
        slurm_conf=str(cluster.conf),
        slurm_submit_as={"demo": "tenant-demo"},
    )
    rt = build_runtime(settings)
    rt.providers["onprem-slurm"].run = cluster.broker_runner()  # type: ignore[attr-defined]  # non-root operator
    tick(rt, datetime.now(UTC))
    api = TestClient(create_app(runtime=rt), headers={"Authorization": f"Bearer {DEV_API_KEY}"})
    pools = api.get("/v1/pools").json()["items"]
    assert pools and {p["provider"] for p in pools} == {"onprem-slurm"}
    one = next(p for p in pools if p["accelerator_count"] == 1)
    assert one["capacity_type"] == "on_prem" and one["hourly_usd"] == "1.8"
    pressure = api.get("/v1/pressure").json()["items"]
    assert {(r["source"], r["accelerator"]) for r in pressure} == {("onprem-slurm", "A100")}
    assert pressure[0]["total_gpus"] == cluster.gpus_per_node * len(cluster.nodes)

    body = job_body(command=["sleep", "2"], work_gpu_hours=None, runtime_hours="0.01", max_total_usd="5")
    del body["work_gpu_hours"]
    job = api.post("/v1/jobs", json=body).json()
    deadline = time.monotonic() + 30
    state = ""
    while time.monotonic() < deadline:
        tick(rt, datetime.now(UTC))
        state = api.get(f"/v1/jobs/{job['id']}").json()["state"]
        if state == "succeeded":
            break
        time.sleep(0.5)
    done = api.get(f"/v1/jobs/{job['id']}").json()
    assert state == "succeeded", done
    spent = Decimal(done["spent_usd"])
    assert Decimal("0") < spent < Decimal("1.8") * Decimal("30") / 3600  # at most ~30 s at $1.80/h
    (placed,) = [j for j in cluster.jobs() if f"job={job['id']}" in str(j["comment"])]
    assert placed["user_name"] == "tenant-demo" and placed["account"] == "demo"
    kinds = [e["kind"] for e in api.get(f"/v1/jobs/{job['id']}/events").json()["items"]]
    assert kinds[:4] == ["submitted", "placed", "launched", "started"] and "finished" in kinds
