"""Benchmark pages: one per script in `benchmarks/`, with its method (the script's docstring), the latest figures
from its committed JSON result (`benchmarks/results/<name>.json`) with matplotlib plots drawn from them, and the
notes kept in `docs/benchmarks/<name>.md` (earlier figures quoted from the lab notebook; its history is in git).

A result file is `{"command": ..., "measured": ..., "machine": ..., "result": <the script's --json output>}`."""

from __future__ import annotations

import ast
import inspect
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from docsgen.markdown import ROOT, cell, code, prose, table

BENCH_DIR = ROOT / "benchmarks"
RESULTS_DIR = BENCH_DIR / "results"
MAX_FIGURE_ROWS = 80


def scripts() -> list[str]:
    """Names of the benchmark scripts (`tick_bench`, ...), sorted."""
    return sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.name.startswith("_"))


def docstring(name: str) -> str:
    return inspect.cleandoc(ast.get_docstring(ast.parse((BENCH_DIR / f"{name}.py").read_text())) or "")


def summary(name: str) -> str:
    return " ".join(docstring(name).split("\n\n")[0].split())


def result(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def flatten(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every scalar leaf; lists of scalars stay one value."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(data, list) and data and any(isinstance(v, dict | list) for v in data):
        for i, v in enumerate(data):
            yield from flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, data


# -- plots: one function per benchmark whose JSON has a natural picture; the rest get a generic bar chart ---------


def _bar(ax: Any, labels: list[str], values: list[float], unit: str) -> None:
    ax.barh(labels, values, color="#3f6fb5")
    ax.set_xlabel(unit)
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:g}", va="center", fontsize=8)


def _plot_latency_keys(data: Any, ax: Any) -> bool:
    """Generic: every leaf in milliseconds (`*_ms`), or else in seconds, as horizontal bars."""
    leaves = [(k, v) for k, v in flatten(data) if isinstance(v, int | float) and not isinstance(v, bool)]
    for suffix, unit in (("_ms", "milliseconds"), ("_s", "seconds"), ("seconds", "seconds")):
        chosen = [(k, float(v)) for k, v in leaves if k.endswith(suffix)][:24]
        if len(chosen) >= 2:
            _bar(ax, [k.removesuffix(suffix) for k, _ in chosen], [v for _, v in chosen], unit)
            return True
    return False


def _plot_slurm_tick(data: dict[str, Any], ax: Any) -> bool:
    labels, calls, mbytes = [], [], []
    for mode in ("with_tick_snapshot", "without_tick_snapshot"):
        for i, tick in enumerate(data.get(mode, {}).get("ticks", [])):
            labels.append(f"{mode.replace('_tick_snapshot', '')} #{i + 1}")
            calls.append(tick["total_calls"])
            mbytes.append(tick["mbytes"])
    if not labels:
        return False
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], calls, width=0.4, label="Slurm calls per tick")
    ax.bar([i + 0.2 for i in x], mbytes, width=0.4, label="MB read per tick")
    ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    ax.legend()
    return True


def _plot_placement(data: dict[str, Any], ax: Any) -> bool:
    place = data.get("place")
    if not place:
        return False
    rows = [(k, place[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms") if k in place]
    cpu = place.get("thread_cpu", {})
    labels = [k.removesuffix("_ms") for k, _ in rows]
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], [v for _, v in rows], width=0.4, label="place() wall")
    ax.bar([i + 0.2 for i in x], [cpu.get(k, 0) for k, _ in rows], width=0.4, label="place() thread CPU")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("milliseconds")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(f"{data.get('book_offerings', '?')} pools, {place.get('count', '?')} decisions", fontsize=9)
    return True


def _plot_decision(data: dict[str, Any], ax: Any) -> bool:
    policies = data.get("policies") or {}
    if not policies:
        return False
    names = list(policies)
    x = range(len(names))
    for offset, key in ((-0.2, "p50_ms"), (0.2, "p99_ms")):
        ax.bar([i + offset for i in x], [policies[n].get(key, 0) for n in names], width=0.4, label=key[:-3])
    ax.set_xticks(list(x), names)
    ax.set_ylabel("milliseconds per decision")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(f"{data.get('scenario', '')}, {data.get('jobs', '?')} jobs", fontsize=9)
    return True


def _plot_launch(data: Any, ax: Any) -> bool:
    if not isinstance(data, list) or not data:
        return False
    for run in data:
        ticks = run.get("ticks") or []
        for step in ("place_pending", "sync_instances"):
            ys = [t["steps"].get(step, {}).get("seconds", 0) for t in ticks]
            ax.plot(range(len(ys)), ys, marker="o", label=f"{run.get('cloud')}: {step}")
    ax.set_xlabel("tick")
    ax.set_xticks(range(max(len(run.get("ticks") or []) for run in data)))
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
    ax.set_title(
        f"{data[0].get('jobs', '?')} launches in flight, {data[0].get('op_seconds', '?')} s operations", fontsize=9
    )
    return True


def _plot_report(data: dict[str, Any], ax: Any) -> bool:
    formats = data.get("formats") or {}
    if not formats:
        return False
    names = list(formats)
    x = range(len(names))
    for offset, key in ((-0.2, "cold_seconds"), (0.2, "warm_seconds")):
        ax.bar([i + offset for i in x], [formats[n].get(key, 0) for n in names], width=0.4, label=key.split("_")[0])
    ax.set_xticks(list(x), names)
    ax.set_ylabel("seconds per report")
    ax.legend()
    ax.set_title(f"{data.get('entries', '?')} ledger entries on {data.get('database', '?')}", fontsize=9)
    return True


def _plot_tick(data: dict[str, Any], ax: Any) -> bool:
    rounds = data.get("rounds") or []
    if not rounds:
        return False
    ax.plot([r["round"] for r in rounds], [r["wall"] for r in rounds], marker="o", label="wall (slowest replica)")
    ax.plot(
        [r["round"] for r in rounds], [sum(r["cpu"]) for r in rounds], marker="s", label="broker CPU (all replicas)"
    )
    ax.set_xlabel("round (the first ones settle the shard shares)")
    ax.set_ylabel("seconds per tick")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title(
        f"{data.get('jobs', '?')} running jobs, {data.get('replicas', '?')} replica(s), {data.get('backend')}",
        fontsize=9,
    )
    return True


PLOTS: dict[str, Callable[[dict[str, Any], Any], bool]] = {
    "placement_bench": _plot_placement,
    "slurm_tick_bench": _plot_slurm_tick,
    "decision_bench": _plot_decision,
    "launch_bench": _plot_launch,
    "report_bench": _plot_report,
    "tick_bench": _plot_tick,
}


def plot_png(name: str, data: dict[str, Any]) -> bytes | None:
    """A PNG of the benchmark's figures, or None when its JSON has nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        drawn = PLOTS.get(name, _plot_latency_keys)(data, ax)
        if not drawn and name in PLOTS:
            drawn = _plot_latency_keys(data, ax)
        if not drawn:
            return None
        ax.grid(axis="both", alpha=0.3)
        fig.suptitle(name, fontsize=10)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
        return buf.getvalue()
    finally:
        plt.close(fig)


def image_path(name: str) -> str:
    """Where the plot lands in the site, relative to the docs root."""
    return f"benchmarks/img/{name}.png"


def docstring_markdown(text: str) -> str:
    """A docstring as Markdown: indented lines (command examples) become fenced code blocks, the rest is prose."""
    out: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        if line.startswith("    ") or (block and not line.strip()):
            block.append(line[4:])
            continue
        if block:
            out += ["", "```", *[b for b in block if b.strip() or b is not block[-1]], "```", ""]
            block = []
        out.append(prose(line))
    if block:
        out += ["", "```", *block, "```", ""]
    return "\n".join(out).strip() + "\n"


def page_markdown(name: str, notes: str = "", has_plot: bool = False) -> str:
    """The page of benchmark `name`: method, latest committed figures (and plot), then the notes."""
    out = [f"# {name}.py\n", f"`benchmarks/{name}.py` · {prose(summary(name))}\n", "## Method\n"]
    doc = docstring(name)
    method = doc.split("\n\n", 1)[1] if "\n\n" in doc else ""
    out.append(docstring_markdown(method) or "(the script's docstring says nothing more)")
    out.append("")
    res = result(name)
    out.append("## Latest figures\n")
    if res is None:
        out.append(
            "No JSON result is committed for this benchmark (it needs more than a few minutes, or services this "
            "machine lends only to the test suite); the figures below are quoted from the lab notebook.\n"
        )
    else:
        out.append(
            f"Measured {res.get('measured', '?')} on {res.get('machine', '?')} with `{res.get('command', '?')}` "
            f"(committed in `benchmarks/results/{name}.json`).\n"
        )
        if has_plot:
            out.append(f"![{name}](img/{name}.png)\n")
        rows = [(code(k), code(json.dumps(v) if not isinstance(v, str) else v)) for k, v in flatten(res["result"])]
        if len(rows) > MAX_FIGURE_ROWS:
            rows = [*rows[:MAX_FIGURE_ROWS], (cell(f"... {len(rows) - MAX_FIGURE_ROWS} more in the JSON file"), "")]
        out.append(
            '??? info "Every figure in the JSON result"\n\n'
            + "\n".join("    " + line for line in table(("key", "value"), rows).splitlines())
            + "\n"
        )
    if notes.strip():
        out.append("## Notes and earlier figures\n")
        out.append(notes.strip() + "\n")
    return "\n".join(out)


def index_markdown() -> str:
    rows = []
    for name in scripts():
        res = result(name)
        rows.append((f"[`{name}.py`]({name}.md)", cell(summary(name)), "yes" if res else ""))
    return "\n".join(
        [
            "# Benchmarks\n",
            "Speed and memory targets are measured by the scripts in `benchmarks/`, which print their figures "
            "(and one JSON object with `--json`); nothing in the test suite asserts on timings. Run them from the "
            "repository root with the project's Python (`.venv/bin/python benchmarks/NAME.py`; `make bench` runs "
            "the placement, submission and console benchmarks with their defaults). Each page gives the method "
            "(the script's docstring), the latest figures and, where a JSON result is committed under "
            "`benchmarks/results/`, plots drawn from it at build time. How to add one: "
            "[Adding a benchmark](../development/add-a-benchmark.md).\n",
            "The figures were measured on a 2-core machine shared with other work: they are noisy and pessimistic; "
            "compare before/after pairs run back to back, not figures from different days.\n",
            table(("script", "measures", "JSON result committed"), rows),
        ]
    )


def write_result(name: str, data: dict[str, Any], command: str, measured: str, machine: str) -> Path:
    """Store a benchmark's --json output as its committed result (used by `make bench-results`)."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"command": command, "measured": measured, "machine": machine, "result": data}
    path.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n")
    return path
