"""The console's Costs page for finance users, in headless Chromium (tests/test_console_e2e.py's browser and page
helpers) against a real broker process, over a ledger of this month's spend written into the broker's database.

A finance key reads the month to date with its "data as of" time, cards and a by-team table whose figures are the
API's display cents (the rows add up to the totals row), a daily chart with a y axis, gridlines and a tooltip on
every segment; exports a month as PDF and CSV (downloaded with the key, checked: page numbers, totals, cents), sees
the runs it made and downloads one again; creates a report schedule (a bad cron is refused naming the field) and
deletes it. Screenshots go to `$OVERSPILL_ARTIFACTS_DIR/console/`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from broker.api.auth import Role, create_key
from broker.config.settings import DEV_API_KEY, Settings
from broker.finance.money import cents
from broker.store.db import make_engine, utcnow
from tests.console_server import running
from tests.finance_data import seed_ledger
from tests.test_console_e2e import Broker, Page, artifacts_dir, expect
from tests.test_console_e2e import browser as browser  # the Chromium fixture, for this module too

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker process on the real clock with no control loop (`tests.console_server --no-loop`): the ledger is
    what the test writes, and "this month" stays this month while the tests run."""
    tmp = tmp_path_factory.mktemp("console-costs")
    url = f"sqlite:///{tmp / 'broker.store.db'}"
    env = {"OVERSPILL_DATABASE_URL": url, "OVERSPILL_BOOTSTRAP_API_KEY": DEV_API_KEY, "OVERSPILL_LOG_LEVEL": "warning"}
    log = tmp / "broker.log"
    with running(tmp, env, ["--no-loop"], log) as base:
        settings = Settings(database_url=url, data_dir=tmp)
        engine = make_engine(settings)
        b = Broker(base, settings, tmp / "no-pause-file", log)
        b.keys["finance"] = create_key(engine, tenant="demo", role=Role.FINANCE, name="e2e finance", now=utcnow())
        engine.dispose()
        yield b


@pytest.fixture(scope="module")
def month(broker: Broker) -> str:
    """Seed this month's ledger (up to yesterday, or today on the 1st) for tenant demo; return the month."""
    now = datetime.now(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    engine = make_engine(broker.settings)
    seed_ledger(engine, "demo", start, days=max(1, now.day - 1), entries=1200, seed=11)
    engine.dispose()
    return f"{start:%Y-%m}"


def _money(text: str) -> Decimal:
    return Decimal(re.sub(r"[^0-9.-]", "", text))


def _download(tab: Page, selector: str) -> tuple[str, bytes]:
    with tab.page.expect_download() as info:
        tab.page.click(selector)
    download = info.value
    path = artifacts_dir() / f"download-{download.suggested_filename}"
    download.save_as(str(path))
    return download.suggested_filename, path.read_bytes()


def test_finance_reads_the_month_to_date_with_rounded_figures_and_a_chart_with_axes(
    browser: Any, broker: Broker, month: str
) -> None:
    with broker.api(broker.keys["finance"]) as api:
        summary = api.get("/v1/costs", params={"group_by": "team,provider"}).json()
    total = summary["total"]
    assert Decimal(total["cost_usd"]) != cents(Decimal(total["cost_usd"]))  # the ledger has sub-cent amounts
    tab = Page(browser, broker)
    tab.sign_in(broker.keys["finance"])
    tab.page.wait_for_selector("body[data-ready=costs]")
    period = tab.text("[data-testid=cost-period]")
    assert "(month to date)" in period and "data as of" in period, period
    assert tab.text("[data-testid=cost-total]") == f"${Decimal(total['display']['cost_usd']):,}"
    assert _money(tab.text("[data-testid=cost-savings]")) == Decimal(total["display"]["savings_usd"])
    assert _money(tab.text("[data-testid=cost-wasted]")) == Decimal(total["display"]["wasted_usd"]) > 0
    net = _money(tab.text("[data-testid=cost-net]"))
    assert net == _money(tab.text("[data-testid=cost-on-demand]")) - _money(tab.text("[data-testid=cost-total]"))

    # the table: every amount in cents, each column of rows adding up to the totals row
    body = tab.page.locator("[data-testid=costs-by-team] tbody tr").all_inner_texts()
    foot = tab.text("[data-testid=costs-total]")
    assert body and foot.startswith("Total")
    columns = [[_money(c) for c in row.split("\t")[2:6]] for row in body]
    assert [sum(c, Decimal(0)) for c in zip(*columns, strict=True)] == [_money(c) for c in foot.split("\t")[2:6]]
    page_text = tab.text("main")
    assert not re.search(r"\$[\d,]*\.\d{3,}", page_text), "no raw ledger precision on the page"

    # the chart: a y axis with gridlines, a tooltip on every bar segment
    chart = tab.page.locator("[data-testid=spend-chart]")
    ticks = chart.locator("[data-testid=y-tick]").all_text_contents()
    assert len(ticks) == 5 and ticks[0].startswith("$0") and all(t.startswith("$") for t in ticks)
    assert chart.locator("line.grid").count() == 4
    tips = chart.locator("rect title").all_text_contents()
    assert tips and all(re.search(r"\$[\d,]+\.\d\d \(day total \$[\d,]+\.\d\d\)$", t) for t in tips), tips[:3]
    summary_line = tab.text("[data-testid=chart-summary]")
    highest = re.search(r"highest day \S+: (\$[\d,]+\.\d\d)", summary_line)
    assert highest and f"total {tab.text('[data-testid=cost-total]')}" in summary_line, summary_line
    assert highest.group(1) in chart.locator("[data-testid=bar-value]").all_text_contents()  # a value on the chart
    tab.shot("costs-finance-month-to-date")
    chart.screenshot(path=str(artifacts_dir() / "costs-chart.png"))
    tab.close()


def test_finance_exports_reports_and_downloads_past_runs(browser: Any, broker: Broker, month: str) -> None:
    import pypdfium2 as pdfium

    tab = Page(browser, broker)
    tab.sign_in(broker.keys["finance"])
    tab.page.wait_for_selector("[data-testid=export]")
    assert tab.page.input_value("[data-testid=export-month]") == month

    name, pdf_bytes = _download(tab, "[data-testid=export-pdf]")
    assert name == f"overspill-costs-demo-{month}.pdf" and pdf_bytes.startswith(b"%PDF")
    expect(tab.page.locator("[data-testid=export-status]")).to_contain_text("Downloaded")
    assert "(month to date)" in tab.text("[data-testid=export-status]")
    pdf = pdfium.PdfDocument(pdf_bytes)
    pages = [pdf[i].get_textpage().get_text_range() for i in range(len(pdf))]
    assert all(f"Page {i} of {len(pages)}" in p for i, p in enumerate(pages, start=1))
    assert "(month to date)" in pages[0] and "data as of" in pages[0]
    assert sum(p.count("\nTotal") for p in pages[2:]) == 7  # a totals row in every table (pages 1-2: charts)

    name, csv_bytes = _download(tab, "[data-testid=export-csv]")
    rows = list(csv.DictReader(io.StringIO(csv_bytes.decode())))
    assert name == f"overspill-costs-demo-{month}.csv" and rows
    assert all(re.fullmatch(r"-?\d+\.\d{2}", r["cost_usd"]) for r in rows)
    with broker.api(broker.keys["finance"]) as api:
        runs = api.get("/v1/report-runs").json()["items"]
    assert [r["format"] for r in runs[:2]] == ["csv", "pdf"]

    # the runs list: state, period, and a download of an earlier run (the same bytes)
    run_rows = tab.page.locator("[data-testid=report-runs] tbody tr")
    expect(run_rows).to_have_count(2)
    assert "succeeded" in run_rows.nth(1).inner_text() and "(month to date)" in run_rows.nth(1).inner_text()
    name, again = _download(tab, f"tr[data-run='{runs[1]['id']}'] [data-testid=run-download]")
    assert name == f"overspill-costs-demo-{month}.pdf"
    assert hashlib.sha256(again).hexdigest() == runs[1]["sha256"]

    # a chosen month: the previous one (no spend there)
    first = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    previous = f"{first - timedelta(days=1):%Y-%m}"
    tab.page.fill("[data-testid=export-month]", previous)
    name, html = _download(tab, "[data-testid=export-html]")
    assert name == f"overspill-costs-demo-{previous}.html" and b"no ledger entries in this period" in html
    expect(run_rows).to_have_count(3)
    tab.shot("costs-finance-exports")
    tab.page.locator("[data-testid=export]").screenshot(path=str(artifacts_dir() / "costs-export-panel.png"))
    tab.close()


def test_finance_creates_and_deletes_a_report_schedule(browser: Any, broker: Broker, month: str) -> None:
    tab = Page(browser, broker)
    tab.sign_in(broker.keys["finance"])
    tab.page.wait_for_selector("[data-testid=schedules]")
    tab.page.click("[data-testid=schedule-toggle]")
    tab.page.fill("[data-testid=schedule-name]", "month to date for the CFO")
    tab.page.fill("[data-testid=schedule-cron]", "not a cron")
    tab.page.select_option("[data-testid=schedule-period]", "month_to_date")
    tab.page.select_option("[data-testid=schedule-format]", "csv")
    tab.page.select_option("[data-testid=schedule-destination_type]", "email")
    tab.page.fill("[data-testid=schedule-destination]", "cfo@example.com")
    tab.page.click("[data-testid=schedule-create]")
    tab.page.wait_for_selector("[data-testid=schedule-error]:visible")
    assert "cron" in tab.text("[data-testid=schedule-error]")
    tab.page.fill("[data-testid=schedule-cron]", "0 7 * * 1")
    tab.page.fill("[data-testid=schedule-timezone]", "Europe/Paris")
    tab.page.click("[data-testid=schedule-create]")
    row = tab.page.locator("[data-testid=report-schedules] tbody tr")
    expect(row).to_have_count(1)
    text = row.inner_text()
    assert "month to date for the CFO" in text and "0 7 * * 1 (Europe/Paris)" in text
    assert "CSV, month to date" in text and "email cfo@example.com" in text
    with broker.api(broker.keys["finance"]) as api:
        [made] = api.get("/v1/report-schedules").json()["items"]
    assert made["destination"] == {"type": "email", "to": ["cfo@example.com"]} and made["period"] == "month_to_date"
    tab.page.locator("[data-testid=schedules]").screenshot(path=str(artifacts_dir() / "costs-schedules.png"))
    tab.page.click("[data-testid=schedule-delete]")
    expect(tab.page.locator("[data-testid=schedule-delete]")).to_have_text("Delete: sure?")
    assert row.count() == 1  # one click arms it, a second deletes
    tab.page.click("[data-testid=schedule-delete]")
    tab.page.wait_for_selector("[data-testid=report-schedules-empty]")
    with broker.api(broker.keys["finance"]) as api:
        assert api.get("/v1/report-schedules").json()["items"] == []
    tab.close()


def test_admins_get_the_same_reports_block(browser: Any, broker: Broker, month: str) -> None:
    tab = Page(browser, broker)
    tab.sign_in(DEV_API_KEY)
    tab.go("#/costs", "costs")
    for part in ("export", "schedules", "spend-chart", "costs-total"):
        assert tab.page.is_visible(f"[data-testid={part}]"), part
    tab.shot("costs-admin-reports")
    tab.close()


def test_report_downloads_carry_their_content_types(broker: Broker, month: str) -> None:
    """What the console saves is what the download route says it is."""
    with broker.api(broker.keys["finance"]) as api:
        for fmt, content_type in (
            ("csv", "text/csv; charset=utf-8"),
            ("focus", "text/csv; charset=utf-8"),
            ("html", "text/html; charset=utf-8"),
            ("pdf", "application/pdf"),
        ):
            run = api.post("/v1/report-runs", json={"period": month, "format": fmt}).json()
            got = api.get(run["download_url"])
            assert got.headers["content-type"] == content_type, fmt
            assert got.headers["content-disposition"] == f'attachment; filename="{run["filename"]}"'
            assert Path(run["filename"]).name == run["filename"]
