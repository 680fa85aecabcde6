"""Report formats: `render(fmt, data)` returns the file's bytes, its MIME type and file extension."""

from __future__ import annotations

from collections.abc import Callable

from broker.finance.reports.csv_report import render_csv
from broker.finance.reports.data import ReportData
from broker.finance.reports.focus import render_focus
from broker.finance.reports.html_report import render_html

FORMATS = ("csv", "focus", "html", "pdf")
_TYPES = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "focus": ("text/csv; charset=utf-8", "focus.csv"),
    "html": ("text/html; charset=utf-8", "html"),
    "pdf": ("application/pdf", "pdf"),
}


def _pdf(data: ReportData) -> bytes:
    from broker.finance.reports.pdf_report import render_pdf  # reportlab is imported only when a PDF is asked for

    return render_pdf(data)


_RENDERERS: dict[str, Callable[[ReportData], bytes]] = {
    "csv": render_csv,
    "focus": render_focus,
    "html": render_html,
    "pdf": _pdf,
}


def render(fmt: str, data: ReportData) -> tuple[bytes, str, str]:
    if fmt not in _RENDERERS:
        raise ValueError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")
    content_type, ext = _TYPES[fmt]
    return _RENDERERS[fmt](data), content_type, ext
