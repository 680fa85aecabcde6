"""Simulation results as plain-text tables, a JSON-ready dict, and (on request) a PNG chart.

Contract: `SimulationReport` holds the summaries of both experiments and how they were set up. `tables()` and
`to_json()` are pure; `write_png(path)` draws with matplotlib's Agg backend (imported only then) and raises
`RuntimeError` saying how to install it when it is missing.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from federation.simulate.experiments import PolicySummary


@dataclass(frozen=True)
class SimulationReport:
    deadline: dict[str, list[PolicySummary]] = field(default_factory=dict)
    deadline_setup: dict[str, Any] = field(default_factory=dict)
    deadline_jobs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per scenario: `job_records`
    burst: list[PolicySummary] = field(default_factory=list)
    burst_setup: dict[str, Any] = field(default_factory=dict)
    matched: list[dict[str, Any]] = field(default_factory=list)
    explain: dict[str, str] = field(default_factory=dict)  # per deadline table: `explain.explain_table`
    explain_summary: dict[str, Any] = field(default_factory=dict)  # per deadline table: `explain.summarize`
    hindsight: dict[str, str] = field(default_factory=dict)  # per deadline table: `tuning.tuning_report` text
    hindsight_summary: dict[str, Any] = field(default_factory=dict)  # ... and its JSON

    def tables(self) -> str:
        parts = []
        for scenario, rows in self.deadline.items():
            parts.append(f"Deadline jobs - {scenario}\n{deadline_table(rows)}\n{deadline_note(rows)}")
            if scenario in self.explain:
                parts.append(f"Where the excess over the optimum comes from - {scenario}\n{self.explain[scenario]}")
            if scenario in self.hindsight:
                parts.append(f"overspill re-tuned on a grid - {scenario}\n{self.hindsight[scenario]}")
        if self.burst:
            parts.append(f"Bursting - {self.burst_setup.get('title', 'cluster trace')}\n{burst_table(self.burst)}")
        if self.matched:
            lines = ["For the same (or lower) cloud spend - ours' best p95 wait vs each baseline:"]
            for m in self.matched:
                ours = (
                    "no run of ours spent that little"
                    if m["ours"] is None
                    else (f"{m['ours']} ${m['ours_spend_usd']:,.0f} p95 {m['ours_p95_hours']:.2f} h")
                )
                lines.append(
                    f"  {m['baseline']:<28} ${m['baseline_spend_usd']:>10,.0f} p95 {m['baseline_p95_hours']:>6.2f} h"
                    f"  | {ours}"
                )
            parts.append("\n".join(lines))
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "deadline": {
                "setup": self.deadline_setup,
                "scenarios": {k: [asdict(r) for r in rows] for k, rows in self.deadline.items()},
                "jobs": self.deadline_jobs,
                **({"explain": self.explain_summary} if self.explain_summary else {}),
                **({"hindsight": self.hindsight_summary} if self.hindsight_summary else {}),
            },
            "burst": {"setup": self.burst_setup, "policies": [asdict(r) for r in self.burst], "matched": self.matched},
        }

    def write_png(self, path: Path) -> Path:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise RuntimeError("the PNG chart needs matplotlib: pip install matplotlib") from exc
        panels = len(self.deadline) + (1 if self.burst else 0)
        if panels == 0:
            raise ValueError("nothing to draw")
        fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8), squeeze=False)
        for ax, (scenario, rows) in zip(axes[0], self.deadline.items(), strict=False):
            shown = [r for r in rows if r.cost_vs_optimum is not None]
            ax.bar([r.policy for r in shown], [r.cost_vs_optimum or 0 for r in shown], color="#6a8caf")
            for i, r in enumerate(shown):
                met = "" if r.deadline_attainment is None else f"{r.deadline_attainment:.0%}"
                ax.annotate(f"{r.cost_vs_optimum:.2f}x\n{met}", (i, r.cost_vs_optimum or 0), ha="center", va="bottom")
            ax.set_title(f"Deadline jobs: {scenario}\ncost / optimum (label: deadlines met)", fontsize=10)
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)
            ax.set_ylim(0, max((r.cost_vs_optimum or 0) for r in shown) * 1.25)
        if self.burst:
            ax = axes[0][-1]
            for kind, marker in (("fixed_timeout", "s"), ("fixed_order", "^"), ("overspill", "o")):
                pts = sorted((r.cost_usd, r.wait_p95_hours) for r in self.burst if r.extra.get("kind") == kind)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=kind)
            base = [r for r in self.burst if r.extra.get("kind") == "onprem_only"]
            if base:
                ax.axhline(base[0].wait_p95_hours, color="grey", linestyle=":", label="onprem_only")
            ax.set_xscale("symlog", linthresh=1000)
            ax.set_xlabel("cloud spend (USD)")
            ax.set_ylabel("p95 queue wait (h)")
            ax.set_title(textwrap.fill(f"Bursting: {self.burst_setup.get('title', '')}", 60), fontsize=10)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def render(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
    return "\n".join(out)


def deadline_table(rows: Sequence[PolicySummary]) -> str:
    header = [
        "policy",
        "cost $",
        "x on-demand",
        "x optimum",
        "1st/2nd half",
        "worst job",
        "deadlines",
        "preempt",
        "migr",
        "lost h",
        "idle p50/p95 h",
    ]
    body = [
        [
            r.policy,
            f"{r.cost_usd:,.0f}",
            _fmt(r.cost_vs_on_demand, ".3f"),
            _fmt(r.cost_vs_optimum, ".3f"),
            _halves(r),
            _fmt(float(r.extra["worst_job_vs_optimum"]), ".2f") if "worst_job_vs_optimum" in r.extra else "-",
            _pct(r.deadline_attainment),
            str(r.preemptions),
            str(r.migrations),
            _fmt(float(r.extra["lost_hours"]), ".1f") if "lost_hours" in r.extra else "-",
            f"{r.wait_p50_hours:.2f}/{r.wait_p95_hours:.2f}",
        ]
        for r in rows
    ]
    return render(header, body)


def _halves(r: PolicySummary) -> str:
    first, second = r.extra.get("first_half_vs_optimum"), r.extra.get("second_half_vs_optimum")
    if not isinstance(first, float) or not isinstance(second, float):
        return "-"
    return f"{first:.3f}/{second:.3f}"


def deadline_note(rows: Sequence[PolicySummary]) -> str:
    """Which policies met every deadline, cheapest first, and what the others saved by missing some."""
    policies = [r for r in rows if r.policy != "optimum" and r.deadline_attainment is not None]
    met = sorted((r for r in policies if r.deadline_attainment == 1.0), key=lambda r: r.cost_usd)
    missed = [r for r in policies if r.deadline_attainment != 1.0]
    text = "Meeting every deadline: " + (
        ", ".join(f"{r.policy} {_fmt(r.cost_vs_optimum, '.3f')}x" for r in met) if met else "none"
    )
    if missed:
        text += "; missing some: " + ", ".join(
            f"{r.policy} ({_pct(r.deadline_attainment)} met, cheaper only by missing)"
            if met and r.cost_usd < met[0].cost_usd
            else f"{r.policy} ({_pct(r.deadline_attainment)} met)"
            for r in missed
        )
    return text


def burst_table(rows: Sequence[PolicySummary]) -> str:
    header = ["policy", "cloud $", "wait p50 h", "p95 h", "p99 h", "mean h", "bursts", "returns", "deadlines"]
    body = [
        [
            r.policy,
            f"{r.cost_usd:,.0f}",
            f"{r.wait_p50_hours:.2f}",
            f"{r.wait_p95_hours:.2f}",
            f"{float(r.extra.get('wait_p99_hours', 0.0)):.2f}",
            f"{float(r.extra.get('wait_mean_hours', 0.0)):.2f}",
            str(r.extra.get("bursts", 0)),
            str(r.migrations),
            _pct(r.deadline_attainment),
        ]
        for r in rows
    ]
    return render(header, body)
