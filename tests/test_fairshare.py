"""The fair-share order of a placement round (federation/fairshare.py), alone."""

from __future__ import annotations

from federation.fairshare import fair_order


def test_tenants_take_turns_whatever_their_queue_lengths() -> None:
    queues = {"acme": [f"a{i}" for i in range(1000)], "beta": ["b0", "b1"], "gamma": ["g0"]}
    assert fair_order(queues, 6) == ["a0", "b0", "g0", "a1", "b1", "a2"]


def test_one_tenant_cannot_fill_a_round() -> None:
    queues = {"acme": [f"a{i}" for i in range(10_000)], "beta": ["b0"]}
    picked = fair_order(queues, 2)
    assert "b0" in picked and len(picked) == 2


def test_each_queue_keeps_its_own_order() -> None:
    queues = {"acme": ["a-high", "a-mid", "a-low"], "beta": ["b-high", "b-low"]}
    picked = fair_order(queues, 10)
    assert [x for x in picked if x.startswith("a")] == ["a-high", "a-mid", "a-low"]
    assert [x for x in picked if x.startswith("b")] == ["b-high", "b-low"]
    assert len(picked) == 5


def test_weights_share_the_round() -> None:
    queues = {"acme": [f"a{i}" for i in range(100)], "beta": [f"b{i}" for i in range(100)]}
    picked = fair_order(queues, 30, weights={"acme": 2.0})
    assert sum(x.startswith("a") for x in picked) == 20
    assert sum(x.startswith("b") for x in picked) == 10


def test_what_a_tenant_already_runs_counts_against_its_turns() -> None:
    queues = {"acme": [f"a{i}" for i in range(10)], "beta": [f"b{i}" for i in range(10)]}
    picked = fair_order(queues, 6, running={"acme": 4})
    assert picked[:4] == ["b0", "b1", "b2", "b3"]  # beta catches up first, then they alternate
    assert picked[4:] == ["a0", "b4"] or picked[4:] == ["b4", "a0"]


def test_a_tenant_missing_from_the_weights_weighs_the_default() -> None:
    queues = {"acme": [f"a{i}" for i in range(100)], "beta": [f"b{i}" for i in range(100)]}
    picked = fair_order(queues, 30, weights={"acme": 1.0}, default_weight=0.5)
    assert sum(x.startswith("a") for x in picked) == 20


def test_a_zero_weight_still_gets_a_turn_once_the_others_run_out() -> None:
    queues = {"acme": ["a0", "a1"], "beta": ["b0"]}
    assert fair_order(queues, 3, weights={"beta": 0.0}) == ["a0", "a1", "b0"]


def test_limits_and_empty_queues() -> None:
    assert fair_order({"acme": ["a0"]}, 0) == []
    assert fair_order({}, 5) == []
    assert fair_order({"acme": [], "beta": ["b0"]}, 5) == ["b0"]
