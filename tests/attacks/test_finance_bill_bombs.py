"""Bill upload bombs and hostile amounts, over the API with a finance key: a .csv.gz that inflates about 300:1, a
Parquet file whose one ResourceId is repeated through a dictionary page (a few KB on disk, ~110 MB decoded), too
many rows or columns, and NaN / Infinity / 1e999999 as costs. Each is refused (413 naming the limit and its setting,
or 422 naming the row and column) and nothing is stored. What a full-size bomb costs is measured by
`benchmarks/security_bench.py bills`."""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.runtime import Runtime
from broker.store.tables import BillImportRow
from tests.attacks.finance_parts import finance_client
from tests.bill_bombs import HEADER, ROW, gzip_bomb, parquet_bomb
from tests.conftest import MovableClock

OCT = datetime(2026, 10, 1, tzinfo=UTC)


@pytest.fixture
def brt(tmp_path: Path, make_runtime: Callable[..., Runtime]) -> Runtime:
    return make_runtime(f"sqlite:///{tmp_path / 'bills.db'}", simulated=False)


def _upload(api: TestClient, name: str, content: bytes) -> tuple[int, str]:
    answer = api.post("/v1/costs/bills", params={"filename": name, "provider": "aws"}, content=content)
    return answer.status_code, answer.json().get("message", "") if answer.status_code >= 400 else answer.text


def _stored(rt: Runtime) -> int:
    with Session(rt.engine) as s:
        return len(s.exec(select(BillImportRow)).all())


def test_gzip_bomb_upload_is_refused_with_413_before_it_is_inflated(brt: Runtime, clock: MovableClock) -> None:
    bomb = gzip_bomb(24 * 1024 * 1024)  # ~80 KB that inflates to 24 MiB of valid rows
    status, message = _upload(finance_client(brt, clock()), "bomb.csv.gz", bomb)
    assert status == 413, message
    assert (
        message.startswith("body: bomb.csv.gz grows more than 100 times") and "OVERSPILL_BILL_MAX_EXPANSION" in message
    )
    assert _stored(brt) == 0


def test_parquet_dictionary_bomb_upload_is_refused_with_413(brt: Runtime, clock: MovableClock, tmp_path: Path) -> None:
    path = tmp_path / "bomb.parquet"
    size = parquet_bomb(path, rows=100_000, value_bytes=1100)  # ~110 MB once its ResourceId is decoded
    assert size < 20_000
    status, message = _upload(finance_client(brt, clock()), "bomb.parquet", path.read_bytes())
    assert status == 413, message
    assert "grows more than 100 times" in message and "OVERSPILL_BILL_MAX_EXPANSION_RATIO" in message
    assert _stored(brt) == 0


def test_too_many_rows_or_columns_are_refused_with_413_naming_the_limit(
    tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(f"sqlite:///{tmp_path / 'small.db'}", simulated=False, bill_max_rows=1000, bill_max_columns=50)
    api = finance_client(rt, clock())
    status, message = _upload(api, "rows.csv", HEADER + ROW * 1001)
    assert status == 413 and "more than 1000 rows" in message and "OVERSPILL_BILL_MAX_ROWS" in message, message
    wide = HEADER.rstrip(b"\n") + b"".join(b",x%d" % i for i in range(60)) + b"\n" + ROW
    status, message = _upload(api, "wide.csv", wide)
    assert status == 413 and "66 columns" in message and "OVERSPILL_BILL_MAX_COLUMNS" in message, message
    path = tmp_path / "rows.parquet"
    parquet_bomb(path, rows=1001, value_bytes=20)  # the footer says 1001 rows: refused before a page is read
    status, message = _upload(api, "rows.parquet", path.read_bytes())
    assert status == 413 and "OVERSPILL_BILL_MAX_ROWS" in message, message
    assert _stored(rt) == 0


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-inf", "sNaN", "1e999999", "-1E+400", "1000000000000"])
def test_non_finite_or_absurd_costs_are_refused_naming_row_and_column(
    brt: Runtime, clock: MovableClock, value: str
) -> None:
    api = finance_client(brt, clock())
    bill = HEADER + ROW + ROW.replace(b",0.01,0.01,", f",{value},0.01,".encode())
    status, message = _upload(api, "oct.csv", bill)
    assert status == 422 and message.startswith(f"body: row 3: BilledCost '{value}'"), message
    status, message = _upload(api, "oct.csv.gz", gzip.compress(HEADER + ROW.replace(b"0.03", value.encode())))
    assert status == 422 and message.startswith(f"body: row 2: ListCost '{value}'"), message
    assert _stored(brt) == 0


def test_nan_in_a_parquet_bill_is_refused_and_a_good_bill_still_reconciles(brt: Runtime, clock: MovableClock) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    api = finance_client(brt, clock())
    buf = io.BytesIO()
    table = pa.table(
        {
            "ResourceId": ["i-1", "i-2"],
            "BilledCost": [1.5, float("nan")],
            "ChargePeriodStart": ["2026-10-01T00:00:00Z", "2026-10-02T00:00:00Z"],
        }
    )
    pq.write_table(table, buf)
    status, message = _upload(api, "nan.parquet", buf.getvalue())
    assert status == 422 and message.startswith("body: row 3: BilledCost 'nan'"), message
    status, body = _upload(api, "good.csv", HEADER + ROW)
    assert status == 201, body
    imported = api.post("/v1/costs/bills", params={"filename": "good.csv", "provider": "aws"}, content=HEADER + ROW)
    assert api.get(imported.json()["reconciliation_url"]).status_code == 200
