"""The import rules of the developers' guide, enforced on the source tree by an AST walk (every import statement,
top level or inside a function, is seen).

- `providers/` never imports `federation/` or `broker/`: a provider yields domain types (`providers.model`) and is
  handed whatever policy it needs (the Slurm provider gets its queue model injected).
- `federation/` is pure: from `providers/` it reads only the domain vocabulary (`providers.model`,
  `providers.accelerators`), never `broker/`, and no SDK, database or HTTP library.
- `pricing/` never imports `broker/` or `federation/`.
- `agent/` imports nothing of the broker's packages (it ships alone, as a wheel).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

IO_LIBRARIES = (
    "sqlalchemy",
    "sqlmodel",
    "fastapi",
    "starlette",
    "boto3",
    "botocore",
    "httpx",
    "requests",
    "urllib3",
    "google",
    "azure",
    "libcloud",
    "psycopg",
    "psycopg2",
    "subprocess",
    "socket",
)

# package -> (forbidden module prefixes, allowed exceptions among them)
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "providers": (("federation", "broker"), ()),
    "federation": (("broker", "providers", *IO_LIBRARIES), ("providers.model", "providers.accelerators")),
    "pricing": (("broker", "federation"), ()),
    "agent": (("broker", "federation", "providers", "pricing"), ()),
}


def imported_modules(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, the file of module `module` (relative imports
    resolved; `from a import b` yields `a.b` too, since `b` may be a module)."""
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(package: str, source: str, module: str) -> list[str]:
    forbidden, allowed = RULES[package]
    out = []
    for line, name in imported_modules(source, module):
        if any(_matches(name, a) for a in allowed) or any(_matches(name.rsplit(".", 1)[0], a) for a in allowed):
            continue
        if any(_matches(name, f) for f in forbidden):
            out.append(f"{module}:{line} imports {name}")
    return sorted(set(out))


def _modules(package: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        yield ".".join(rel.parts), path


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_respects_its_import_rule(package: str) -> None:
    found: list[str] = []
    checked = 0
    for module, path in _modules(package):
        found += violations(package, path.read_text(), module)
        checked += 1
    assert checked > 3, f"no sources found under {package}/"
    assert found == []


def test_the_rule_catches_what_it_forbids() -> None:
    """The checker itself: each kind of forbidden import is reported, allowed ones are not."""
    src = (
        "from federation.pressure import QueueModel\n"
        "def f():\n    import broker.store.tables\n"
        "from . import slurm_json\n"
        "from providers.model import BatchJob\n"
    )
    assert violations("providers", src, "providers.slurm.provider") == [
        "providers.slurm.provider:1 imports federation.pressure",
        "providers.slurm.provider:1 imports federation.pressure.QueueModel",
        "providers.slurm.provider:3 imports broker.store.tables",
    ]
    fed = "from providers.slurm.json_api import SlurmJob\nfrom providers.model import BatchJob\nimport sqlalchemy.orm\n"
    assert violations("federation", fed, "federation.pressure") == [
        "federation.pressure:1 imports providers.slurm.json_api",
        "federation.pressure:1 imports providers.slurm.json_api.SlurmJob",
        "federation.pressure:3 imports sqlalchemy.orm",
    ]
    assert violations("federation", "from ..providers import slurm\n", "federation.simulate.x") == []
    assert violations("agent", "from broker.app import app\n", "agent.main") == [
        "agent.main:1 imports broker.app",
        "agent.main:1 imports broker.app.app",
    ]
