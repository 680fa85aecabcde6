"""Provider bill import (FOCUS-form AWS Data Exports sample, CSV, CSV.gz and Parquet) and the ledger vs bill
difference per resource, over the API and the CLI.

No real AWS billing export is in ../shared/data, so the input is a small hand-typed file in the column layout of
AWS Data Exports "FOCUS 1.0 with AWS columns" (tests/fixtures/aws_focus_1_0_sample.csv)."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from broker.api.auth import Role, create_key
from broker.app import create_app
from broker.cli.main import app as cli_app
from broker.finance.billing import BillError, import_bill, normalise_resource_id, reconcile
from broker.runtime import Runtime
from broker.store.tables import CostEntryRow
from tests.finance_data import seed_ledger

SAMPLE = Path(__file__).parent / "fixtures" / "aws_focus_1_0_sample.csv"
OCT = datetime(2026, 10, 1, tzinfo=UTC)


def _ledger(rt: Runtime) -> None:
    """The broker's own view: i-...0001 ran 2 h at $9.8304 (matches), i-...0002 was accrued for 25 min at
    $55.04 (the bill charged 30), i-...0003 is in the ledger only; the bill has i-...0009 the ledger lacks."""
    seed_ledger(rt.engine, "demo", OCT - timedelta(days=30), days=1, entries=1)  # a job (its entry: September)
    from sqlalchemy import insert

    base = {
        "job_id": "job_demo_000000", "placement_id": "plc_x", "tenant": "demo", "team": "nlp", "project": "atlas",
        "provider": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p4d.24xlarge",
        "capacity_type": "spot", "kind": "compute", "hourly_usd": Decimal("9.8304"), "on_demand_usd": Decimal("0"),
        "quantity": Decimal("1"), "unit": "Hours", "corrects_id": None, "note": "", "created_at": OCT,
    }  # fmt: skip
    at = {
        1: OCT + timedelta(hours=10),
        2: OCT + timedelta(hours=11),
        3: OCT + timedelta(days=1),
        4: OCT + timedelta(days=20),
    }
    rows = [
        {**base, "resource_id": "i-0a1b2c3d4e5f60001", "usd": Decimal("9.8304"), "period_start_at": at[1]},
        {**base, "resource_id": "i-0a1b2c3d4e5f60001", "usd": Decimal("9.8304"), "period_start_at": at[2]},
        {**base, "resource_id": "i-0a1b2c3d4e5f60002", "usd": Decimal("22.9333333333"), "period_start_at": at[3]},
        {**base, "resource_id": "i-0a1b2c3d4e5f60003", "usd": Decimal("4.5"), "period_start_at": at[3]},
        {**base, "resource_id": "i-0a1b2c3d4e5f60004", "usd": Decimal("7"), "period_start_at": at[4]},
        {**base, "resource_id": "i-gcp", "provider": "gcp", "usd": Decimal("3"), "period_start_at": OCT},
    ]  # fmt: skip
    with rt.engine.begin() as conn:
        conn.execute(insert(CostEntryRow.__table__), [{**r, "period_end_at": r["period_start_at"]} for r in rows])  # type: ignore[attr-defined]


@pytest.fixture
def brt(db_url: str, make_runtime: object) -> Runtime:
    rt = make_runtime(db_url, simulated=False)  # type: ignore[operator]
    _ledger(rt)
    return rt


def _by_resource(result: dict[str, object]) -> dict[str, tuple[str, str, str, str]]:
    return {
        r["resource_id"]: (r["ledger_usd"], r["billed_usd"], r["difference_usd"], r["status"])  # type: ignore[index]
        for r in result["rows"]  # type: ignore[attr-defined]
    }


EXPECTED = {
    "i-0a1b2c3d4e5f60001": ("19.6608", "19.6608", "0", "match"),
    "i-0a1b2c3d4e5f60002": ("22.9333333333", "27.52", "4.5866666667", "differs"),
    "i-0a1b2c3d4e5f60003": ("4.5", "0", "-4.5", "only_in_ledger"),
    "i-0a1b2c3d4e5f60004": ("7", "0", "-7", "only_in_ledger"),
    "i-0a1b2c3d4e5f60009": ("0", "0.09", "0.09", "only_in_bill"),
}


def test_normalise_resource_id() -> None:
    assert normalise_resource_id("arn:aws:ec2:us-east-1:1:instance/i-0abc") == "i-0abc"
    assert normalise_resource_id(" i-0abc ") == "i-0abc"


@pytest.mark.parametrize("form", ["csv", "csv.gz", "parquet"])
def test_import_and_reconcile_per_resource(brt: Runtime, tmp_path: Path, form: str) -> None:
    path = tmp_path / f"focus.{form}"
    if form == "csv":
        path.write_bytes(SAMPLE.read_bytes())
    elif form == "csv.gz":
        path.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    else:
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        pq.write_table(pacsv.read_csv(SAMPLE), path)
    summary = import_bill(brt, "demo", path, OCT)
    assert (summary.provider, summary.rows, summary.resources, summary.skipped_without_resource) == ("aws", 5, 3, 1)
    assert summary.billed_usd == Decimal("48.5208")
    assert (summary.period_start, summary.period_end) == (OCT, datetime(2026, 11, 1, tzinfo=UTC))
    result = reconcile(brt, "demo", summary.id)
    assert result is not None
    assert _by_resource(result) == EXPECTED  # the gcp resource belongs to another provider's bill
    assert [r["resource_id"][-4:] for r in result["rows"]] == ["0004", "0002", "0003", "0009", "0001"]
    assert (result["billed_usd"], result["bill_total_usd"]) == ("47.2708", "48.5208")
    assert reconcile(brt, "other-tenant", summary.id) is None


def test_bad_bills_name_the_problem(brt: Runtime, tmp_path: Path) -> None:
    missing = tmp_path / "x.csv"
    missing.write_text("ResourceId,ChargePeriodStart\ni-1,2026-10-01T00:00:00Z\n")
    with pytest.raises(BillError, match="BilledCost"):
        import_bill(brt, "demo", missing, OCT)
    bad = tmp_path / "y.csv"
    bad.write_text("ResourceId,BilledCost,ChargePeriodStart,ProviderName\ni-1,lots,2026-10-01T00:00:00Z,AWS\n")
    with pytest.raises(BillError, match="row 2: BilledCost"):
        import_bill(brt, "demo", bad, OCT)
    # unreadable files (found by the API fuzzer: an empty Parquet body was a 500)
    for name, content, problem in [
        ("empty.parquet", b"", "not a readable Parquet file"),
        ("junk.parquet", b"PAR1 not really", "not a readable Parquet file"),
        ("junk.csv.gz", b"not gzip", "not a readable gzip-compressed UTF-8 CSV"),
        ("latin.csv", "ResourceId,BilledCost\nd\xe9j\xe0,1\n".encode("latin-1"), "not a readable UTF-8 CSV"),
    ]:
        broken = tmp_path / name
        broken.write_bytes(content)
        with pytest.raises(BillError, match=problem):
            import_bill(brt, "demo", broken, OCT)


def test_bill_api_and_cli(brt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_url: str) -> None:
    api = TestClient(create_app(runtime=brt))
    finance = {"Authorization": f"Bearer {create_key(brt.engine, tenant='demo', role=Role.FINANCE, name='f', now=OCT)}"}
    made = api.post("/v1/costs/bills", params={"filename": "oct.csv"}, content=SAMPLE.read_bytes(), headers=finance)
    assert made.status_code == 201, made.text
    rec = api.get(made.json()["reconciliation_url"], headers=finance).json()
    assert _by_resource(rec) == EXPECTED
    submitter = {
        "Authorization": f"Bearer {create_key(brt.engine, tenant='demo', role=Role.SUBMITTER, name='s', now=OCT)}"
    }
    assert api.get(made.json()["reconciliation_url"], headers=submitter).status_code == 403
    other = {"Authorization": f"Bearer {create_key(brt.engine, tenant='other', role=Role.FINANCE, name='o', now=OCT)}"}
    assert api.get(made.json()["reconciliation_url"], headers=other).status_code == 404
    bad = api.post("/v1/costs/bills", params={"filename": "oct.csv"}, content=b"a,b\n1,2\n", headers=finance)
    assert bad.status_code == 422 and "ResourceId" in bad.json()["message"]
    assert api.post("/v1/costs/bills", params={"filename": "oct.exe"}, content=b"", headers=finance).status_code == 422

    monkeypatch.setenv("OVERSPILL_DATABASE_URL", db_url)
    monkeypatch.setenv("OVERSPILL_SIMULATED", "false")
    monkeypatch.setenv("OVERSPILL_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(cli_app, ["costs", "import-bill", str(SAMPLE), "--json"])
    assert result.exit_code == 0, result.output
    assert _by_resource(json.loads(result.stdout)) == EXPECTED
    assert api.get("/v1/costs", headers=finance).status_code == 200
