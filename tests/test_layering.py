"""The import rules of the developers' guide, enforced on the source tree by an AST walk (every import statement,
top level or inside a function, is seen).

- `providers/` never imports `federation/` or `broker/`: a provider yields domain types (`providers.model`) and is
  handed whatever policy it needs (the Slurm provider gets its queue model injected).
- `federation/` is pure: from `providers/` it reads only the domain vocabulary (`providers.model`,
  `providers.accelerators`), never `broker/`, and no SDK, database or HTTP library.
- `pricing/` never imports `broker/` or `federation/`.
- `agent/` imports nothing of the broker's packages (it ships alone, as a wheel).
- Inside `broker/`, the lower rooms never reach up: `broker.store` and `broker.config` know no route, loop step,
  service or CLI; `broker.market` and `broker.observe` no route, loop step or CLI; `overspill` (the public client)
  nothing of the broker (the constants both share live in `overspill.defaults`).
- No import circle anywhere in the product code, counting imports inside functions and under `TYPE_CHECKING`
  (a circle is a design knot, whether or not Python happens to resolve it).
- At most 8 modules stay loose at `broker/`'s top: everything else lives in a room.

This docstring and `RULES` below are the one statement of these rules; the documentation site's architecture page
is generated from them.
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

# the broker's rooms that sit above the store, the configuration, the market and the metrics
_UPPER_ROOMS = ("broker.api", "broker.loop", "broker.services", "broker.cli", "broker.app")

# package -> (forbidden module prefixes, allowed exceptions among them)
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "providers": (("federation", "broker"), ()),
    "federation": (("broker", "providers", *IO_LIBRARIES), ("providers.model", "providers.accelerators")),
    "pricing": (("broker", "federation"), ()),
    "agent": (("broker", "federation", "providers", "pricing", "overspill"), ()),
    "broker.store": (
        ("broker.api", "broker.loop", "broker.services", "broker.cli", "broker.finance", "broker.app"),
        (),
    ),
    "broker.config": (
        ("broker.api", "broker.loop", "broker.services", "broker.cli", "broker.app", "broker.runtime"),
        ("broker.finance.reports.paths", "broker.finance.outbound"),
    ),
    "broker.market": (("broker.api", "broker.loop", "broker.services", "broker.cli", "broker.app"), ()),
    "broker.observe": (
        ("broker.api", "broker.loop", "broker.services", "broker.cli", "broker.app", "broker.runtime"),
        (),
    ),
    "overspill": (("broker", "federation", "providers", "pricing", "agent"), ()),
}
PRODUCT = ("agent", "providers", "pricing", "federation", "broker", "overspill")
MAX_BROKER_TOP_MODULES = 8


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
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
        yield ".".join(parts), path


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the product modules it imports (every import statement; `from a import b` counts as `a.b` when
    `a.b` is a module, else as `a`)."""
    graph: dict[str, set[str]] = {m: set() for m in sources}

    def resolve(name: str) -> str | None:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    for module, source in sources.items():
        for _line, name in imported_modules(source, module):
            target = resolve(name)
            if target and target != module:
                graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _product_sources() -> dict[str, str]:
    out: dict[str, str] = {}
    for package in PRODUCT:
        for module, path in _modules(package):
            if "migrations" not in path.parts:
                out[module] = path.read_text()
    return out


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_respects_its_import_rule(package: str) -> None:
    found: list[str] = []
    checked = 0
    for module, path in _modules(package):
        found += violations(package, path.read_text(), module)
        checked += 1
    assert checked >= 1, f"no sources found under {package}/"
    assert found == []


def test_the_product_has_no_import_circle() -> None:
    sources = _product_sources()
    assert len(sources) > 200
    assert circles(import_graph(sources)) == []


def test_a_planted_circle_is_found() -> None:
    sources = {
        "broker.config.settings": "from broker.finance.reports.deliver import parse_s3_prefix\n",
        "broker.finance.reports.deliver": "def f():\n    from broker.finance.notify import post\n",
        "broker.finance.notify": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from broker.config.settings import Settings\n",
        "broker.store.db": "import broker.config.settings\n",
    }
    assert circles(import_graph(sources)) == [
        ["broker.config.settings", "broker.finance.notify", "broker.finance.reports.deliver"]
    ]


def test_broker_keeps_its_modules_in_rooms() -> None:
    loose = sorted(p.name for p in (ROOT / "broker").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_BROKER_TOP_MODULES, f"broker/ has {len(loose)} loose modules: {loose}"
    for room in sorted(p for p in (ROOT / "broker").iterdir() if (p / "__init__.py").exists()):
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
        assert "May import" in doc or "may import" in doc, f"{room.name}/__init__.py does not say what it may import"


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
    assert violations("broker.store", "from broker.api.schemas import JobCreate\n", "broker.store.tables") == [
        "broker.store.tables:1 imports broker.api.schemas",
        "broker.store.tables:1 imports broker.api.schemas.JobCreate",
    ]
    assert violations("agent", "from broker.app import app\n", "agent.main") == [
        "agent.main:1 imports broker.app",
        "agent.main:1 imports broker.app.app",
    ]
