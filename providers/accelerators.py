"""Canonical accelerator names, in one place, with their memory and the aliases clouds and catalogs use.

Every layer speaks canonical names (`A100-80GB`, `H100`, ...). `canonical()` maps a provider's spelling onto
them; an unknown name is returned upper-cased so new hardware still flows through, unranked by memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Accelerator:
    name: str
    memory_gib: int


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("K80", 12),
        Accelerator("T4", 16),
        Accelerator("V100", 16),
        Accelerator("V100-32GB", 32),
        Accelerator("A10", 24),
        Accelerator("A10G", 24),
        Accelerator("L4", 24),
        Accelerator("L40S", 48),
        Accelerator("A100", 40),
        Accelerator("A100-80GB", 80),
        Accelerator("H100", 80),
        Accelerator("H100-MEGA", 80),
        Accelerator("H200", 141),
        Accelerator("B200", 180),
        Accelerator("MI300X", 192),
    )
}

_ALIASES: dict[str, str] = {
    "NVIDIA-TESLA-K80": "K80",
    "NVIDIA-TESLA-T4": "T4",
    "NVIDIA-TESLA-V100": "V100",
    "NVIDIA-TESLA-A100": "A100",
    "NVIDIA-A100-80GB": "A100-80GB",
    "A100_80GB": "A100-80GB",
    "A100-80G": "A100-80GB",
    "NVIDIA-L4": "L4",
    "NVIDIA-H100-80GB": "H100",
    "NVIDIA-H100-MEGA-80GB": "H100-MEGA",
    "NVIDIA-H200-141GB": "H200",
    "NVIDIA-B200": "B200",
}


def canonical(name: str) -> str:
    """The canonical spelling of an accelerator name (case-insensitive; aliases resolved)."""
    upper = name.strip().upper().replace(" ", "-")
    if upper in _ALIASES:
        return _ALIASES[upper]
    for known in ACCELERATORS:
        if known.upper() == upper:
            return known
    return upper


def memory_gib(name: str) -> int:
    """Per-GPU memory of a canonical accelerator, 0 when unknown."""
    acc = ACCELERATORS.get(name)
    return acc.memory_gib if acc else 0
