"""A forecasting deadline policy: model-predictive control over sampled availability futures.

Role: `Forecast` decides like `federation.strategies.Overspill` (its fallback and its safety net) but, when the job
is idle or on a safe pool with slack to spare and (by default, `plan_with_spot` False) no spot pool is up, picks the
first action by sample-average approximation: it samples `samples` futures of every spot pool's availability from
a per-pool model fitted on that pool's history before `now` only (`RunState.outlook`), solves the exact deadline
DP (the one of `federation.simulate.optimum`, backward, on a coarser planning grid) in each future, and takes the
first action (wait, on-demand, or - with `plan_with_spot` - a spot pool) whose mean cost-to-finish over the
futures is least. It re-plans at every decision (the executor asks each tick).

Status (benchmarks/README.md): on the AWS V100 traces it is within 0.1-1% of `Overspill`, not below it. Each future
is solved with hindsight (the DP knows that future), which overrates waiting; with `plan_with_spot` (choosing
among spot pools and on-demand too, `wait_with_spot` False) it was worse (1.092x vs 1.068x on all 9 zones of
the 2023 trace, `--quick`, both halves: this choice was not made on the first half alone), so the default plans
only the wait-or-on-demand choice.

Availability model (per spot pool): a semi-Markov process of up and down runs. The current run's remaining
length is drawn from the pool's past runs of the same kind that lasted longer than its current age (age
dependence: "spot runs that have lasted, last"), later runs from all its past runs of their kind. A pool with
fewer than `min_samples` past up runs has no model: then the whole decision falls back to `Overspill`.

Contract: pure (no clock, no I/O); deterministic for a given state (the sampler is seeded from the job's name and
`now`), so a replay decides identically. Time of day and price movement are not modelled (prices are held at
their current level over the horizon).

Planning grid: steps of `tick x m`, m the smallest factor keeping the horizon within `max_steps`; a changeover
of d hours takes max(1, round(d / step)) steps of slack and costs d hours at the pool's price.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from federation.strategies import (
    NON_SPOT,
    Move,
    Overspill,
    Plan,
    PoolOutlook,
    RunState,
    current_alive,
    keep,
    launch,
    pools,
    register,
    wait,
)
from pricing.book import PriceBook
from providers.model import CapacityType, Offering

INF = math.inf


def sample_runs(look: PoolOutlook, steps: int, step_hours: float, rng: random.Random) -> list[bool]:
    """One sampled future of a pool's availability over `steps` planning steps (see the module docstring)."""
    out: list[bool] = []
    up = look.up
    runs = look.up_runs if up else look.down_runs
    longer = [h for h in runs.hours if h > look.age_hours + 1e-9]
    left = (rng.choice(longer) - look.age_hours) if longer else max(look.age_hours, step_hours)
    while len(out) < steps:
        n = max(1, round(left / step_hours))
        out.extend([up] * n)
        up = not up
        pool = (look.up_runs if up else look.down_runs).hours
        left = rng.choice(pool) if pool else INF
        if not math.isfinite(left):
            out.extend([up] * (steps - len(out)))
    return out[:steps]


@dataclass(frozen=True, slots=True)
class Forecast:
    """MPC over sampled futures, with `Overspill` as fallback and safety net (module docstring)."""

    name: ClassVar[str] = "forecast"
    restart_hours: float = 0.25
    samples: int = 8
    max_steps: int = 120
    min_samples: int = 5
    wait_with_spot: bool = False
    plan_with_spot: bool = False
    fallback: Overspill = field(default_factory=Overspill)

    def __post_init__(self) -> None:
        if self.fallback.restart_hours != self.restart_hours:
            object.__setattr__(self, "fallback", Overspill(restart_hours=self.restart_hours))

    def decide(self, state: RunState, book: PriceBook) -> Plan:
        base = self.fallback.decide(state, book)
        if state.job.deadline_at is None or base.move is Move.PAUSE:
            return base
        alive = current_alive(state)
        if alive and state.on({CapacityType.SPOT}):
            return base  # exploitation: a running spot pool is kept (or left for a clearly cheaper one)
        spots = pools(state, book, frozenset({CapacityType.SPOT})) if state.job.preemptible else []
        safe = pools(state, book, NON_SPOT)
        if not safe:
            return base
        shape_pools = pools_of_shape(state, book)
        models = {o.key: state.outlook.get(o.key) for o in shape_pools}
        if not models or any(m is None or len(m.up_runs.hours) < self.min_samples for m in models.values()):
            return base  # no history for some pool: today's strategy
        d, g = self.restart_hours, state.tick_hours
        left = state.hours_to_deadline() or 0.0
        slack = left - state.work - state.restart_left_hours
        loss = max((state.spot_loss_hours(o.provider) for o in spots), default=0.0)
        margin = state.spot_margin_hours(d, loss)
        if slack < margin + d + g:
            return base  # too thin to choose anything but the safety net's answer
        if spots and not self.plan_with_spot:
            return base
        choice = self._plan(state, spots, safe[0], models, left, shape_pools)  # type: ignore[arg-type]
        if choice is None:
            return base
        if choice == "wait":
            if alive:
                return base if base.move is not Move.KEEP else keep(state, self.name, "forecast: stay")
            return wait(self.name, f"forecast: waiting is cheapest over {self.samples} sampled futures")
        if choice == "od":
            if alive and state.current is not None and state.current.key == safe[0].key:
                return keep(state, self.name, "forecast: stay on on-demand")
            return launch(state, self.name, safe[0], f"forecast: on-demand is cheapest over {self.samples} futures")
        off = next(o for o in spots if o.key == choice)
        return launch(state, self.name, off, f"forecast: spot {off.key} is cheapest over {self.samples} futures")

    def _plan(
        self,
        state: RunState,
        spots: list[Offering],
        od: Offering,
        models: dict[str, PoolOutlook],
        left: float,
        shape_pools: list[Offering],
    ) -> str | None:
        """The first action with the least mean cost-to-finish over sampled futures: "wait", "od" or a spot key."""
        g = state.tick_hours
        m = max(1, math.ceil(left / g / self.max_steps))
        s = g * m
        horizon = math.floor(left / s + 1e-9)
        work = math.ceil((state.work + state.restart_left_hours) / s - 1e-9)
        slack = horizon - work
        if slack < 1 or horizon < 1:
            return None
        k = max(1, round(self.restart_hours / s)) if self.restart_hours > 0 else 0
        keys = sorted(models)
        price = {o.key: float(o.price.hourly_usd) for o in spots}
        all_prices = {o.key: float(o.price.hourly_usd) for o in shape_pools}
        rng = random.Random(f"{state.job.name}|{state.now.isoformat()}")
        avail = np.zeros((self.samples, len(keys), horizon + k + 1), dtype=bool)
        for i in range(self.samples):
            for j, key in enumerate(keys):
                avail[i, j, :] = sample_runs(models[key], horizon + k + 1, s, rng)
        # a pool down now keeps the price it last had (`price` holds only the ones up now: the book's others)
        zp = np.array([price.get(key, all_prices.get(key, od_price(od))) for key in keys])
        values = solve(avail, zp, od_price(od), s, work, k, self.restart_hours)
        options: dict[str, float] = {
            "wait": values["wait"],  # type: ignore[dict-item]
            "od": values["od_keep" if self._on(state, od) else "od"],  # type: ignore[dict-item]
        }
        for o in spots:
            options[o.key] = values["spot"][keys.index(o.key)]  # type: ignore[index]
        if spots and not self.wait_with_spot:
            del options["wait"]  # hindsight futures overrate waiting; with spot up now, act
        return min(options, key=lambda a: (options[a], a != "od", a))

    @staticmethod
    def _on(state: RunState, od: Offering) -> bool:
        return current_alive(state) and state.current is not None and state.current.key == od.key


def od_price(od: Offering) -> float:
    return float(od.price.hourly_usd)


def pools_of_shape(state: RunState, book: PriceBook) -> list[Offering]:
    """Every spot pool that fits the job, available or not (the futures of all of them matter)."""
    job = state.job
    out = []
    for group in book.for_shape(job.accelerators, job.gpu_count):
        for item in group.items:
            off = item.offering
            if off.capacity_type is CapacityType.SPOT and (
                job.max_hourly_usd is None or off.price.hourly_usd <= job.max_hourly_usd
            ):
                out.append(off)
    return out


def solve(
    avail: np.ndarray, spot_hourly: np.ndarray, od_hourly: float, step_hours: float, work: int, k: int, d: float
) -> dict[str, object]:
    """The exact deadline DP, backward, in every sampled future at once (arrays over futures x waste).

    `avail[i, z, t]`: zone z up at step t in future i (t = 0 .. horizon + k); `work` steps of work due at the
    last step, horizon = avail.shape[2] - k - 1; a launch burns `k` steps of slack and costs `d` hours at the
    pool's hourly price (`spot_hourly[z]`, `od_hourly`); a step running on a pool costs `step_hours` of it.
    Returns the mean cost-to-finish at step 0 with no waste yet of each first action: "wait", "od" (launch
    on-demand), "od_keep" (stay on it), and "spot" (per zone: launch it now; INF when it is down now)."""
    n, nz, total = avail.shape
    horizon = total - k - 1
    slack = horizon - work
    width = slack + 2  # waste 0..slack, plus an INF column for waste beyond the slack
    inf_col = np.full((n, 1), INF)
    inf_k = np.full((n, max(k, 1)), INF)
    od_step, od_launch = od_hourly * step_hours, od_hourly * d
    spot_step, spot_launch_cost = spot_hourly * step_hours, spot_hourly * d
    end = np.full((n, width), INF)
    end[:, slack] = 0.0  # finished exactly at the deadline
    hist: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {horizon: (end, end, np.stack([end] * nz))}
    blank = (np.full((n, width), INF),) * 2 + (np.full((nz, n, width), INF),)
    first: dict[str, object] = {}
    for t in range(horizon - 1, -1, -1):
        idle_n, od_n, spot_n = hist[t + 1]
        _, od_k, spot_k = hist.get(t + k, blank)
        shift = np.concatenate([idle_n[:, 1:], inf_col], axis=1)  # idle a step: waste + 1
        launch_od = np.concatenate([od_k[:, k:], inf_k[:, :k]], axis=1) + od_launch if k else od_n + od_step
        best = launch_od
        spot_launch = []
        for z in range(nz):
            if k:
                ok = avail[:, z, t : t + k].all(axis=1)[:, None]
                land = np.concatenate([spot_k[z][:, k:], inf_k[:, :k]], axis=1) + spot_launch_cost[z]
            else:
                ok, land = avail[:, z, t][:, None], spot_n[z] + spot_step[z]
            val = np.where(ok, land, INF)
            spot_launch.append(val)
            best = np.minimum(best, val)
        run_od = od_n + od_step
        idle_t = np.minimum(shift, best)
        od_t = np.minimum(run_od, idle_t)
        up = avail[:, :, t].T[:, :, None]  # (zones, futures, 1)
        run_spot = np.where(up, spot_n + spot_step[:, None, None], INF)
        spot_t = np.where(up, np.minimum(run_spot, idle_t[None]), idle_t[None])
        w_done = t - work
        if 0 <= w_done <= slack:
            idle_t[:, w_done] = od_t[:, w_done] = 0.0
            spot_t[:, :, w_done] = 0.0
        if t == 0:
            first = {
                "wait": float(np.mean(shift[:, 0])),
                "od": float(np.mean(launch_od[:, 0])),
                "od_keep": float(np.mean(run_od[:, 0])),
                "spot": [float(np.mean(v[:, 0])) for v in spot_launch],
            }
        hist[t] = (idle_t, od_t, spot_t)
        hist.pop(t + k + 1, None)
    return first


register(Forecast.name, Forecast)
