"""The CLI reference: the `overspill` command tree walked from its own Typer/click objects (`broker.cli.main:app`),
every command with its usage line, help text, arguments and options, so the page follows the code."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from docsgen.markdown import GENERATED_NOTE, anchor, cell, code, table
from docsgen.settings_ref import type_name

PROG = "overspill"


@dataclass(frozen=True)
class ParamDoc:
    kind: str  # "argument" or "option"
    names: str  # "JOB_ID" or "--max-total-usd" (with secondary flags: "--json / --no-json")
    type: str
    default: str
    required: bool
    help: str
    envvar: str


@dataclass(frozen=True)
class CommandDoc:
    path: str  # "overspill keys create"
    usage: str
    help: str
    params: tuple[ParamDoc, ...]
    is_group: bool
    subcommands: tuple[str, ...]


def root_command() -> Any:
    import typer.main

    from broker.cli.main import app

    return typer.main.get_command(app)


def _param_type(p: Any) -> str:
    descriptor = getattr(p, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    if annotation is not None:
        return type_name(annotation)
    ptype = getattr(p, "type", None)
    return str(getattr(ptype, "name", ptype or "")) if ptype is not None else ""


def _default(p: Any) -> str:
    if getattr(p, "required", False):
        return ""
    value = getattr(p, "default", None)
    if callable(value) or value is None or value is inspect.Parameter.empty:
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) if value else ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _param(p: Any) -> ParamDoc:
    is_argument = "Argument" in type(p).__name__
    if is_argument:
        names = (getattr(p, "metavar", None) or p.name or "").upper()
    else:
        names = ", ".join(p.opts)
        if getattr(p, "secondary_opts", None):
            names += " / " + ", ".join(p.secondary_opts)
    envvar = getattr(p, "envvar", None) or ""
    if isinstance(envvar, list | tuple):
        envvar = ", ".join(envvar)
    return ParamDoc(
        kind="argument" if is_argument else "option",
        names=names,
        type="flag" if getattr(p, "is_flag", False) else _param_type(p),
        default=_default(p),
        required=bool(getattr(p, "required", False)),
        help=" ".join((getattr(p, "help", None) or "").split()),
        envvar=str(envvar),
    )


def _usage(cmd: Any, path: list[str], parent_ctx: Any) -> tuple[str, Any]:
    ctx = cmd.make_context(path[-1], [], parent=parent_ctx, resilient_parsing=True)
    pieces = cmd.collect_usage_pieces(ctx) if hasattr(cmd, "collect_usage_pieces") else ["[OPTIONS]"]
    return " ".join([*path, *pieces]), ctx


def command_docs() -> Iterator[CommandDoc]:
    """Every command and group under `overspill`, depth first, in the order the CLI lists them; hidden ones
    (and `--install-completion`-style options) left out."""
    root = root_command()

    def walk(cmd: Any, path: list[str], parent_ctx: Any) -> Iterator[CommandDoc]:
        if getattr(cmd, "hidden", False):
            return
        usage, ctx = _usage(cmd, path, parent_ctx)
        subs = getattr(cmd, "commands", None)
        names = tuple(n for n, c in (subs or {}).items() if not getattr(c, "hidden", False))
        params = tuple(
            _param(p)
            for p in cmd.params
            if not getattr(p, "hidden", False) and p.name not in ("install_completion", "show_completion")
        )
        yield CommandDoc(
            path=" ".join(path),
            usage=usage,
            help=inspect.cleandoc(cmd.help or ""),
            params=params,
            is_group=subs is not None,
            subcommands=names,
        )
        for name in names:
            yield from walk(subs[name], [*path, name], ctx)

    yield from walk(root, [PROG], None)


def cli_markdown() -> str:
    docs = list(command_docs())
    out = [
        "# CLI\n",
        GENERATED_NOTE.format(source="the `overspill` command tree, `broker/cli/main.py`"),
        "`overspill` is installed with the project (`.venv/bin/overspill`). User commands talk to the broker at "
        "`OVERSPILL_URL` with `OVERSPILL_API_KEY` and take `--json` for scripts; commands that open the database "
        "themselves print `database: <path>` on stderr. Every error is one line on stderr (`error: ...`); the exit "
        "code is 2 for what is the caller's to fix (a bad file or option, a 4xx answer), 1 for the rest. "
        "`overspill COMMAND --help` prints the same as this page.\n",
        "| command | what it does |\n|---|---|",
    ]
    for d in docs[1:]:
        first = d.help.split("\n\n")[0].replace("\n", " ")
        out.append(f"| [{code(d.path)}](#{anchor(d.path)}) | {cell(first)} |")
    out.append("")
    for d in docs:
        level = "#" * min(2 + d.path.count(" ") - 1, 4) if d.path != PROG else "##"
        out.append(f"{level} {d.path}\n")
        out.append(f"```\n{d.usage}\n```\n")
        if d.help:
            out.append(d.help + "\n")
        if d.subcommands:
            out.append("Commands: " + ", ".join(f"[`{n}`](#{anchor(d.path + ' ' + n)})" for n in d.subcommands) + "\n")
        if d.params:
            rows = [
                (
                    code(p.names),
                    code(p.type) if p.type else "",
                    "required" if p.required else (code(p.default) if p.default else ""),
                    cell(p.help) + (f" (env `{p.envvar}`)" if p.envvar else ""),
                )
                for p in d.params
            ]
            out.append(table(("argument / option", "type", "default", "meaning"), rows))
    return "\n".join(out)
