"""The expected-value deadline DP on the spot pools' JOINT availability chain (issue 18, point 1).

Role: `ChainDP` ("chain_dp") is `federation.model_dp.ModelDP` with another model under the same DP. Where
`ModelDP` plans over the best two pools as independent chains, `ChainDP` plans over up to `max_zones` pools whose
availability is one Markov chain over (bitmask of the pools up, age bucket of that bitmask), fitted by
`federation.joint_chain` on their dated histories (`PoolOutlook.timeline`: the broker's `availability_change`
rows, or the trace replayed so far). A region short of capacity takes its zones down together; independent
chains see that as unlikely coincidences, the joint chain sees it as what happens. This is the world in which
`federation.simulate.information` computes the best causal policy (`benchmarks/information_bound.py`); here it is
fitted causally, on the history before each model epoch, and run as a strategy.

Which pools: per model epoch (`refit_hours`), among the spot pools of the job's shape with a timeline, the
`max_zones` cheapest per hour up over the shared history (price / share of steps up; the joint chain has
2^zones x 4 states, so the set stays small). The running spot pool must be one of them, else `Overspill` decides.
The pools are those of the outlook (the job's spot pools), priced as the book lists them now or, when the
executor leaves one out for a while, as last listed.
The chain is fitted once per epoch and pool set on the steps from the latest start of their histories to the
epoch's start, at the DP's unit (the changeover, at least one tick); with fewer than `min_history_hours` of
shared history, `Overspill` decides; when the DP would wait or stay on on-demand while a spot pool outside its
set is up, `Overspill` (which weighs every pool) decides too. The joint state now is the pools' current up/down
states and the age of the youngest of their current runs. The DP prices the pools on a 5% grid (`price_step`): a
spot price moving by less reuses the solved table. On us-east-1's month (`decision_bench.py --live`, where tables
are solved inside decisions as in the live loop) exact prices meant 607 solves and a p99 of 95 ms, a 2% grid 184
and 27 ms, 5% few enough that the p99 is a look-up (0.2 ms); the tables' costs moved by at most 0.003x.

Where a reclaim loses work (the cloud's notice is shorter than a save: AWS without the notice, GCP, Azure), the
DP plans with the job's checkpoint phase (`ModelDP`: a reclaim loses the units since the last checkpoint), but only
when its chain holds every spot pool of the job's shape; with more pools than `max_zones`, `Overspill` decides.
Both were chosen on the first halves of the tables (benchmarks/README.md, "the checkpoint phase"), against
`Overspill`: us-east-1 1.181x vs 1.186x, 2022 x1 1.558x vs 1.602x, 2022 x8 1.235x vs 1.318x, GCP us-central1
equal; on all 9 zones, where the chain holds 4, the DP was worse (1.262x vs 1.197x: it trusted its 4 pools' young
up runs, was reclaimed and ran short of slack), and on GCP's 13 zones equal. An earlier DP that charged half an
interval per reclaim lost in 3 of the 4 AWS tables. `with_loss=False` leaves every such market to `Overspill`.

Contract: as `ModelDP` (pure, deterministic for a given state, the past only; `Overspill` is the fallback and the
safety net near the deadline; `prepare` solves a tick's tables ahead of its decisions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from federation.forecast import pools_of_shape
from federation.joint_chain import EDGES, bucket_of, fit_grid, shared_grid
from federation.model_dp import IDLE, OD, ModelDP, OutlookAt, World, _Query
from federation.strategies import PoolOutlook, RunState, pools, register
from pricing.book import PriceBook
from providers.model import CapacityType, Offering


@dataclass(frozen=True, slots=True)
class _Fit:
    """One epoch's joint chain: the pools (keys, in bit order), the transition matrix, per pool the joint states
    with it up, and the number of steps the chain was counted on."""

    keys: tuple[str, ...]
    matrix: np.ndarray
    ups: list[np.ndarray]
    steps: int


@dataclass(frozen=True)
class ChainDP(ModelDP):
    """The DP of `ModelDP` on the joint availability chain of up to `max_zones` pools (module docstring)."""

    name: ClassVar[str] = "chain_dp"
    max_zones: int = 4
    min_history_hours: float = 72.0
    pseudo: float = 0.1
    edges: tuple[int, ...] = EDGES
    with_loss: bool = True  # plan also where a reclaim loses work (no usable notice); off: `Overspill` decides there
    price_step: float = 0.05  # spot prices on a grid of 5% steps: a table is re-solved when one moves a step
    # each pool as last listed: a pool the executor leaves out of the book for a while (the live loop's reclaim
    # blocklist) stays in the chain, so the world does not change with it (the DP's wish to launch it defers)
    _seen: dict[str, Offering] = field(default_factory=dict, compare=False, repr=False)
    _fits: dict[tuple[object, ...], _Fit | None] = field(default_factory=dict, compare=False, repr=False)

    def _defers(self, state: RunState, book: PriceBook, q: _Query, act: int) -> bool:
        """Waiting or on-demand while a spot pool outside the DP's pools is up: the DP cannot weigh that pool, so
        `Overspill` (which ranks every pool) decides."""
        if act not in (IDLE, OD) or not state.job.preemptible:
            return False
        mine = {o.key for o in q.pair}
        return any(o.key not in mine for o in pools(state, book, frozenset({CapacityType.SPOT})))

    def _world(
        self, state: RunState, book: PriceBook, up_spot: list[Offering], unit: float, outlook_at: OutlookAt | None
    ) -> tuple[list[Offering], World, int] | None:
        seen = self._seen
        seen.update((o.key, o) for o in pools_of_shape(state, book))
        every = {k: seen[k] for k in state.outlook if k in seen}
        loses = any(state.spot_loss_hours(o.provider) > 0 for o in every.values())
        if loses and not self.with_loss:
            return None  # a reclaim would lose work, and `with_loss` is off
        looks = {k: lk for k, lk in state.outlook.items() if k in every and lk.timeline is not None}
        if not looks:
            return None
        epoch = self.epoch(state.now)
        fit = self._fit(looks, every, epoch, unit)
        if fit is None:
            return None
        if loses and len(fit.keys) < len(every):
            return None  # a reclaim loses work and the DP sees only some of the pools (module docstring)
        chosen = [every[k] for k in fit.keys]
        prices = tuple(_on_grid(float(o.price.hourly_usd), self.price_step) for o in chosen)
        world = World(
            fit.matrix, fit.ups, prices, ("joint", epoch, fit.keys, fit.steps, tuple(round(p, 6) for p in prices))
        )
        now_looks = [looks[k] for k in fit.keys]
        mask = sum(1 << z for z, lk in enumerate(now_looks) if lk.up)
        age_steps = math.floor(min(lk.age_hours for lk in now_looks) / unit + 1e-9) + 1
        return chosen, world, mask * len(self.edges) + bucket_of(age_steps, self.edges)

    def _fit(
        self, looks: Mapping[str, PoolOutlook], every: Mapping[str, Offering], epoch: int, unit: float
    ) -> _Fit | None:
        """The epoch's chain for these pools (fitted once per epoch and candidate set; None: too little history):
        the `max_zones` cheapest per hour up (price / share of steps up) over the history they share before the
        epoch's start, at least `min_history_hours` of it."""
        key = (epoch, tuple(sorted(looks)), round(unit, 9))
        if key in self._fits:
            return self._fits[key]
        if any(k[0] != epoch for k in self._fits):
            self._fits.clear()  # a new epoch: the old fits are not used again
        keys = sorted(looks)  # every one has a timeline (`_world`)
        up = shared_grid([looks[k].timeline for k in keys], self.epoch_start(epoch), unit * 3600)  # type: ignore[misc]
        found = None
        if up.shape[1] >= 2 and up.shape[1] * unit >= self.min_history_hours:
            share = up.mean(axis=1)
            ranked = sorted(
                (float(every[k].price.hourly_usd) / share[i], i) for i, k in enumerate(keys) if share[i] > 0
            )
            rows = sorted(i for _, i in ranked[: self.max_zones])
            if rows:
                matrix = fit_grid(up[rows], self.edges, self.pseudo)
                masks = np.arange(matrix.shape[0]) // len(self.edges)
                ups = [((masks >> z) & 1).astype(bool) for z in range(len(rows))]
                found = _Fit(tuple(keys[i] for i in rows), matrix, ups, up.shape[1])
        self._fits[key] = found
        return found


def _on_grid(price: float, step: float) -> float:
    """`price` rounded to a geometric grid of relative `step` (0: exact), so that small moves of a spot price
    reuse the solved table (each solve is ~0.1 s; the live loop solves inside the decision that needs it)."""
    if step <= 0 or price <= 0:
        return price
    unit = math.log1p(step)
    return round(math.exp(round(math.log(price) / unit) * unit), 6)


register(ChainDP.name, ChainDP)
