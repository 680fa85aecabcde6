"""The job spec reference: the fields of `broker.api.schemas.JobCreate` (what `POST /v1/jobs` and `overspill submit
FILE` take), from its JSON schema: type, required, default, limits and description, nested types included."""

from __future__ import annotations

import json
from typing import Any

from docsgen.api_ref import schema_name
from docsgen.markdown import GENERATED_NOTE, cell, code, table

LIMITS = (
    ("minLength", "length >= {}"),
    ("maxLength", "length <= {}"),
    ("minItems", "items >= {}"),
    ("maxItems", "items <= {}"),
    ("minimum", ">= {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "<= {}"),
    ("exclusiveMaximum", "< {}"),
    ("pattern", "matches `{}`"),
    ("maxProperties", "entries <= {}"),
)


def job_schema() -> dict[str, Any]:
    from broker.api.schemas import JobCreate

    return JobCreate.model_json_schema()


def _limits(schema: dict[str, Any]) -> list[str]:
    found = []
    for s in [schema, *schema.get("anyOf", []), schema.get("items") or {}]:
        for key, fmt in LIMITS:
            if key in s:
                text = fmt.format(s[key])
                if s is schema.get("items"):
                    text = "each: " + text
                found.append(text)
    return found


def _fields_table(schema: dict[str, Any]) -> str:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    rows = []
    for name, s in props.items():
        default = "required" if name in required else (json.dumps(s["default"]) if "default" in s else "")
        notes = [" ".join(s.get("description", "").split())]
        limits = _limits(s)
        if limits:
            notes.append("(" + "; ".join(limits) + ")")
        if s.get("examples"):
            notes.append("e.g. " + ", ".join(f"`{json.dumps(e)}`" for e in s["examples"][:2]))
        rows.append(
            (code(name), code(schema_name(s)), code(default) if default else "", cell(" ".join(n for n in notes if n)))
        )
    return table(("field", "type", "default", "meaning"), rows)


def jobspec_markdown() -> str:
    schema = job_schema()
    out = [
        "# Job spec\n",
        GENERATED_NOTE.format(source="`broker.api.schemas.JobCreate`"),
        f"{schema.get('description', '')} The body of `POST /v1/jobs` and of `POST /v1/quotes`, and the file "
        "`overspill submit FILE` reads (YAML or JSON, at most 1 MB, no YAML aliases). Unknown fields are refused "
        '(422 naming the field). Money is a decimal string or number (`"40"`, `"0.55"`), never a float in the '
        "ledger. What each field means for the workload, with examples: [Jobs](../concepts/jobs.md).\n",
        "## JobCreate\n",
        _fields_table(schema),
    ]
    for name, sub in sorted((schema.get("$defs") or {}).items()):
        out.append(f"## {name}\n")
        if sub.get("description"):
            out.append(" ".join(sub["description"].split()) + "\n")
        if sub.get("properties"):
            out.append(_fields_table(sub))
        elif "enum" in sub:
            out.append("One of: " + ", ".join(code(e) for e in sub["enum"]) + "\n")
    return "\n".join(out)
