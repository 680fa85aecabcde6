"""Where the shared real-world data lives (`../shared/data` or OVERSPILL_SHARED_DATA) for tests that read it.

Tests using it are marked `integration`: absent data skips them with the reason locally, and fails CI.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path | None:
    given = os.environ.get("OVERSPILL_SHARED_DATA")
    path = Path(given) if given else ROOT.parent / "shared" / "data"
    return path if path.is_dir() else None


def shared_file(relative: str) -> Path:
    """The path of a shared data file, or skip the test saying which file is missing."""
    base = shared_data_dir()
    if base is None:
        pytest.skip("shared data folder not found (set OVERSPILL_SHARED_DATA or put it at ../shared/data)")
    path = base / relative
    if not path.exists():
        pytest.skip(f"shared data file missing: {path}")
    return path
