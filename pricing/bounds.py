"""The bounds an offering from a price feed (a cloud's price list, a spot price history, a catalog) must keep to
before the broker stores it: what `broker.loop.feeds.refresh_prices` checks for every pool a feed answers, so one
malformed pool is refused alone and the feed's other pools are stored as before.

`offering_refusal(o, now)`: None for a sane offering, else why (naming the field): a price, egress rate or memory
that is not a finite number within its range (`agent.bounded.finite`), an interruption rate or queue wait that is NaN,
infinite or negative, counts out of range, an observation time beyond `agent.bounded.DEFAULT_HORIZON` of now, or a
name holding control characters.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal

from agent.bounded import HostileInput, bounded_time, finite
from providers.model import Offering

MAX_HOURLY_USD = Decimal("100000")  # no instance costs more an hour; a feed saying so is wrong
MAX_COUNT = 100_000
_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")


def offering_refusal(o: Offering, now: datetime) -> str | None:
    """Why offering `o` is refused, or None (see the module docstring)."""
    try:
        finite(o.price.hourly_usd, "price.hourly_usd", Decimal(0), MAX_HOURLY_USD)
        finite(o.egress_usd_per_gb, "egress_usd_per_gb", Decimal(0), MAX_HOURLY_USD)
        finite(o.memory_gib, "memory_gib", Decimal(0), Decimal(MAX_COUNT * 1000))
        finite(o.interruption_rate_per_hour, "interruption_rate_per_hour", 0.0, 1e6)
        finite(o.expected_wait_hours, "expected_wait_hours", 0.0, 1e6)
        for name in ("accelerator_count", "gpu_memory_gib", "vcpus"):
            finite(getattr(o, name), name, 0, MAX_COUNT)
        bounded_time(o.price.observed_at, "price.observed_at", now)
    except HostileInput as exc:
        return str(exc)
    for name in ("provider", "region", "zone", "instance_type", "accelerator"):
        value = getattr(o, name)
        if not isinstance(value, str) or not _NAME.match(value):
            return f"{name}: {str(value)[:80]!r} is not a name"
    return None
