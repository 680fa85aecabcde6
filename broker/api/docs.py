"""The served OpenAPI document and the interactive docs.

`openapi_document(app)` is FastAPI's document with what generated clients need spelled out:
- security schemes: `BearerAuth` (`Authorization: Bearer <API key>`) and `ApiKeyAuth` (`X-API-Key`) on every
  route that needs a key; `CallbackToken` on the instances' callbacks; `MetricsToken` (optional) on `/metrics`;
  every other operation says `security: []` (no credential), or lists `{}` first when a credential is optional;
- every error response is `application/problem+json` with the `Problem` schema (broker/api/problems.py);
- money fields (`*_usd*`, `usd`) are decimal strings with a pattern (a positive amount sent to the broker: at most 12
  digits before the point and 6 after).

`/docs` is Swagger UI 5 (which renders OpenAPI 3.1, the version FastAPI writes) served from the assets the
`fastapi-offline` package ships (no CDN: it works offline), with the Authorize button for the two key schemes.
tests/test_docs_browser.py loads it in headless Chromium and finds the operations listed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Response, status
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.openapi.utils import get_openapi

from broker.api.problems import PROBLEM_MEDIA_TYPE

DECIMAL_PATTERN = r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"
# a positive amount the broker takes (`broker.api.schemas.Usd`: 18 digits, 6 of them decimals)
USD_INPUT_PATTERN = r"^\d{1,12}(\.\d{1,6})?$"
# served name -> (file in the package's static folder, media type)
DOCS_ASSETS = {
    "swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "favicon-32x32.png": ("favicon.png", "image/png"),
}
METRICS_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "`Authorization: Bearer <OVERSPILL_METRICS_TOKEN>` when the operator set one (not an API key)",
}


def swagger_ui_dir() -> Path:
    """The folder of Swagger UI 5's assets in the installed `fastapi-offline` package (found without importing it)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the fastapi-offline package (Swagger UI's assets for /docs) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def mount_docs(app: FastAPI) -> None:
    """`/docs` (Swagger UI) and its assets under `/docs/static/`, all from the installed package."""

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> Response:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url="/docs/static/swagger-ui-bundle.js",
            swagger_css_url="/docs/static/swagger-ui.css",
            swagger_favicon_url="/docs/static/favicon-32x32.png",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_ui_parameters={"persistAuthorization": True},
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def swagger_redirect() -> Response:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/docs/static/{name}", include_in_schema=False)
    def swagger_asset(name: str) -> Response:
        asset = DOCS_ASSETS.get(name)
        if asset is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"name: no docs file {name!r}")
        file, media_type = asset
        body = (swagger_ui_dir() / file).read_bytes()
        return Response(body, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"})


def _money(name: str, prop: dict[str, Any]) -> None:
    if "usd" not in name.lower().split("_"):
        return
    branches = prop.get("anyOf", [prop])
    positive = any(b.get("type") == "number" and b.get("exclusiveMinimum") == 0 for b in branches)
    for branch in branches:
        if branch.get("type") == "number" and positive:
            branch.setdefault("maximum", 10**12 - 1)
        if branch.get("type") == "string" and "pattern" not in branch and "format" not in branch:
            branch["pattern"] = USD_INPUT_PATTERN if positive else DECIMAL_PATTERN
            branch.setdefault("examples", ["12.50"])


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The document `/openapi.json` serves (built once per app; see the module docstring)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
    )
    components = doc.setdefault("components", {})
    components.setdefault("securitySchemes", {})["MetricsToken"] = METRICS_SCHEME
    for path_item in doc.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            operation.setdefault("security", [])  # no scheme declared: this operation needs no credential
            for code, response in operation["responses"].items():
                ref = str(response.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", ""))
                if code[0] in "45" and (not ref or ref.endswith(("/Problem", "/HTTPValidationError"))):
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    schemas = components.get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for schema in schemas.values():
        for prop_name, prop in schema.get("properties", {}).items():
            _money(prop_name, prop)
    app.openapi_schema = doc
    return doc
