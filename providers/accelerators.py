"""Canonical accelerator names, in one place, with their memory and the aliases clouds and catalogs use.

Every layer speaks canonical names (`A100-80GB`, `H100`, ...). `canonical()` maps a provider's spelling onto
them; an unknown name is returned upper-cased so new hardware still flows through, unranked by memory.

`is_known(name)` says whether a canonical name is in either table; `nearest(name, among)` orders names by how
close their spelling is to `name` (for "unknown accelerator A10O; known: A100, A10, ...").

`ACCELERATORS` holds the GPUs the broker simulates and benchmarks; `OTHER_ACCELERATORS` older or niche hardware
seen in real catalogs (SkyPilot-format vms.csv of AWS, GCP, Azure, Lambda...), recognised and sized but not
simulated. Memory is per GPU, in the vendor's GB figure (H200 141, B200 180), as the catalogs' GpuInfo gives it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher


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
    "NVIDIA-A10": "A10",
    "NVIDIA-A10G": "A10G",
    "NVIDIA-L40S": "L40S",
    "NVIDIA-TESLA-P100": "P100",
    "NVIDIA-TESLA-P4": "P4",
    "A100-40GB": "A100",
    "A100-80GB-SXM": "A100-80GB",
    "H100-SXM": "H100",
    "H100-SXM5": "H100",
    "H100-PCIE": "H100",
    "H100-NVLINK": "H100",
    "H200-SXM": "H200",
    "RADEON-MI25": "MI25",
    "RADEON-PRO-V520": "V520",
    "GAUDI-HL-205": "GAUDI",
    "HL-205": "GAUDI",
    "RTXA6000": "A6000",
    "RTX-A6000": "A6000",
    "RTX6000ADA": "RTX6000-ADA",
}

# Hardware seen in real catalogs that the simulator and the synthetic benchmarks do not model.
OTHER_ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("P4", 8),
        Accelerator("P100", 16),
        Accelerator("M60", 8),
        Accelerator("MI25", 16),
        Accelerator("V520", 8),
        Accelerator("T4G", 16),
        Accelerator("A30", 24),
        Accelerator("A40", 48),
        Accelerator("L40", 48),
        Accelerator("A6000", 48),
        Accelerator("RTX6000", 24),
        Accelerator("RTX6000-ADA", 48),
        Accelerator("A800", 80),
        Accelerator("H100-NVL", 94),
        Accelerator("GH200", 96),
        Accelerator("B300", 288),
        Accelerator("GAUDI", 32),
    )
}

_KNOWN: dict[str, Accelerator] = {**ACCELERATORS, **OTHER_ACCELERATORS}
_BY_UPPER: dict[str, str] = {**{name.upper(): name for name in _KNOWN}, **_ALIASES}


def canonical(name: str) -> str:
    """The canonical spelling of an accelerator name (case-insensitive; aliases resolved)."""
    upper = name.strip().upper().replace(" ", "-")
    return _BY_UPPER.get(upper, upper)


def memory_gib(name: str) -> int:
    """Per-GPU memory of a canonical accelerator, 0 when unknown."""
    acc = _KNOWN.get(name)
    return acc.memory_gib if acc else 0


def is_known(name: str) -> bool:
    """Whether a canonical accelerator name is one of the tables' (an alias counts once made canonical)."""
    return name in _KNOWN


def known_names() -> list[str]:
    """Every canonical name of the tables."""
    return list(_KNOWN)


def _folded(name: str) -> str:
    return name.upper().replace("O", "0").replace("I", "1")


def nearest(name: str, among: Iterable[str], n: int = 5) -> list[str]:
    """At most `n` names of `among`, the closest in spelling to `name` first (case-insensitive similarity, with the
    letters typed for look-alike digits, O for 0 and I for 1, counted as those digits; ties by length, then name).
    Deterministic; never empty when `among` is not."""
    target = _folded(name)

    def closeness(candidate: str) -> tuple[float, int, str]:
        ratio = SequenceMatcher(None, target, _folded(candidate)).ratio()
        return (-ratio, abs(len(candidate) - len(target)), candidate)

    return sorted(set(among), key=closeness)[:n]
