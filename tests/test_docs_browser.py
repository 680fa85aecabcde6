"""`/docs` renders the broker's OpenAPI 3.1 document in headless Chromium (Playwright): Swagger UI 5 from the
installed package (Swagger UI 4 answers "Unable to render this definition" to 3.1), every operation of the
document listed, and nothing loaded from outside the broker."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from broker.app import create_app
from broker.runtime import Runtime
from tests.served_api import served

CHROMIUM = os.environ.get("OVERSPILL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
pytestmark = pytest.mark.integration


@pytest.fixture
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


def test_docs_page_lists_every_operation(rt: Runtime, browser: Any) -> None:
    with served(create_app(runtime=rt)) as url:
        document = httpx.get(f"{url}/openapi.json", timeout=30).json()
        assert document["openapi"].startswith("3.1")
        operations = {
            (method.upper(), path)
            for path, item in document["paths"].items()
            for method in item
            if method in ("get", "post", "put", "patch", "delete")
        }
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        outside: list[str] = []
        errors: list[str] = []
        page.on("request", lambda r: outside.append(r.url) if urlsplit(r.url).netloc != urlsplit(url).netloc else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/docs")
        page.wait_for_selector(".opblock-summary", timeout=60_000)
        stamp = page.inner_text(".info .version-stamp")  # Swagger UI's badge of the document's OpenAPI version
        shown = {
            (
                block.query_selector(".opblock-summary-method").inner_text().strip(),
                block.query_selector(".opblock-summary-path").get_attribute("data-path"),
            )
            for block in page.query_selector_all(".opblock-summary")
        }
        body = page.inner_text("body")
        page.close()
    assert "Unable to render this definition" not in body
    assert stamp.strip() == "OAS 3.1", stamp
    assert shown == operations
    assert ("POST", "/v1/jobs") in shown and ("POST", "/v1/quotes") in shown
    assert outside == [] and errors == []
