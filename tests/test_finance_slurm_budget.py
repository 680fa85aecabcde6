"""A spent hard budget also stops bursting out of a real Slurm queue: the opted-in job stays queued on-prem (not
held, no cloud job) until the budget is raised."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from broker.finance.budgets import month_window
from broker.loop.tick import tick
from broker.store.tables import BudgetRow, Job
from tests.conftest import MovableClock
from tests.finance_data import seed_ledger
from tests.scripted import ScriptedCloud
from tests.test_e2e_slurm_burst import _runtime, slurm  # noqa: F401  (the Slurm fixture)
from tests.test_provider_slurm import fill_gpus, job, sbatch, wait_until


@pytest.mark.integration
def test_spent_hard_budget_keeps_the_slurm_job_on_prem(slurm: Any, tmp_path: Path) -> None:  # noqa: F811
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    rt = _runtime(slurm, tmp_path, cloud)
    start, _ = month_window(clock())
    spent = seed_ledger(rt.engine, rt.settings.bootstrap_tenant, start, days=1, entries=4)  # team nlp's spend
    with Session(rt.engine) as s:
        s.add(
            BudgetRow(
                id="bdg_nlp", tenant=rt.settings.bootstrap_tenant, scope="team", name="nlp", period="monthly",
                amount_usd=spent - Decimal("1"), hard=True, thresholds=[], created_at=clock(), updated_at=clock(),
            )
        )  # fmt: skip
        s.commit()
    fill_gpus(slurm, minutes=60)
    spec = {"max_total_usd": "40", "image": "ghcr.io/example/train:1", "work_gpu_hours": "2"}  # account acme: nlp
    slurm_id = sbatch(
        slurm, "--job-name=nlp", "--gres=gpu:a100:1", "--time=60", f"--comment=overspill-burst {json.dumps(spec)}",
        "--wrap=sleep 1",
    )  # fmt: skip
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
    tick(rt, clock())
    tick(rt, clock())
    with Session(rt.engine) as s:
        assert s.exec(select(Job).where(Job.origin == f"onprem-slurm:{slurm_id}")).first() is None
    assert not job(provider, slurm_id).state_reason.startswith("JobHeld")
    with Session(rt.engine) as s:
        budget = s.get(BudgetRow, "bdg_nlp")
        assert budget is not None
        budget.amount_usd = spent + Decimal("100")
        s.add(budget)
        s.commit()
    tick(rt, clock())
    with Session(rt.engine) as s:
        assert s.exec(select(Job).where(Job.origin == f"onprem-slurm:{slurm_id}")).first() is not None
    assert job(provider, slurm_id).state_reason.startswith("JobHeld")
