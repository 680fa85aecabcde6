"""MkDocs hooks (mkdocs.yml `hooks:`): add the pages generated from the code, so `mkdocs build` alone builds the
whole site.

- on_config: the Benchmarks section of the nav gets one page per script in `benchmarks/`;
- on_files: the reference pages (API, CLI, settings, job spec, agent protocol), the architecture page, the
  benchmark index and pages without notes, and the benchmark plots (PNG) join the site's files;
- on_page_markdown: each benchmark page is its generated part (method, latest figures, plot) followed by the notes
  written in `docs/benchmarks/<name>.md`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # mkdocs imports this file by path; the generators import the project
    sys.path.insert(0, str(ROOT))

from mkdocs.structure.files import File, Files  # noqa: E402

from docsgen import benchmarks  # noqa: E402
from docsgen.api_ref import api_markdown  # noqa: E402
from docsgen.architecture import architecture_markdown  # noqa: E402
from docsgen.cli_ref import cli_markdown  # noqa: E402
from docsgen.jobspec_ref import jobspec_markdown  # noqa: E402
from docsgen.protocol_ref import protocol_markdown  # noqa: E402
from docsgen.settings_ref import settings_markdown  # noqa: E402

GENERATED: dict[str, Callable[[], str]] = {
    "reference/api.md": api_markdown,
    "reference/cli.md": cli_markdown,
    "reference/settings.md": settings_markdown,
    "reference/job-spec.md": jobspec_markdown,
    "reference/agent-protocol.md": protocol_markdown,
    "concepts/architecture.md": architecture_markdown,
    "benchmarks/index.md": benchmarks.index_markdown,
}
BENCH_SECTION = "Benchmarks"
_plotted: set[str] = set()


def on_config(config: Any) -> Any:
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and BENCH_SECTION in entry:
            children = [c for c in entry[BENCH_SECTION] if not (isinstance(c, dict) and "_scripts" in str(c))]
            children += [{f"{name}.py": f"benchmarks/{name}.md"} for name in benchmarks.scripts()]
            entry[BENCH_SECTION] = children
    return config


def _add(files: Files, config: Any, uri: str, content: str | bytes) -> None:
    old = files.get_file_from_path(uri)
    if old is not None:
        files.remove(old)
    files.append(File.generated(config, uri, content=content))


def on_files(files: Files, config: Any) -> Files:
    for uri, make in GENERATED.items():
        _add(files, config, uri, make())
    _plotted.clear()
    for name in benchmarks.scripts():
        uri = f"benchmarks/{name}.md"
        if files.get_file_from_path(uri) is None:
            _add(files, config, uri, "")
        res = benchmarks.result(name)
        png = benchmarks.plot_png(name, res["result"]) if res else None
        if png:
            _add(files, config, benchmarks.image_path(name), png)
            _plotted.add(name)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    uri = page.file.src_uri
    if uri.startswith("benchmarks/") and uri.count("/") == 1 and uri != "benchmarks/index.md":
        name = uri.removeprefix("benchmarks/").removesuffix(".md")
        if name in benchmarks.scripts():
            return benchmarks.page_markdown(name, notes=markdown, has_plot=name in _plotted)
    return markdown
