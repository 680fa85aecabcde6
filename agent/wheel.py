"""Build the agent's wheel: the `agent` package's Python files in a pure-Python, dependency-free wheel.

Instances run it without installing anything (`PYTHONPATH=agent.whl python3 -m agent run ...`: a wheel is a zip,
and Python imports packages from zips), so they need no package index. The build is reproducible (sorted entries,
fixed timestamps): the same sources give the same bytes and SHA-256, which the broker can pin in start-up scripts.
Needs Python 3.8 or newer on the instance (see `agent/__init__.py`).
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from agent.protocol import PROTOCOL_VERSION

NAME = "overspill_agent"
VERSION = f"{PROTOCOL_VERSION}.0.0"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_files(package_dir: Path | None = None) -> dict[str, bytes]:
    """Archive name -> content of every file that goes into the wheel, RECORD excepted."""
    root = package_dir or Path(__file__).resolve().parent
    files = {f"agent/{path.name}": path.read_bytes() for path in sorted(root.glob("*.py"))}
    dist = f"{NAME}-{VERSION}.dist-info"
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: overspill-agent\nVersion: {VERSION}\n"
        "Summary: Overspill instance agent (standard library only)\nRequires-Python: >=3.8\n"
    ).encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: overspill\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return files


def build_wheel(out_dir: Path) -> tuple[Path, str]:
    """Write the wheel into `out_dir`; its path and SHA-256 (hex)."""
    files = wheel_files()
    dist = f"{NAME}-{VERSION}.dist-info"
    record = "".join(f"{name},{_digest(data)},{len(data)}\n" for name, data in sorted(files.items()))
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as whl:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, data)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()
