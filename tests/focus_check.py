"""Runs the official FOCUS validator (PyPI `focus-validator` 2.x) on a file, offline, in its own environment.

focus-validator 2.x needs Python >= 3.12 and pins numpy<2, so `.ci/run` installs it into `.ci/focus-venv`
(override with OVERSPILL_FOCUS_VALIDATOR). It validates against the FOCUS 1.2 model bundled in the package
(`--block-download`), and reads its currency list relative to its package folder, hence the working directory.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def validator() -> Path | None:
    path = Path(os.environ.get("OVERSPILL_FOCUS_VALIDATOR") or ROOT / ".ci/focus-venv/bin/focus-validator")
    return path if path.exists() else None


def validate(data_file: Path, version: str = "1.2") -> tuple[set[str], set[str], str]:
    """(failed rule ids, passed rule ids, full output)."""
    exe = validator()
    assert exe is not None
    python = exe.parent / "python"
    site = subprocess.run(
        [
            str(python),
            "-c",
            "import focus_validator, os; print(os.path.dirname(os.path.dirname(focus_validator.__file__)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    done = subprocess.run(
        [
            str(exe),
            "--data-file",
            str(data_file),
            "--validate-version",
            version,
            "--block-download",
            "--rule-set-path",
            "focus_validator/rules",
        ],
        cwd=site,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    failed = set(re.findall(r"^\S+ ([A-Za-z]+-[A-Z]-\d{3}-[A-Z]): FAIL", out, re.M))
    passed = set(re.findall(r"^\S+ ([A-Za-z]+-[A-Z]-\d{3}-[A-Z]): PASS", out, re.M))
    return failed, passed, out
