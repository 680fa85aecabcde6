"""Small Markdown helpers shared by the generators: table cells, code spans, tables."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cell(text: object) -> str:
    """`text` safe inside one Markdown table cell: one line, pipes escaped."""
    s = " ".join(str(text).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace("|", "\\|")


def code(text: object) -> str:
    """`text` as an inline code span (backticks inside are handled by a longer fence), safe in a table cell."""
    s = " ".join(str(text).split())
    fence = "``" if "`" in s else "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"  # Python-Markdown's tables do not split on a pipe inside a code span


def prose(text: str) -> str:
    """Docstring text as Markdown: `<` and `>` outside code spans escaped (so `<name>` is not read as HTML)."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(
        p if p.startswith("`") else p.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for p in parts
    )


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table; the cells of `rows` are already formatted (use `cell` / `code`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def anchor(text: str) -> str:
    """The id MkDocs' toc extension gives a heading `text` (lowercase, words joined by '-')."""
    out = []
    for ch in text.lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return re.sub("-+", "-", "".join(out)).strip("-")


GENERATED_NOTE = (
    '!!! note "Generated"\n'
    "    This page is generated from the code at build time ({source}); edit the source, not this page.\n"
)
