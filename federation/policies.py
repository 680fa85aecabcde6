"""Every deadline policy, selectable by name: importing this module registers the optional ones.

Role: the live loop (`broker.runtime.Runtime.deadline_strategy`, from the `deadline_policy` setting) and the
simulator pick a deadline policy by name. The built-in strategies are registered by `federation.strategies`;
the DP policies (`model_dp`, `chain_dp`) and the sample-average `forecast` live in their own modules, which
register themselves on import - this module imports them all so that a name means the same thing everywhere.

Contract: `build_deadline_policy(name, restart_hours)` returns a fresh policy object or raises ValueError naming
the policies that can run deadline jobs.
"""

from __future__ import annotations

import federation.chain_dp
import federation.forecast
import federation.model_dp  # noqa: F401  (the three register themselves)
from federation.strategies import STRATEGIES, Strategy, deadline_strategy


def build_deadline_policy(name: str, restart_hours: float) -> Strategy:
    """The registered policy `name`, built with the broker's changeover (`restart_hours`)."""
    try:
        return deadline_strategy(restart_hours, name)
    except (TypeError, ValueError) as exc:
        usable = []
        for known in sorted(STRATEGIES):
            try:
                deadline_strategy(restart_hours, known)
                usable.append(known)
            except (TypeError, ValueError):
                pass
        raise ValueError(f"deadline policy {name!r} is not one of: {', '.join(usable)}") from exc
