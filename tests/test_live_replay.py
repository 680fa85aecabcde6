"""The live loop and the simulator run one deadline policy: a short spot trace replayed through `tick()` (the
broker's real loop, database and ledger) on a cloud that serves the simulator's own market makes the same
launches, at the same ticks, on the same pools, for the same cost, as `run_deadline` on that trace.

The cloud is `tests.trace_replay.TraceCloud`. These traces' decisions are all made while the job waits (a running
job's moves, made at its next checkpoint, are tests/test_move_running.py's), and the zones stay down longer than
the broker's 30-minute reclaim blocklist, which the simulator does not have.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from broker.runtime import Runtime
from federation.chain_dp import ChainDP
from federation.simulate.deadline import DeadlineJob
from federation.simulate.market import TraceMarket
from tests.conftest import T0, MovableClock
from tests.trace_replay import GAP, RESTART_TICKS, replay, sim_launches, trace_runtime, two_zone_trace


def test_the_live_loop_replays_a_trace_with_the_simulators_decisions(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """2 h of work due in 6 h 40 min, a checkpoint every 30 min, no interruption notice. Simulator: t=0 both
    zones up -> the cheaper tr-1a; reclaimed at t=5 (4 ticks of work done, 3 saved) -> tr-1b; reclaimed at t=10
    -> no spot, slack covers the reserve: wait; tr-1a back at t=15 -> launch it. The live loop must launch the
    same pools at the same ticks, lose the same work, and bill the same."""
    market = TraceMarket(two_zone_trace())
    job = DeadlineJob("j", 0, work_ticks=12, deadline_ticks=40, restart_ticks=RESTART_TICKS, checkpoint_ticks=3)
    expected, sim_cost = sim_launches(market, job)
    assert [(t, k.split("/")[2]) for t, k in expected] == [(0, "tr-1a"), (5, "tr-1b"), (15, "tr-1a")]

    assert clock() == T0
    live, done, ledger = replay(trace_runtime(make_runtime, db_url, job), market, job, clock)
    assert live == expected
    assert done is not None and done.state == "succeeded" and done.finished_at is not None
    assert done.finished_at <= T0 + timedelta(seconds=GAP * job.deadline_ticks)
    assert float(ledger) == pytest.approx(sim_cost, abs=1e-6)  # the ledger keeps 10 decimals


# Six hours of history, then a job: 12 ticks of work due in 48, a checkpoint every 2. On this trace the joint-chain
# DP waits for the pattern of outages it learnt and pays less than `overspill`, which launches at once, is
# reclaimed four times and loses more work.
HISTORY_A = "111111110001111110001111101111110000" + "010011111000001111111001111111000011111110000011110000111110"
HISTORY_B = "111111000111110000111000001000111000" + "001110001111111100011000001111111100001111001111100000100001"


def _chain_dp() -> ChainDP:
    """The joint-chain DP with a short memory for a short trace: refitted every 2 h on at least 2 h of history,
    planning also without a usable notice (this cloud gives none), in units of one 10-minute tick."""
    return ChainDP(
        restart_hours=RESTART_TICKS * GAP / 3600,
        min_history_hours=2.0,
        refit_hours=2.0,
        with_loss=True,
        min_unit_hours=0.0,
    )


def test_the_live_loop_runs_the_joint_chain_dp_with_the_simulators_decisions(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    """`chain_dp` fits its chain on the pools' dated histories: in the simulator the trace's, in the live loop the
    broker's own `availability_change` rows, recorded as the loop ticked through the same six hours. Both must
    take the same decisions - spot tr-1a at job ticks 4, 14 and 26, waiting out the outages between - not what
    `overspill` does on the same trace (five spot launches from tick 1), and bill the same. (With a checkpoint
    every 3 ticks the DP also tries tr-1a at tick 1, is reclaimed, and relaunches it within the live loop's
    30-minute reclaim blocklist: the known difference of the module docstring.)"""
    market = TraceMarket(two_zone_trace(HISTORY_A, HISTORY_B))
    job = DeadlineJob("j", 36, work_ticks=12, deadline_ticks=48, restart_ticks=RESTART_TICKS, checkpoint_ticks=2)
    greedy, greedy_cost = sim_launches(market, job, lost_ticks=1)
    policy = _chain_dp()
    expected, sim_cost = sim_launches(market, job, policy, lost_ticks=0)
    assert policy.stats.get("prepare_solves", 0) > 0  # the DP decided, not only its fallback
    assert [(t, k.split("/")[2], k.split("/")[4]) for t, k in expected] == [
        (4, "tr-1a", "spot"),
        (14, "tr-1a", "spot"),
        (26, "tr-1a", "spot"),
    ]
    assert len(greedy) == 5 and sim_cost < greedy_cost

    rt = trace_runtime(make_runtime, db_url, job)
    rt.deadline_policy = _chain_dp()
    live, done, ledger = replay(rt, market, job, clock)
    assert live == expected
    assert done is not None and done.state == "succeeded"
    assert float(ledger) == pytest.approx(sim_cost, abs=1e-6)
