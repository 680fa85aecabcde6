"""The agent protocol reference, from `agent/protocol.py` (the one module the broker, the agent and the tests share):
its module docstring, constants, enums, dataclasses with their fields (type, default, the comment on the field's
line) and functions, in source order."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from docsgen.markdown import GENERATED_NOTE, ROOT, cell, code, prose, table

SOURCE = ROOT / "agent" / "protocol.py"


def _comment(lines: list[str], lineno: int) -> str:
    line = lines[lineno - 1]
    # a trailing comment outside any string literal: the last " # " on the line
    idx = line.rfind("  # ")
    return line[idx + 4 :].strip() if idx >= 0 else ""


def _doc(node: ast.AST) -> str:
    text = ast.get_docstring(node) or ""  # type: ignore[arg-type]
    return prose(inspect.cleandoc(text))


def protocol_markdown(path: Path = SOURCE) -> str:
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    out = [
        "# Agent protocol\n",
        GENERATED_NOTE.format(source="`agent/protocol.py`"),
        _doc(tree) + "\n",
    ]
    constants = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper() and isinstance(node.value, ast.Constant):
                constants.append((code(name), code(repr(node.value.value)), cell(_comment(lines, node.lineno))))
    if constants:
        out.append("## Constants\n")
        out.append(table(("name", "value", "note"), constants))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            kind = "enum" if any("Enum" in b for b in bases) else "error" if any("Error" in b for b in bases) else ""
            out.append(f"## {node.name}\n")
            if _doc(node):
                out.append(_doc(node) + "\n")
            rows = []
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    default = ast.unparse(item.value) if item.value is not None else ""
                    if default.startswith("field(default_factory="):
                        default = default[len("field(default_factory=") : -1] + "()"
                    rows.append(
                        (
                            code(item.target.id),
                            code(ast.unparse(item.annotation)),
                            code(default) if default else "required",
                            cell(_comment(lines, item.lineno)),
                        )
                    )
                elif kind == "enum" and isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                    rows.append((code(ast.literal_eval(item.value)), cell(_comment(lines, item.lineno))))
            if rows and kind == "enum":
                out.append(table(("value", "note"), rows))
            elif rows:
                out.append(table(("field", "type", "default", "note"), rows))
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef) and not m.name.startswith("_")]
            for m in methods:
                if _doc(m):
                    out.append(f"- `{node.name}.{m.name}({ast.unparse(m.args)})`: {' '.join(_doc(m).split())}")
            if methods:
                out.append("")
        elif isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out.append(f"## {node.name}()\n")
            out.append(
                f"```python\ndef {node.name}({ast.unparse(node.args)})"
                + (f" -> {ast.unparse(node.returns)}" if node.returns else "")
                + "\n```\n"
            )
            if _doc(node):
                out.append(_doc(node) + "\n")
    return "\n".join(out)
