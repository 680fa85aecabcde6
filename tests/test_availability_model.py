"""The availability model (federation/availability_model.py): runs from a series, survival, and held-out scores
against the constant rate, on hand-made runs and on the real AWS V100 trace."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta

import pytest

from federation.availability_model import Exponential, Run, RunModel, log_score, runs_of
from tests.data import shared_file

T0 = datetime(2023, 1, 2, tzinfo=UTC)  # a Monday


def test_runs_of_leaves_out_the_first_run_and_the_one_still_going() -> None:
    bits = [True, True, False, False, False, True, False, True, True]
    runs = runs_of(bits, T0, 0.5)
    assert runs[False] == [Run(T0 + timedelta(hours=1), 1.5), Run(T0 + timedelta(hours=3), 0.5)]
    assert runs[True] == [Run(T0 + timedelta(hours=2.5), 0.5)]  # the first (ticks 0-1) and last (7-8) left out
    early = runs_of(bits, T0, 0.5, upto=5)  # before tick 5 the down run 2-4 has not ended: not complete
    assert early == {True: [], False: []}


def test_survival_is_a_proper_conditional_tail_and_age_matters() -> None:
    # short runs (0.25 h) and long ones (8 h), 50/50: a fresh run is likely short; one that lasted 1 h is long
    runs = [Run(T0, 0.25)] * 20 + [Run(T0, 8.0)] * 20
    m = RunModel.fit(runs)
    assert m.survival(0.0) == pytest.approx(1.0)
    xs = [0.1, 0.5, 1, 2, 4, 8, 16]
    assert all(m.survival(a) >= m.survival(b) for a, b in itertools.pairwise(xs))
    assert m.survival(1.0, age=0.0) < 0.6 < 0.85 < m.survival(1.0, age=1.0)
    assert m.mean_residual(age=1.0) > 1.5 * m.mean_residual(age=0.0)  # about 7 h (8 - 1) vs about 4.1 h
    e = Exponential.fit(runs)
    assert e.survival(1.0, age=0.0) == e.survival(1.0, age=1.0)  # memoryless


def test_time_of_day_strata_separate_night_from_day() -> None:
    night = [Run(T0 + timedelta(days=d, hours=2), 6.0) for d in range(10)]
    day = [Run(T0 + timedelta(days=d, hours=14), 0.5) for d in range(10)]
    m = RunModel.fit(night + day, buckets=4, min_samples=5)
    pooled = RunModel.fit(night + day)
    at_night, at_day = T0 + timedelta(days=20, hours=3), T0 + timedelta(days=20, hours=13)
    assert m.survival(2.0, 0.0, at_night) > pooled.survival(2.0) > m.survival(2.0, 0.0, at_day)
    assert RunModel.fit(night + day, buckets=4, min_samples=50).survival(2.0, 0.0, at_night) == pooled.survival(2.0)


def test_the_model_beats_a_constant_rate_on_held_out_runs_of_a_heavy_tailed_process() -> None:
    rng = random.Random(7)

    def draw(n: int) -> list[Run]:
        return [Run(T0, rng.choice([0.25, 0.5]) if rng.random() < 0.7 else rng.uniform(4, 12)) for _ in range(n)]

    train, test = draw(200), draw(200)
    edges = [0.0, 0.25, 0.5, 1, 2, 4, 8, 16]
    assert log_score(RunModel.fit(train), test, edges) > log_score(Exponential.fit(train), test, edges) + 0.2


@pytest.mark.integration
def test_on_the_real_trace_the_model_predicts_fresh_runs_better_than_a_constant_rate() -> None:
    from federation.simulate.experiments import load_aws_v100_trace
    from federation.simulate.modelcheck import MODELS, model_check, model_table

    base = shared_file("spot-probes-skynomad/aws_v100_p3.2xlarge_avail_price_segments_2023-02-15.csv").parent.parent
    rows = model_check(load_aws_v100_trace(str(base), 300, None), ages=(0.0,))
    assert len(rows) == 18 and all(r.train_runs > 20 and r.test_runs > 20 for r in rows)
    emp, const = MODELS.index("empirical"), MODELS.index("constant rate")
    assert sum(r.scores[emp] > r.scores[const] for r in rows) >= 15
    assert sum(r.scores[emp] for r in rows) > sum(r.scores[const] for r in rows)
    assert "empirical beats constant rate in" in model_table(rows)
