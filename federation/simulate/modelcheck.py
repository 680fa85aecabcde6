"""How well the availability model (`federation.availability_model`) predicts a trace's held-out run lengths.

Contract: `model_check(trace)` fits, per zone and kind of run (up, down), the constant-rate model, the empirical
semi-Markov model, and the latter stratified by time of day (4 parts of the day) and by time of day and weekend,
on the runs completed before the middle of the trace only, and scores each on the runs starting after it
(`availability_model.log_score`: mean log-probability of the held-out lengths on bins of 1, 2, 4, ... ticks), for
fresh runs and for runs that have lasted `ages` hours. Pure and deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from federation.availability_model import Exponential, RunModel, log_score, runs_of
from federation.simulate.traces import SpotTrace

MODELS = ("constant rate", "empirical", "time of day", "time of day + weekend")


@dataclass(frozen=True, slots=True)
class ModelScore:
    zone: str
    kind: str  # "up" or "down"
    age_hours: float
    train_runs: int
    test_runs: int
    scores: tuple[float, ...]  # per MODELS


def model_check(trace: SpotTrace, ages: Sequence[float] = (0.0, 1.0)) -> list[ModelScore]:
    mid = len(trace) // 2
    edges = [0.0] + [trace.gap_hours * 2**k for k in range(12)]
    out = []
    for z in trace.zones:
        train = runs_of(z.available, trace.start_at, trace.gap_hours, mid)
        every = runs_of(z.available, trace.start_at, trace.gap_hours)
        for kind in (True, False):
            fit, test = train[kind], [r for r in every[kind] if r.start >= trace.at(mid)]
            if not fit or not test:
                continue
            models = (
                Exponential.fit(fit),
                RunModel.fit(fit),
                RunModel.fit(fit, buckets=4),
                RunModel.fit(fit, buckets=4, by_weekday=True),
            )
            for age in ages:
                n = sum(r.hours > age for r in test)
                scores = tuple(log_score(m, test, edges, age) for m in models)
                out.append(ModelScore(z.zone, "up" if kind else "down", age, len(fit), n, scores))
    return out


def model_table(rows: Sequence[ModelScore]) -> str:
    """Per age: how many series each model scores best on, and the mean score of each."""
    lines = []
    for age in sorted({r.age_hours for r in rows}):
        chosen = [r for r in rows if r.age_hours == age]
        best = [max(range(len(MODELS)), key=lambda i, r=r: r.scores[i]) for r in chosen]  # type: ignore[misc]
        means = [sum(r.scores[i] for r in chosen) / len(chosen) for i in range(len(MODELS))]
        beats = sum(r.scores[1] > r.scores[0] for r in chosen)
        lines.append(
            f"  runs that lasted {age:g} h ({len(chosen)} series): mean log-score "
            + ", ".join(f"{m} {v:.3f}" for m, v in zip(MODELS, means, strict=True))
            + "; best in "
            + ", ".join(f"{best.count(i)} {MODELS[i]}" for i in range(len(MODELS)))
            + f"; empirical beats constant rate in {beats}"
        )
    return "\n".join(lines)
