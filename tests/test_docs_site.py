"""The documentation site's generated references keep up with the code: every setting, CLI command and option, API
route, job spec field, agent protocol name, import rule and benchmark script has its entry, built in-process by
docsgen/ exactly as `make docs` builds it. The strict build itself (broken links, missing pages and bad anchors
fail it) is `make docs`, which `.ci/run` runs before the tests: about 10 s of CPU, 35-45 s on a loaded 2-core
machine, too slow for a test."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from docsgen import benchmarks
from docsgen.api_ref import api_markdown, build_app, served_routes
from docsgen.architecture import architecture_markdown, load_layering
from docsgen.cli_ref import cli_markdown, command_docs, root_command
from docsgen.jobspec_ref import job_schema, jobspec_markdown
from docsgen.markdown import cell
from docsgen.protocol_ref import protocol_markdown
from docsgen.settings_ref import settings_markdown

ROOT = Path(__file__).resolve().parent.parent


def undescribed_fields(model: Any) -> list[str]:
    """Fields of a pydantic model without a description (the settings reference would say nothing of them)."""
    return [name for name, field in model.model_fields.items() if not (field.description or "").strip()]


def settings_missing_from(markdown: str, model: Any) -> list[str]:
    """Settings whose environment variable has no row, with its description, in the reference."""
    missing = []
    for name, field in model.model_fields.items():
        env = f"OVERSPILL_{name.upper()}"
        row = next((line for line in markdown.splitlines() if line.startswith(f"| `{env}` |")), None)
        words = (field.description or "").split()[:3]
        if row is None or (words and cell(" ".join(words)) not in row):
            missing.append(env)
    return missing


def commands_of(cmd: Any, path: tuple[str, ...] = ("overspill",)) -> list[tuple[str, list[str]]]:
    """(command path, its option names) of every visible command, walked independently of docsgen."""
    if getattr(cmd, "hidden", False):
        return []
    visible = [p for p in cmd.params if not getattr(p, "hidden", False)]
    opts = [o for p in visible for o in getattr(p, "opts", []) if o.startswith("-")]
    opts = [o for o in opts if o not in ("--install-completion", "--show-completion")]
    found = [(" ".join(path), opts)]
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        found += commands_of(sub, (*path, name))
    return found


def commands_missing_from(markdown: str, commands: list[tuple[str, list[str]]]) -> list[str]:
    missing = []
    for path, opts in commands:
        section = re.search(rf"^#+ {re.escape(path)}\n(.*?)(?=^#+ overspill|\Z)", markdown, re.M | re.S)
        if section is None:
            missing.append(path)
            continue
        missing += [f"{path} {o}" for o in opts if f"`{o}" not in section.group(1) and f" {o}`" not in section.group(1)]
    return missing


@pytest.fixture(scope="module")
def app() -> Any:
    return build_app()


@pytest.fixture(scope="module")
def api_page(app: Any) -> str:
    return api_markdown(app)


def test_every_setting_has_a_description() -> None:
    from broker.config.settings import Settings

    assert undescribed_fields(Settings) == []


def test_a_setting_without_a_description_is_caught() -> None:
    from pydantic import Field

    from broker.config.settings import Settings

    class Planted(Settings):
        undocumented_knob: int = 3
        documented_knob: int = Field(default=4, description="says what it does")

    assert undescribed_fields(Planted) == ["undocumented_knob"]


def test_every_setting_is_in_the_settings_reference() -> None:
    from broker.config.settings import Settings

    page = settings_markdown()
    assert settings_missing_from(page, Settings) == []
    assert len(Settings.model_fields) > 100 and f"reads {len(Settings.model_fields)} settings" in page


def test_a_setting_left_out_of_the_reference_is_caught() -> None:
    from broker.config.settings import Settings

    page = settings_markdown()
    without = "\n".join(line for line in page.splitlines() if "`OVERSPILL_TICK_INTERVAL_SECONDS`" not in line)
    assert settings_missing_from(without, Settings) == ["OVERSPILL_TICK_INTERVAL_SECONDS"]


def test_every_cli_command_and_option_is_in_the_cli_reference() -> None:
    commands = commands_of(root_command())
    page = cli_markdown()
    assert {"overspill submit", "overspill keys create", "overspill costs import-bill"} <= {c for c, _ in commands}
    assert commands_missing_from(page, commands) == []
    assert [d.path for d in command_docs()] == [c for c, _ in commands]


def test_a_cli_command_left_out_of_the_reference_is_caught() -> None:
    page = cli_markdown()
    planted = [*commands_of(root_command()), ("overspill frobnicate", ["--hard"])]
    assert commands_missing_from(page, planted) == ["overspill frobnicate"]
    cut = page.replace("`--max-total-usd`", "`--elided`")
    assert "overspill update --max-total-usd" in commands_missing_from(cut, commands_of(root_command()))


def test_every_api_route_is_in_the_api_reference(app: Any, api_page: str) -> None:
    document = app.openapi()
    operations = [
        (method.upper(), path)
        for path, ops in document["paths"].items()
        for method in ops
        if method in ("get", "post", "put", "patch", "delete")
    ]
    assert ("POST", "/v1/jobs") in operations and len(operations) > 30
    missing = [f"{m} {p}" for m, p in operations if f"\n### {m} {p}\n" not in api_page]
    assert missing == []
    for ops in document["paths"].values():
        for op in ops.values():
            if isinstance(op, dict) and op.get("operationId"):
                assert f"`{op['operationId']}`" in api_page
    outside = [p for p, _, _ in served_routes(app) if p not in document["paths"]]
    assert "/console/" in outside
    assert [p for p in outside if f"| `{p}` |" not in api_page] == []


def test_every_schema_the_api_names_is_described(app: Any, api_page: str) -> None:
    names = app.openapi()["components"]["schemas"]
    assert [n for n in names if f"\n### {n}\n" not in api_page] == []


def test_every_job_spec_field_is_in_the_job_spec_reference() -> None:
    schema = job_schema()
    page = jobspec_markdown()
    fields = list(schema["properties"])
    assert {"max_total_usd", "gpu_count", "secrets"} <= set(fields)
    assert [f for f in fields if f"| `{f}` |" not in page] == []
    for name, sub in schema.get("$defs", {}).items():
        assert f"\n## {name}\n" in page
        assert [f for f in sub.get("properties", {}) if f"| `{f}` |" not in page] == []


def test_every_public_name_of_the_agent_protocol_is_in_its_reference() -> None:
    import agent.protocol as protocol

    page = protocol_markdown()
    public = [
        n
        for n, v in vars(protocol).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == protocol.__name__
    ]
    assert {"AttemptSpec", "Report", "mailbox_entry_name"} <= set(public)
    assert [n for n in public if f"## {n}" not in page] == []
    constants = [n for n, v in vars(protocol).items() if n.isupper() and isinstance(v, str | int)]
    assert [n for n in constants if f"| `{n}` |" not in page] == []
    assert [f for f in protocol.AttemptSpec.__dataclass_fields__ if f"| `{f}` |" not in page] == []


def test_the_architecture_page_states_every_import_rule() -> None:
    rules = load_layering()
    page = architecture_markdown()
    assert rules.__doc__ and rules.__doc__.strip().splitlines()[0] in page
    for package, (forbidden, allowed) in rules.RULES.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{package}` |"))
        assert all(f"`{f}`" in row for f in (*forbidden, *allowed))
    assert "### broker.store" in page and "### providers.slurm" in page


def test_every_benchmark_script_has_a_page_and_every_result_a_plot() -> None:
    on_disk = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))
    assert benchmarks.scripts() == on_disk
    index = benchmarks.index_markdown()
    for name in on_disk:
        assert f"({name}.md)" in index
        page = benchmarks.page_markdown(name)
        assert page.startswith(f"# {name}.py\n") and "## Method" in page and "## Latest figures" in page
    results = sorted(p.stem for p in benchmarks.RESULTS_DIR.glob("*.json"))
    assert results, "at least one benchmark result is committed"
    for name in results:
        assert name in on_disk, f"benchmarks/results/{name}.json belongs to no script"
        res = benchmarks.result(name)
        assert res is not None and {"command", "measured", "machine", "result"} <= set(res)
        png = benchmarks.plot_png(name, res["result"])
        assert png is not None and png.startswith(b"\x89PNG"), name
        assert f"![{name}](img/{name}.png)" in benchmarks.page_markdown(name, has_plot=True)
