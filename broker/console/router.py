"""Serves the web console: `/console/` (the page) and `/console/static/<file>` (its script and styles).

The console is static HTML, CSS and vanilla JavaScript committed to the repository: nothing to build, nothing
fetched from the internet. It signs in with an API key (kept in the tab's sessionStorage) and calls the same
`/v1` API as any client, so it sees exactly what the key's tenant and role allow. Responses carry a strict
Content-Security-Policy: scripts, styles and requests only from the broker itself.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException, Response, status
from fastapi.responses import RedirectResponse

STATIC_DIR = Path(__file__).with_name("static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@cache
def _asset(name: str) -> tuple[bytes, str]:
    """The bytes and media type of a file shipped in `static/` (read once per process)."""
    path = STATIC_DIR / name
    if path.parent != STATIC_DIR or path.suffix not in _TYPES or not path.is_file():
        raise FileNotFoundError(name)
    return path.read_bytes(), _TYPES[path.suffix]


@router.get("/console")
def console_root() -> RedirectResponse:
    return RedirectResponse("/console/", status_code=status.HTTP_308_PERMANENT_REDIRECT)


@router.get("/console/")
def console_page() -> Response:
    body, media_type = _asset("index.html")
    return Response(body, media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/console/static/{name}")
def console_asset(name: str) -> Response:
    try:
        body, media_type = _asset(name)
    except FileNotFoundError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"name: no console file {name!r}") from None
    return Response(body, media_type=media_type, headers=SECURITY_HEADERS)
