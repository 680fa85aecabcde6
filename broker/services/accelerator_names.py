"""Refuses a job spec naming an accelerator nobody knows, with the nearest names, before it is ranked or queued.

`check_accelerators(names, book)` raises `Unprocessable("accelerators", "unknown accelerator A10O; known: A100,
A10, A10G, A800, H100")` for the first requested name that is neither in the canonical tables
(`providers.accelerators`) nor offered by any pool of the price book; the known names listed are the closest in
spelling among both. A name a pool offers passes (new hardware from an imported catalog flows through); a name
in the tables that no pool offers now passes too (the placement then says no pool fits), and so does `CPU`
(a CPU job's slots on the local pool).
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.services.errors import Unprocessable
from pricing.book import PriceBook
from providers.accelerators import is_known, known_names, nearest
from providers.local.pool import CPU

SHOWN = 5


def check_accelerators(names: Iterable[str], book: PriceBook) -> None:
    """Raise `Unprocessable` naming the first unknown accelerator of `names` (canonical) and the nearest known."""
    names = list(names)
    unknown = [n for n in names if not is_known(n) and n != CPU]  # CPU: the local pool's CPU slots
    if not unknown:
        return
    offered = {o.accelerator for o in book}
    for name in unknown:
        if name not in offered:
            choices = nearest(name, [*known_names(), *offered], SHOWN)
            raise Unprocessable("accelerators", f"unknown accelerator {name}; known: {', '.join(choices)}, ...")
