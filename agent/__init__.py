"""The instance agent: the program each instance runs for one job attempt (see `agent.protocol`).

It imports nothing from `broker`, `providers`, `pricing` or `federation` and only the standard library, so the
broker can publish it as a small wheel that instances run without a package index.

It runs on Python 3.8 or newer, unlike the rest of the project (3.11): it runs on the instance's system Python, and
cloud GPU images ship old ones (Ubuntu 20.04 3.8; Amazon Linux 2023, Debian 11 and GCP Deep Learning VM images 3.9;
Ubuntu 22.04 3.10). So inside `agent/`: `from __future__ import annotations` in every module (`X | None`,
`list[int]` only in annotations), the 3.9+/3.11+ standard-library pieces through `agent.compat` (`StrEnum`, `UTC`,
`parse_iso8601`, `remove_prefix`, `md5`), no `dataclass(slots=True)`, tuples in `isinstance`, no `match`, no
`zip(strict=)`, no `dict | dict`. Ruff lints `agent/` for py38 (pyproject.toml), and tests/test_agent_pythons.py
runs the built wheel under each of 3.8, 3.9 and 3.10 it finds.
"""
