"""What the agent uses from the standard library that is newer than its floor, Python 3.8.

The agent runs on the system Python of cloud GPU images (Amazon Linux 2023 and Debian 11 ship 3.9, Ubuntu 22.04
3.10, Ubuntu 20.04 3.8), while the rest of the project needs 3.11. Every other agent module imports these instead of
the 3.9+/3.11+ originals, and behaves the same on every interpreter from 3.8 on:

- `StrEnum`: `enum.StrEnum` (3.11) as a `str` mixin enum; members equal, hash, format, `str()` and `json.dumps` as
  their values, so the wire formats do not depend on the interpreter.
- `UTC`: `datetime.UTC` (3.11) is `datetime.timezone.utc`.
- `parse_iso8601(text)`: `datetime.fromisoformat` as 3.11 reads the timestamps providers send ("Z" for UTC, any
  number of fraction digits, "+hhmm" offsets), which 3.8-3.10 refuse; raises ValueError like it.
- `remove_prefix(text, prefix)`: `str.removeprefix` (3.9).
- `md5()`: `hashlib.md5(usedforsecurity=False)` (3.9) where the interpreter has the flag, so FIPS-mode hosts allow
  it for integrity checks (S3's Content-MD5); plain `hashlib.md5()` on 3.8.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from enum import Enum
from typing import Any

UTC = timezone.utc


class StrEnum(str, Enum):
    """An enum whose members are strings: `Member == "value"`, `str(Member) == f"{Member}" == "value"`."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(str.__str__(self), format_spec)


# the time part of an ISO 8601 timestamp: fraction digits and an offset without a colon are what 3.8-3.10 refuse
_TIME_TAIL = re.compile(r"([T ]\d{2}:\d{2}(?::\d{2})?)(?:\.(\d+))?(Z|[+-]\d{2}:?\d{2}(?::\d{2})?)?$")


def _normalize_tail(match: re.Match[str]) -> str:
    time, fraction, offset = match.group(1), match.group(2), match.group(3)
    out = time
    if fraction:
        out += "." + fraction[:6].ljust(6, "0")
    if offset == "Z":
        out += "+00:00"
    elif offset:
        out += offset if ":" in offset else offset[:3] + ":" + offset[3:]
    return out


def parse_iso8601(text: str) -> datetime:
    """`datetime.fromisoformat(text)` with 3.11's reading of "Z", fractions and "+hhmm" on every interpreter."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        normalized = _TIME_TAIL.sub(_normalize_tail, text)
        if normalized == text:
            raise
        return datetime.fromisoformat(normalized)


def remove_prefix(text: str, prefix: str) -> str:
    return text[len(prefix) :] if prefix and text.startswith(prefix) else text


def md5() -> Any:
    """A new MD5 hash object, not for security (Content-MD5 integrity checks)."""
    try:
        return hashlib.md5(usedforsecurity=False)
    except TypeError:  # Python 3.8: no usedforsecurity
        return hashlib.md5()
