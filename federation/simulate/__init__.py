"""Trace-driven simulator: replays real spot availability/price traces and a real job trace through the same
policy code the broker runs (`federation.strategies`, `federation.burst`, `federation.placement`) on a virtual
clock, next to faithful baselines and the omniscient optimum.

Entry point: `run_simulation(data_dir, ...)` -> `SimulationReport` (`.tables()`, `.to_json()`,
`.write_png(path)`). Data is read in place from `data_dir` (the shared data folder's layout), never copied.
- deadline experiment: AWS V100 p3.2xlarge availability + spot price segments (SkyNomad, 9 zones, 2023-02-15 to
  03-17) on a `gap_seconds` grid, on-demand prices from the SkyPilot AWS catalog; scenarios: all 9 zones, and
  us-east-1's 4 zones (scarcer, pricier spot).
- other markets (`suite="markets"`): every other availability trace in the shared data that fits the deadline
  model (`experiments.EXTRA_MARKETS`: the 2022 AWS V100 windows, 1 and 8 GPUs), one table each, spot priced
  from the catalog (those traces carry no price); nothing was tuned on them. Also (and alone with `suite="gcp"`)
  the GCP H100 spot probes (`experiments.GCP_MARKETS`: one VM and a 16-VM gang, all 13 zones and us-central1's
  3), priced from the GCP catalog, with jobs a quarter the size (the trace is one week, `experiments.gcp_config`).
- burst experiment: the Philly job trace (jobs `skip_jobs` .. `+ jobs`) on an on-prem cluster of
  `onprem_gpus`, cloud V100 on-demand pools from the same catalog.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from federation.simulate.deadline import DeadlineRun
from federation.simulate.experiments import (
    CATALOG,
    EXTRA_MARKETS,
    GCP_MARKETS,
    PHILLY,
    RESEARCH_POLICIES,
    BurstConfig,
    DeadlineConfig,
    PolicySummary,
    burst_experiment,
    deadline_experiment,
    deadline_jobs,
    gcp_config,
    halves,
    job_records,
    load_aws_v100_trace,
    load_extra_market,
    load_gcp_market,
    matched_spend,
)
from federation.simulate.explain import explain_jobs, explain_table, summarize
from federation.simulate.report import SimulationReport
from federation.simulate.traces import SpotTrace
from federation.simulate.tuning import hindsight_sweep, tuning_report

__all__ = ["BurstConfig", "DeadlineConfig", "SimulationReport", "run_simulation"]

US_EAST_1 = ("us-east-1a", "us-east-1c", "us-east-1d", "us-east-1f")
SCENARIOS: dict[str, tuple[str, ...] | None] = {
    "all 9 zones (us-east-1, us-east-2, us-west-2)": None,
    "us-east-1 only (4 zones)": US_EAST_1,
}


def checkpoint_variants(cfg: DeadlineConfig) -> dict[str, DeadlineConfig]:
    """The checkpoint models each deadline scenario runs under: `cfg` as given (by default a checkpoint every
    30 minutes, saved within the cloud's notice when it is long enough: AWS's 2 minutes cover the 60 s save, so
    no AWS reclaim loses work), and the same without any notice (every reclaim loses the work since the last
    checkpoint, as on a cloud whose notice is shorter than the save). With no checkpoint interval, only `cfg`."""
    label = f"{cfg.checkpoint_hours * 60:g}-min checkpoints" if cfg.checkpoint_hours > 0 else "free checkpoints"
    if cfg.checkpoint_hours <= 0:
        return {label: cfg}
    return {
        f"{label}, cloud's notice" if cfg.notice else f"{label}, no notice": cfg,
        **({f"{label}, no notice": replace(cfg, notice=False)} if cfg.notice else {}),
    }


def _record(
    report: SimulationReport,
    title: str,
    trace: SpotTrace,
    cfg: DeadlineConfig,
    rows: list[PolicySummary],
    results: list[tuple[float, list[DeadlineRun]]],
    explain: bool,
) -> None:
    report.deadline[title] = rows
    report.deadline_jobs[title] = job_records(trace, cfg, results)
    if explain:
        jobs = deadline_jobs(trace, cfg)
        gaps = explain_jobs(trace, jobs, results, halves(jobs, len(trace)))
        report.explain[title] = explain_table(gaps)
        report.explain_summary[title] = summarize(gaps)


def _tune(report: SimulationReport, title: str, trace: SpotTrace, cfg: DeadlineConfig, workers: int) -> None:
    first = hindsight_sweep(trace, cfg, "first", workers=workers)
    second = hindsight_sweep(trace, cfg, "second", workers=workers)
    report.hindsight[title], report.hindsight_summary[title] = tuning_report(first, second)


def run_simulation(
    data_dir: Path | str,
    *,
    suite: Literal["deadline", "markets", "gcp", "burst", "all"] = "all",
    quick: bool = False,
    workers: int = 1,
    png: Path | None = None,
    deadline: DeadlineConfig | None = None,
    burst: BurstConfig | None = None,
    gap_seconds: int = 300,
    explain: bool = False,
    only: str | None = None,
    hindsight: bool = False,
) -> SimulationReport:
    """Run the experiments of `suite` on the data under `data_dir` and return the report (and write the PNG
    chart to `png` when given). `quick` shrinks both experiments for a smoke run (fewer jobs, no research policy:
    `RESEARCH_POLICIES`); `workers` > 1 spreads the work over processes. `explain` adds, per deadline table, where
    each policy's excess over the optimum comes from (`federation.simulate.explain`); `only` runs just the deadline
    tables whose title contains it; `hindsight` adds, per deadline table, `Overspill` re-tuned on a grid on the first
    half (scored on the second) and on the second half itself (`federation.simulate.tuning`: an upper bound for
    tuning). Raises ValueError when a data file is missing or malformed."""
    base = Path(data_dir)
    for rel in [CATALOG] + ([PHILLY] if suite in ("burst", "all") else []):
        if not (base / rel).exists():
            raise ValueError(f"data file missing: {base / rel}")
    dcfg = deadline or DeadlineConfig()
    bcfg = burst or BurstConfig()
    if quick:
        policies = tuple(p for p in dcfg.policies if p not in RESEARCH_POLICIES)
        dcfg = replace(dcfg, start_every_hours=max(dcfg.start_every_hours, 96.0), policies=policies)
        bcfg = replace(bcfg, jobs=min(bcfg.jobs, 3000), onprem_gpus=min(bcfg.onprem_gpus, 640))
    report = SimulationReport()
    if suite in ("deadline", "all"):
        for name, zones in SCENARIOS.items():
            trace = load_aws_v100_trace(str(base), gap_seconds, zones)
            for variant, cfg in checkpoint_variants(dcfg).items():
                title = f"{name}, {variant}"
                if only and only not in title:
                    continue
                rows, results = deadline_experiment(trace, cfg, workers, (str(base), gap_seconds, zones))
                _record(report, title, trace, cfg, rows, results, explain)
                if hindsight:
                    _tune(report, title, trace, cfg, workers)
        report.deadline_setup.update(asdict(dcfg), gap_seconds=gap_seconds, trace=trace.source)
    if suite in ("markets", "all"):
        for name in EXTRA_MARKETS:
            trace = load_extra_market(str(base), name)
            for variant, cfg in checkpoint_variants(dcfg).items():
                title = f"{name}, {variant}"
                if only and only not in title:
                    continue
                rows, results = deadline_experiment(trace, cfg, workers)
                _record(report, title, trace, cfg, rows, results, explain)
                if hindsight:
                    _tune(report, title, trace, cfg, workers)
        report.deadline_setup.update(asdict(dcfg), extra_markets=list(EXTRA_MARKETS))
    if suite in ("gcp", "markets", "all"):
        gcfg = gcp_config(dcfg)
        label = f"{gcfg.checkpoint_hours * 60:g}-min checkpoints, GCP's 30 s notice (no time to save)"
        for name in GCP_MARKETS:
            title = f"{name}, {label}"
            if only and only not in title:
                continue
            trace = load_gcp_market(str(base), name)
            rows, results = deadline_experiment(trace, gcfg, workers)
            _record(report, title, trace, gcfg, rows, results, explain)
            if hindsight:
                _tune(report, title, trace, gcfg, workers)
        report.deadline_setup.update(gcp_markets=list(GCP_MARKETS), gcp_jobs=asdict(gcfg))
    if suite in ("burst", "all"):
        from federation.simulate.loaders import load_philly
        from pricing.book import PriceBook
        from pricing.catalog_import import import_catalog

        jobs = load_philly(base / PHILLY, limit=bcfg.jobs, skip=bcfg.skip_jobs)
        at = datetime(2026, 4, 2, tzinfo=UTC)
        offers = [o for o in import_catalog(base / CATALOG, observed_at=at).offerings if o.accelerator == "V100"]
        rows, _ = burst_experiment(jobs, PriceBook.build(offers, at), bcfg, workers)
        span = jobs[-1].arrival_s / 3600 if jobs else 0.0
        title = (
            f"Philly jobs {bcfg.skip_jobs}..{bcfg.skip_jobs + len(jobs)} ({span:.0f} h of arrivals), "
            f"on-prem {bcfg.onprem_gpus} GPUs, cloud V100 on-demand"
        )
        report.burst.extend(rows)
        report.burst_setup.update(asdict(bcfg), title=title)
        report.matched.extend(matched_spend(rows))
    if png is not None:
        report.write_png(png)
    return report
