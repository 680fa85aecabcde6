"""The one rule for text a client sends: no control characters (issue 32: a NUL in a job's name was stored on SQLite
and answered a plain-text 500 on PostgreSQL; a tab or newline in a checkpoint URI was checked on Python's cleaned
form of it but stored as sent).

Role: annotated string types the request schemas (broker/api/schemas.py, broker/finance/schemas.py) use for every
free-text field, so a refusal is a 422 naming the field, as any other validation error:
- `FreeText`: names, notes, cron expressions, time zones, periods: no character of Unicode category Cc (C0 controls
  U+0000-U+001F, DEL, C1 controls U+0080-U+009F) and no line or paragraph separator (U+2028, U+2029).
- `UriText`: `FreeText` that also neither starts nor ends with whitespace (URI parsers strip it silently, so the URI
  checked would not be the one stored).
- `Argument`: a command-line argument: tabs and newlines are legitimate in argv (`python -c "..."`), but a NUL can
  never be passed to a process (nor stored by PostgreSQL), so only NUL is refused.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def no_control_characters(value: str) -> str:
    """`value` unchanged, or ValueError naming the first control character and where it is."""
    found = _CONTROL.search(value)
    if found is not None:
        raise ValueError(
            f"must not contain control characters (found U+{ord(found.group()):04X} at position {found.start()})"
        )
    return value


def no_surrounding_whitespace(value: str) -> str:
    if value != value.strip():
        raise ValueError("must not start or end with whitespace")
    return value


def no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"must not contain NUL (U+0000, at position {value.index(chr(0))})")
    return value


FreeText = Annotated[str, AfterValidator(no_control_characters)]
UriText = Annotated[str, AfterValidator(no_control_characters), AfterValidator(no_surrounding_whitespace)]
Argument = Annotated[str, AfterValidator(no_nul)]
