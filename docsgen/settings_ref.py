"""The settings reference: every field of `broker.config.settings.Settings`, the one declaration of the broker's
configuration, as its environment variable, type, default and description."""

from __future__ import annotations

import enum
import json
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePath
from typing import Any

from docsgen.markdown import GENERATED_NOTE, cell, code, table

ENV_PREFIX = "OVERSPILL_"

# groups of settings, by the first word(s) of the field name; the rest are "General"
GROUPS: tuple[tuple[str, str], ...] = (
    ("Database and server", r"^(database|data_dir|host|port|env|broker_id|bootstrap|forwarded|max_request|serverless)"),
    ("Simulated market and on-prem", r"^(simulated|seed|onprem)"),
    ("Control loop", r"^(tick|shard|loop|accrual|max_placements|orphan)"),
    ("Prices and risk", r"^(price|interruption|catalog)"),
    ("AWS", r"^aws_"),
    ("GCP", r"^(gcp_|gcs_)"),
    ("Azure", r"^azure_"),
    ("libcloud (private clouds)", r"^libcloud_"),
    ("Slurm", r"^slurm"),
    ("Bursting out of Slurm", r"^burst_"),
    ("Placement policy", r"^(checkpoint_interval|restart|deadline_policy|wait_value|return_|move_)"),
    ("Instance agent", r"^(agent_|public_url|callback_secret)"),
    ("Checkpoints and stores", r"^(checkpoint_|tenant_checkpoint|s3_|onprem_egress)"),
    ("Secrets", r"^tenant_secret"),
    ("Costs, budgets and reports", r"^(smtp_|report|bill_|webhook|delivery|disk_|public_ipv4)"),
    ("Rate limits and authentication", r"^(rate_limit|key_hash)"),
    ("Cloud calls", r"^cloud_"),
    ("Observability", r"^(log_|metrics|tick_metrics)"),
    ("Secrets from AWS Secrets Manager", r"_arn$"),
)


@dataclass(frozen=True)
class SettingDoc:
    name: str
    env: str
    type: str
    default: str
    description: str
    group: str


def type_name(annotation: Any) -> str:
    """A readable type: `str`, `int | None`, `list[str]`, `"cli" | "rest"`..."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def default_text(field: Any) -> str:
    """The default as the environment would spell it (JSON for lists and maps), or 'required'."""
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    value = _jsonable(value)
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value)


def _group(name: str) -> str:
    if name.endswith("_arn"):
        return "Secrets from AWS Secrets Manager"
    for title, pattern in GROUPS:
        if re.search(pattern, name):
            return title
    return "General"


def setting_docs() -> Iterator[SettingDoc]:
    """One entry per Settings field, in declaration order."""
    from broker.config.settings import Settings

    for name, field in Settings.model_fields.items():
        yield SettingDoc(
            name=name,
            env=ENV_PREFIX + name.upper(),
            type=type_name(field.annotation),
            default=default_text(field),
            description=(field.description or "").strip(),
            group=_group(name),
        )


def settings_markdown() -> str:
    docs = list(setting_docs())
    groups: dict[str, list[SettingDoc]] = {}
    for title, _ in GROUPS:
        groups[title] = []
    groups["General"] = []
    for d in docs:
        groups[d.group].append(d)
    out = [
        "# Settings\n",
        GENERATED_NOTE.format(source="`broker/config/settings.py`, class `Settings`"),
        f"The broker reads {len(docs)} settings from the environment, each `{ENV_PREFIX}<NAME>` (case-insensitive). "
        "All are optional. Lists and maps are JSON (`OVERSPILL_AWS_REGIONS='[\"us-east-1\"]'`). Settings are read "
        "once when a process starts; a malformed value stops start-up with an error naming the variable. "
        "Secrets (keys, passwords, tokens) are never shown in `repr` or logs, and may come from AWS Secrets Manager "
        "(`OVERSPILL_<NAME>_ARN`, last group). To add a setting, see "
        "[Adding a setting](../development/add-a-setting.md).\n",
    ]
    for title, items in groups.items():
        if not items:
            continue
        out.append(f"## {title}\n")
        rows = [(code(d.env), code(d.type), code(d.default), cell(d.description)) for d in items]
        out.append(table(("variable", "type", "default", "meaning"), rows))
    return "\n".join(out)
