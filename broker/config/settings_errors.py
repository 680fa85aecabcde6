"""Settings errors as one line naming the environment variable to fix.

`Settings()` reads `OVERSPILL_*` variables; pydantic reports a bad one as a multi-line `ValidationError` naming the
field (`onprem_gpus.A100`), or, for a value that must be JSON and is not, a `SettingsError` whose cause holds the
parse error. `explain(exc)` turns either into `OVERSPILL_ONPREM_GPUS: A100: Input should be a valid integer (got
'x')` or `OVERSPILL_ONPREM_GPUS: not valid JSON: Expecting value: line 1 column 1 (char 0)`: the variable, where in
its value, and what is wrong. Anything else is returned as its own message on one line.
"""

from __future__ import annotations

import re

ENV_PREFIX = "OVERSPILL_"
_FIELD_OF_SOURCE = re.compile(r'field "([^"]+)"')
_MAX_SHOWN = 60


def env_name(field: str) -> str:
    """The environment variable of a settings field (`onprem_gpus` -> `OVERSPILL_ONPREM_GPUS`)."""
    return ENV_PREFIX + field.upper()


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def explain(exc: Exception) -> str:
    """One line naming the variable at fault and what is wrong with it (see the module docstring)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    if isinstance(exc, ValidationError):
        parts = []
        for error in exc.errors(include_url=False):
            loc = [str(p) for p in error.get("loc", ())]
            where = env_name(loc[0]) if loc else "settings"
            inner = ".".join(loc[1:])
            got = "" if error.get("type") == "missing" or not loc else f" (got {_shown(error.get('input'))})"
            message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
            parts.append(f"{where}: {inner + ': ' if inner else ''}{message}{got}")
        return _one_line("; ".join(parts)) or _one_line(str(exc))
    if isinstance(exc, SettingsError):
        found = _FIELD_OF_SOURCE.search(str(exc))
        cause = exc.__cause__
        if found is not None:
            why = f"not valid JSON: {cause}" if cause is not None else str(exc)
            return _one_line(f"{env_name(found.group(1))}: {why}")
    return _one_line(str(exc))
