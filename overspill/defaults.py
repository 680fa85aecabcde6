"""What the client assumes when nothing is configured, and the one check of a broker URL. Imports nothing but the
standard library, so the settings (`broker.config.settings`) and the CLI share these constants without either
loading the other.

- `DEV_API_KEY`: the development admin key, public on purpose; a production broker refuses to start with it.
- `DEFAULT_URL`: where a local `overspill serve` answers.
- `check_url(url, source)`: `url` without a trailing slash, or `ValueError` with one line naming `source` (the
  option or variable it came from), what is wrong and the expected form `http(s)://HOST[:PORT]`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

DEV_API_KEY = "ovs_devadmin_local-development-only"
DEFAULT_URL = "http://127.0.0.1:8000"
EXPECTED_FORM = "http://HOST[:PORT] or https://HOST[:PORT], e.g. http://127.0.0.1:8000"


def check_url(url: str, source: str = "url") -> str:
    """The broker URL `url` checked (see the module docstring)."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        raise ValueError(f"{source}: {text!r} is not a URL ({exc}); expected {EXPECTED_FORM}") from None
    if not parts.netloc:  # "127.0.0.1:8000", "localhost:8000", "broker"
        hint = f" (did you mean http://{text}?)" if text else ""
        raise ValueError(f"{source}: {text!r} has no scheme{hint}; expected {EXPECTED_FORM}")
    if parts.scheme not in ("http", "https"):
        raise ValueError(
            f"{source}: {text!r} has the scheme {parts.scheme!r}, not http or https; expected {EXPECTED_FORM}"
        )
    if not parts.hostname:
        raise ValueError(f"{source}: {text!r} has no host; expected {EXPECTED_FORM}")
    return text.rstrip("/")


TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
"""The job states a job never leaves."""
