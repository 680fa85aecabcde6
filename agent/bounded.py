"""Parse hostile bytes with bounds: the one JSON loader for every document read from a store, an instance, Slurm, a
cloud or a feed, and the range checks for the values that enter from them. Standard library only (the agent ships
alone and uses it too; providers, pricing and the broker import it from here).

- `load_json(data, source=..., max_bytes=..., max_depth=...)`: refuses (`HostileInput`, a `ValueError` whose
  message names `source`) a document over `max_bytes`, nested deeper than `max_depth` containers (checked on the
  bytes before parsing, so 30,000 `[` never reach the recursive parser), not UTF-8, not JSON, or holding `NaN`,
  `Infinity` or a number that overflows to infinity. The depth check runs at C speed (strings blanked by one
  regular expression, then innermost bracket pairs removed round by round, at most `max_depth` rounds; a round
  removes one level, or two where arrays and objects alternate, so a document passes only when its depth is at most
  2 x `max_depth` and the recursive parser never comes near Python's recursion limit).
- `finite(value, field, lo, hi)`: a number (int, float or Decimal; not bool) that is finite and within [lo, hi].
- `bounded_time(value, field, now, horizon)`: an aware datetime (or an ISO 8601 string with a zone) within
  `horizon` of `now` either way; anything at the calendar's ends (year 1, year 9999, year 10000 in UTC) is refused
  before any arithmetic on it can overflow.
Every `source` passed to `load_json` is an ingestion point: `tests/poison/` finds them in the source tree and
fails until each has poison cases.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_DEPTH = 32
# how far from now a time that enters from outside may lie (a notice deadline, a start, a price's observation)
DEFAULT_HORIZON = timedelta(days=366 * 5)

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


class HostileInput(ValueError):
    """A document or value refused by the bounds; the message names where it came from and the field."""


def nesting_ok(data: bytes, max_depth: int) -> bool:
    """True when `data`'s containers nest at most `max_depth` rounds deep (see the module docstring); a document
    whose brackets do not pair up passes (the parser then refuses it)."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return True
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", data))
    for _ in range(max_depth):
        if not brackets:
            return True
        shorter = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if len(shorter) == len(brackets):
            return True  # unbalanced: not JSON, the parser says so
        brackets = shorter
    return not brackets


def _no_constant(name: str) -> Any:
    raise HostileInput(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise HostileInput(f"the number {text[:40]} overflows")
    return value


def load_json(
    data: bytes | str, *, source: str, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH
) -> Any:
    """`data` parsed, or HostileInput naming `source` (see the module docstring)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise HostileInput(f"{source}: {len(raw)} bytes, over the {max_bytes} byte limit")
    if not nesting_ok(raw, max_depth):
        raise HostileInput(f"{source}: nested deeper than {max_depth} levels")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HostileInput(f"{source}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except HostileInput as exc:
        raise HostileInput(f"{source}: {exc}") from None
    except RecursionError:  # cannot happen under the depth check; kept so no path ever lets one escape
        raise HostileInput(f"{source}: nested too deep") from None
    except ValueError as exc:  # JSONDecodeError, an integer of more digits than Python converts
        raise HostileInput(f"{source}: not JSON ({str(exc)[:200]})") from None


def finite(value: Any, field: str, lo: float | Decimal | None = None, hi: float | Decimal | None = None) -> Any:
    """`value` when it is a finite number within [lo, hi] (either bound optional); HostileInput naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise HostileInput(f"{field}: {type(value).__name__} is not a number")
    try:
        ok = value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)
    except (InvalidOperation, OverflowError):
        ok = False
    if not ok:
        raise HostileInput(f"{field}: {value} is not a finite number")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise HostileInput(f"{field}: {value} is outside [{lo}, {hi}]")
    return value


def bounded_time(value: Any, field: str, now: datetime, horizon: timedelta = DEFAULT_HORIZON) -> datetime:
    """`value` (an aware datetime, or an ISO 8601 string with a zone) as a UTC datetime within `horizon` of `now`;
    HostileInput naming `field` otherwise. The offset is applied by hand, after the year is checked, so a time at
    the calendar's ends (9999-12-31T23:59:59-01:00 is year 10000 in UTC) is refused, never an OverflowError."""
    if isinstance(value, str):
        if len(value) > 64:
            raise HostileInput(f"{field}: not an ISO 8601 time")
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise HostileInput(f"{field}: {value[:64]!r} is not an ISO 8601 time") from None
    if not isinstance(value, datetime):
        raise HostileInput(f"{field}: {type(value).__name__} is not a time")
    offset = value.utcoffset()
    if offset is None:
        raise HostileInput(f"{field}: a time needs a zone")
    earliest, latest = now.year - horizon.days // 365 - 1, now.year + horizon.days // 365 + 1
    if not max(2, earliest) <= value.year <= min(9998, latest):
        raise HostileInput(f"{field}: {value.isoformat()} is beyond {horizon.days} days from now")
    at = (value.replace(tzinfo=None) - offset).replace(tzinfo=timezone.utc)
    if abs(at - now) > horizon:
        raise HostileInput(f"{field}: {at.isoformat()} is beyond {horizon.days} days from now")
    return at


_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(value: Any, max_chars: int) -> str:
    """`value` as text a database takes whole: at most `max_chars`, NUL and the other control characters (but tab
    and line breaks) replaced by U+FFFD, lone surrogates (a JSON `\\ud800`) too."""
    text = str(value)[:max_chars]
    text = text.encode("utf-8", "replace").decode("utf-8") if _has_surrogate(text) else text
    return _CONTROL.sub("\ufffd", text)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
