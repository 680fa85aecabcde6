"""The web console in headless Chromium (Playwright) against a real broker process with the simulated market.

Drives what operators, submitters and finance do: sign in with an API key, watch a job go pending -> running ->
succeeded with its spend growing, read pools and costs; a finance key sees costs but no jobs and no submit button;
another tenant's job is invisible in the list and by direct URL. Every page is screenshotted into
`$OVERSPILL_ARTIFACTS_DIR/console/` (default `artifacts/console/`, git-ignored). The page must load nothing from
outside the broker and raise no console errors (a Content-Security-Policy violation would be one).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.api.auth import Role, create_key
from broker.config.settings import DEV_API_KEY, Settings
from broker.store.db import make_engine
from tests.builders import job_body
from tests.console_server import running

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("OVERSPILL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SPEED = 600.0  # simulated seconds per real second: a simulated hour every 6 s

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
expect = playwright_api.expect
pytestmark = pytest.mark.integration


def artifacts_dir() -> Path:
    base = Path(os.environ.get("OVERSPILL_ARTIFACTS_DIR") or ROOT / "artifacts")
    out = base / "console"
    out.mkdir(parents=True, exist_ok=True)
    return out


@dataclass
class Broker:
    url: str
    settings: Settings
    pause: Path
    log: Path
    keys: dict[str, str] = field(default_factory=dict)

    def api(self, key: str = DEV_API_KEY) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=10)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp = tmp_path_factory.mktemp("console")
    database = f"sqlite:///{tmp / 'broker.store.db'}"
    env = {
        "OVERSPILL_DATABASE_URL": database,
        "OVERSPILL_TICK_INTERVAL_SECONDS": "300",  # simulated: 0.5 s of real time at SPEED
        "OVERSPILL_BOOTSTRAP_API_KEY": DEV_API_KEY,
        "OVERSPILL_LOG_LEVEL": "info",
    }
    pause = tmp / "pause"
    pause.touch()
    log = tmp / "broker.log"
    with running(tmp, env, ["--speed", str(SPEED), "--pause-file", str(pause)], log) as url:
        settings = Settings(database_url=database, data_dir=tmp)
        engine = make_engine(settings)
        b = Broker(url, settings, pause, log)
        for name, tenant, role in (
            ("submitter", "demo", Role.SUBMITTER),
            ("finance", "demo", Role.FINANCE),
            ("other", "other-tenant", Role.ADMIN),
        ):
            b.keys[name] = create_key(engine, tenant=tenant, role=role, name=f"e2e {name}", now=settings_now())
        engine.dispose()
        yield b


def settings_now() -> Any:
    from broker.store.db import utcnow

    return utcnow()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"],
        )
        yield b
        b.close()


class Page:
    """One signed-in tab that records every request it makes and every console error it sees."""

    def __init__(self, browser: Any, broker: Broker) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.broker = broker
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def sign_in(self, key: str) -> None:
        self.page.goto(f"{self.broker.url}/console/")
        self.page.wait_for_selector("body[data-ready=signin]")
        self.page.fill("[data-testid=api-key]", key)
        self.page.click("[data-testid=signin]")
        self.page.wait_for_selector("body[data-ready]:not([data-ready=signin])")

    def go(self, fragment: str, ready: str) -> None:
        self.page.evaluate("f => { location.hash = f }", fragment)
        self.page.wait_for_selector(f"body[data-ready={ready}]")

    def shot(self, name: str, full_page: bool = True) -> None:
        self.page.screenshot(path=str(artifacts_dir() / f"{name}.png"), full_page=full_page)

    def text(self, selector: str) -> str:
        return str(self.page.inner_text(selector)).strip()

    def close(self) -> None:
        # deliberate 4xx answers (a wrong key, a bad field, another tenant's job) are logged by Chromium as failed
        # loads; anything else (a script error, a CSP violation) fails the test
        errors = [
            e
            for e in self.errors
            if not e.startswith("Failed to load resource: the server responded with a status of 4")
        ]
        assert not errors, errors
        outside = [u for u in self.requests if not u.startswith(self.broker.url)]
        assert not outside, f"the console fetched from outside the broker: {outside}"
        self.context.close()


def usd(text: str) -> Decimal:
    return Decimal(re.sub(r"[^0-9.]", "", text))


def wait_state(tab: Page, state: str, timeout_s: float = 90) -> None:
    # locator assertions, not wait_for_function: the page's CSP (rightly) forbids the eval that one needs
    expect(tab.page.locator("[data-testid=job-state]")).to_have_text(state, timeout=timeout_s * 1000)


def test_watch_a_job_from_pending_to_done_with_its_spend_growing(browser: Any, broker: Broker) -> None:
    with broker.api() as api:
        job = api.post("/v1/jobs", json=job_body(name="watch-me", work_gpu_hours="2", max_total_usd="40")).json()
    tab = Page(browser, broker)
    tab.sign_in(DEV_API_KEY)
    assert tab.text("[data-testid=who]") == "demo · admin"
    tab.page.wait_for_selector(f"tr[data-job='{job['id']}']")
    assert tab.text(f"tr[data-job='{job['id']}'] [data-testid=job-state]") == "pending"
    assert tab.page.is_visible("[data-testid=submit-toggle]")  # admins may submit
    tab.shot("jobs-pending")

    tab.page.click(f"tr[data-job='{job['id']}'] a")
    tab.page.wait_for_selector("body[data-ready=job]")
    assert tab.text("[data-testid=job-state]") == "pending"
    assert tab.text("[data-testid=job-spent]") == "$0.00"
    tab.shot("job-pending")

    broker.pause.unlink()  # the control loop starts ticking: the job is placed, launched, run, accrued
    wait_state(tab, "running")
    spent = tab.page.locator("[data-testid=job-spent]")
    expect(spent).not_to_have_text("$0.00", timeout=60_000)
    first = usd(tab.text("[data-testid=job-spent]"))
    expect(spent).not_to_have_text(tab.text("[data-testid=job-spent]"), timeout=30_000)
    second = usd(tab.text("[data-testid=job-spent]"))
    state_now = tab.text("[data-testid=job-state]")
    assert second > first > 0, (first, second, state_now)
    assert tab.page.is_visible("[data-testid=placement]") or state_now != "running"
    # the simulated market runs no agent: the console says the progress is an estimate, and no checkpoint is known
    expect(tab.page.locator("[data-testid=job-progress]")).to_contain_text("progress not reported")
    expect(tab.page.locator("[data-testid=job-checkpoint]")).to_have_text("no durable checkpoint yet")
    tab.shot("job-running")

    wait_state(tab, "succeeded", timeout_s=120)
    # the accrual that reaches the placement's end writes its event in the tick after the state changed, or in it
    expect(tab.page.locator("[data-testid=timeline]")).to_contain_text("cost accrued", timeout=30_000)
    timeline = tab.text("[data-testid=timeline]")
    for kind in ("submitted", "placed", "started", "cost accrued", "finished"):
        assert kind in timeline, timeline
    with broker.api() as api:  # the last accrual commits just after the state changes: wait for it to settle
        final, previous = api.get(f"/v1/jobs/{job['id']}").json(), None
        while previous is None or final["spent_usd"] != previous["spent_usd"]:
            time.sleep(1.0)  # two ticks
            previous, final = final, api.get(f"/v1/jobs/{job['id']}").json()
    expect(spent).to_have_text(f"${Decimal(final['spent_usd']).quantize(Decimal('0.01'))}", timeout=10_000)
    assert Decimal(final["spent_usd"]) >= second
    tab.shot("job-succeeded")

    tab.go("#/pools", "pools")
    assert tab.page.locator("[data-testid=pools] tbody tr").count() > 100
    assert tab.page.locator("[data-testid=pressure] tbody tr").count() >= 1
    assert tab.page.locator("[data-testid=feeds] tbody tr").count() >= 1
    tab.page.fill("[data-testid=pool-filter]", "h100 spot")
    visible = tab.page.locator("[data-testid=pools] tbody tr:visible")
    assert 0 < visible.count() < 100 and all("H100" in t for t in visible.all_inner_texts())
    tab.page.fill("[data-testid=pool-filter]", "")
    tab.shot("pools", full_page=False)  # the first screen: feeds, pressure, cheapest per GPU type

    tab.go("#/costs", "costs")
    assert_costs_page(tab)
    tab.shot("costs-admin")
    tab.close()


def assert_costs_page(tab: Page, budget: str | None = None) -> None:
    """The costs page shows the tenant's spend from /v1/costs and, when given, the named budget from /v1/budgets."""
    assert tab.page.locator("[data-testid=costs-unavailable], [data-testid=budgets-unavailable]").count() == 0
    assert tab.text("[data-testid=cost-total]").startswith("$")
    assert tab.page.is_visible("[data-testid=costs-by-team]")
    if budget is not None:
        expect(tab.page.locator("[data-testid=budgets]")).to_contain_text(budget, timeout=10_000)


def test_finance_sees_costs_and_pools_but_no_jobs_and_no_submit(browser: Any, broker: Broker) -> None:
    with broker.api(broker.keys["finance"]) as api:  # finance manages budgets
        made = api.post("/v1/budgets", json={"scope": "team", "name": "console-team", "amount_usd": "500"})
        assert made.status_code == 201, made.text
    tab = Page(browser, broker)
    tab.sign_in(broker.keys["finance"])
    assert tab.page.evaluate("() => location.hash") == "#/costs"
    assert tab.text("[data-testid=who]") == "demo · finance"
    assert_costs_page(tab, budget="console-team")
    nav = [t.strip() for t in tab.page.locator("#nav a:visible").all_inner_texts()]
    assert nav == ["Pools", "Costs"]
    tab.shot("costs-finance")
    tab.go("#/jobs", "forbidden")
    assert tab.page.locator("[data-testid=submit-toggle], [data-testid=submit-form]").count() == 0
    assert tab.page.locator("[data-testid=jobs]").count() == 0
    tab.go("#/pools", "pools")
    assert tab.page.locator("[data-testid=submit-toggle]").count() == 0
    tab.close()


def test_another_tenants_job_is_invisible(browser: Any, broker: Broker) -> None:
    with broker.api() as api:
        job = api.post("/v1/jobs", json=job_body(name="demo-private")).json()
    tab = Page(browser, broker)
    tab.sign_in(broker.keys["other"])
    assert tab.text("[data-testid=who]") == "other-tenant · admin"
    tab.page.wait_for_selector("body[data-ready=jobs]")
    assert tab.page.locator(f"tr[data-job='{job['id']}']").count() == 0
    assert "demo-private" not in tab.text("[data-testid=jobs]")
    tab.shot("jobs-other-tenant")
    tab.go(f"#/jobs/{job['id']}", "job")
    assert tab.page.is_visible("[data-testid=job-missing]")
    assert tab.page.locator("[data-testid=job-spent]").count() == 0
    tab.shot("job-other-tenant-direct-url")
    tab.close()


def test_submitter_submits_through_the_form_and_sees_field_errors(browser: Any, broker: Broker) -> None:
    tab = Page(browser, broker)
    tab.sign_in(broker.keys["submitter"])
    nav = [t.strip() for t in tab.page.locator("#nav a:visible").all_inner_texts()]
    assert nav == ["Jobs", "Pools"]
    tab.page.click("[data-testid=submit-toggle]")
    tab.page.fill("[data-testid=submit-name]", "from-the-console")
    tab.page.fill("[data-testid=submit-image]", "ghcr.io/acme/train:2.0")
    tab.page.fill("[data-testid=submit-max_total_usd]", "-5")
    tab.page.click("[data-testid=submit-job]")
    tab.page.wait_for_selector("[data-testid=submit-error]:visible")
    assert "max_total_usd" in tab.text("[data-testid=submit-error]")
    tab.shot("submit-error")
    tab.page.fill("[data-testid=submit-max_total_usd]", "25")
    tab.page.click("[data-testid=submit-job]")
    expect(tab.page).to_have_url(re.compile(r"#/jobs/job_"))
    tab.page.wait_for_selector("body[data-ready=job]")
    assert tab.text("h1").startswith("from-the-console")
    job_id = tab.page.evaluate("() => location.hash").split("/")[-1]
    with broker.api(broker.keys["submitter"]) as api:
        stored = api.get(f"/v1/jobs/{job_id}").json()
    assert stored["spec"]["image"] == "ghcr.io/acme/train:2.0" and stored["max_total_usd"] == "25"
    tab.shot("submitted")
    tab.close()


def test_a_wrong_key_is_refused_and_signing_out_forgets_the_key(browser: Any, broker: Broker) -> None:
    tab = Page(browser, broker)
    tab.page.goto(f"{broker.url}/console/")
    tab.page.wait_for_selector("body[data-ready=signin]")
    tab.page.fill("[data-testid=api-key]", "ovs_nope_not-a-real-key-at-all")
    tab.page.click("[data-testid=signin]")
    tab.page.wait_for_selector("[data-testid=signin-error]:visible")
    assert "401" in tab.text("[data-testid=signin-error]") or "invalid" in tab.text("[data-testid=signin-error]")
    tab.shot("signin-refused")
    tab.sign_in(DEV_API_KEY)
    assert tab.page.evaluate("() => sessionStorage.getItem('overspill.key')") == DEV_API_KEY
    tab.page.click("#signout")
    tab.page.wait_for_selector("body[data-ready=signin]")
    assert tab.page.evaluate("() => sessionStorage.getItem('overspill.key')") is None
    tab.close()


def test_console_is_served_with_a_strict_content_security_policy(broker: Broker) -> None:
    page = httpx.get(f"{broker.url}/console/")
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "http" not in page.text.replace(broker.url, "")  # nothing linked from elsewhere
    for asset in ("console.js", "console.css"):
        assert httpx.get(f"{broker.url}/console/static/{asset}").status_code == 200
    assert httpx.get(f"{broker.url}/console/static/..%2Fsettings.py").status_code == 404
    assert httpx.get(f"{broker.url}/console", follow_redirects=False).status_code == 308


def test_whoami_names_the_key_and_needs_one(client: Any, key_for: Any) -> None:
    """The console adapts to the role GET /v1/whoami reports (in-process: no browser needed)."""
    assert client.get("/v1/whoami").json() == {"key_id": "devadmin", "tenant": "demo", "role": "admin"}
    finance = client.get("/v1/whoami", headers=key_for("acme", Role.FINANCE)).json()
    assert finance["tenant"] == "acme" and finance["role"] == "finance" and finance["key_id"] != "devadmin"
    anonymous = client.get("/v1/whoami", headers={"Authorization": ""})
    assert anonymous.status_code == 401
