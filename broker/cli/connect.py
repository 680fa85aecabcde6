"""The API client an HTTP command of the CLI talks through: `client(url, api_key)` builds it, importing the HTTP
client only when a command runs (the CLI stays fast), and turns a broker URL that is not `http(s)://HOST[:PORT]`
into a one-line usage error naming where it came from (`--url` or OVERSPILL_URL)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from broker.cli.output import usage_error

if TYPE_CHECKING:
    from overspill.client import BrokerClient


def client(url: str | None, api_key: str | None) -> BrokerClient:
    """The API client of an HTTP command; a broker URL that is not `http(s)://HOST[:PORT]` is a usage error naming
    where it came from (`--url` or OVERSPILL_URL) and the expected form."""
    from overspill.client import BrokerClient

    try:
        return BrokerClient(url, api_key)
    except ValueError as exc:
        given = "--url" if any(a == "--url" or a.startswith("--url=") for a in sys.argv) else "OVERSPILL_URL"
        usage_error(str(exc).replace("url: ", f"{given}: ", 1) if url else str(exc))
