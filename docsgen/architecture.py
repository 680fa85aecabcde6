"""The architecture page: the packages and rooms of the product (each package's own docstring) and the import rules,
taken from `tests/test_layering.py` (its module docstring and `RULES`), the one place those rules are written."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType

from docsgen.markdown import GENERATED_NOTE, ROOT, cell, code, prose, table

LAYERING = ROOT / "tests" / "test_layering.py"
PACKAGES = ("agent", "providers", "pricing", "federation", "broker", "overspill")


def load_layering(path: Path = LAYERING) -> ModuleType:
    """tests/test_layering.py as a module of its own (not imported as `tests.…`, so pytest's conftest stays out)."""
    spec = importlib.util.spec_from_file_location("_overspill_layering_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package_doc(init: Path) -> str:
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    return inspect.cleandoc(doc)


def packages() -> list[tuple[str, str]]:
    """(dotted name, docstring) of each product package and each sub-package (room) one level down."""
    found = []
    for top in PACKAGES:
        init = ROOT / top / "__init__.py"
        if not init.exists():
            continue
        found.append((top, _package_doc(init)))
        for sub in sorted((ROOT / top).glob("*/__init__.py")):
            if sub.parent.name.startswith(("_", ".")) or sub.parent.name == "migrations":
                continue
            found.append((f"{top}.{sub.parent.name}", _package_doc(sub)))
    return found


def architecture_markdown() -> str:
    rules = load_layering()
    out = [
        "# Architecture\n",
        GENERATED_NOTE.format(source="`tests/test_layering.py` and each package's `__init__.py` docstring"),
        "## Layers\n",
        "Five packages ship in one distribution, in layers: the instance agent (`agent/`, standard library only) "
        "< provider adapters and the domain types (`providers/`) < prices (`pricing/`) < pure decisions "
        "(`federation/`) < the service (`broker/`), plus the public client (`overspill/`). The control loop "
        "is described in [The tick](tick.md).\n",
        "## Import rules\n",
        "Enforced by `tests/test_layering.py` on every test run (an AST walk over every import statement, "
        "including those inside functions):\n",
        prose(inspect.cleandoc(rules.__doc__ or "")) + "\n",
        "The rules as the test holds them (`RULES`): a module of the package on the left may not import a module "
        "under any forbidden prefix, except the listed exceptions.\n",
        table(
            ("package", "may not import", "except"),
            [
                (code(pkg), ", ".join(code(f) for f in forbidden), ", ".join(code(a) for a in allowed) or "")
                for pkg, (forbidden, allowed) in rules.RULES.items()
            ],
        ),
        f"At most {rules.MAX_BROKER_TOP_MODULES} modules stay at `broker/`'s top. The I/O libraries `federation/` may "
        "not use: " + ", ".join(code(m) for m in rules.IO_LIBRARIES) + ".\n",
        "## Packages and rooms\n",
        "Each package says its role, and what it may import, in its `__init__.py` docstring:\n",
    ]
    for name, doc in packages():
        out.append(f"### {name}\n")
        out.append((prose(doc) if doc else cell("(no docstring)")) + "\n")
    return "\n".join(out)
