"""The omniscient offline optimum of a deadline job: the least any policy could pay knowing the whole trace.

Problem: finish `work_ticks` of work within `deadline_ticks` of the start, in the tick model of
`federation.simulate.deadline` (each launch costs `restart_ticks` of paid changeover; a spot pool runs only
while its zone is available; every tick on a pool is billed at its price; on-demand is always there). This is
the ILP of "Can't Be Late" §5.3 generalised to several zones with their own prices, solved exactly by dynamic
programming instead of an ILP solver.

DP: index states by the tick t and the "waste" w = t - progress (ticks spent idle or in changeover), which must
stay within the slack S = deadline - work; and by the mode m: idle, on on-demand, or on spot zone z with its
changeover done. From (t, w, m):
- keep running on m (on-demand, or zone z if available at t): -> (t+1, w, m), cost price_m(t);
- idle:                                                        -> (t+1, w+1, idle), free;
- launch m' (any state): k changeover ticks, zone m' available throughout -> (t+k, w+k, m'), cost of those k ticks.
The job is done at tick t = work + w. Cost O(deadline x slack x modes), a fraction of a second for a 48 h job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from federation.simulate.deadline import DeadlineJob
from federation.simulate.market import usd
from federation.simulate.traces import SpotTrace

INF = math.inf


def optimum_cost(
    trace: SpotTrace, job: DeadlineJob, zones: Sequence[str] | None = None, on_demand_extra_usd: float = 0.0
) -> float:
    """Minimum cost in USD to finish `job` by its deadline (INF when even on-demand cannot make it), with
    on-demand `on_demand_extra_usd` an hour dearer than the catalog (0: as is; see `optimum_on_demand_hours`)."""
    chosen = [z for z in trace.zones if zones is None or z.zone in zones]
    gap_h = trace.gap_hours
    k = job.restart_ticks
    work, horizon = job.work_ticks, job.deadline_ticks
    slack = horizon - work - k
    if slack < 0 or job.start_tick + horizon > len(trace):
        return INF
    width = horizon - work + 1  # w in 0 .. horizon - work
    od = (min(float(usd(trace.on_demand_usd[z.region])) for z in chosen) + on_demand_extra_usd) * gap_h
    t0 = job.start_tick
    avail = [z.available[t0 : t0 + horizon] for z in chosen]
    price = [[float(usd(p)) * gap_h for p in z.spot_usd[t0 : t0 + horizon]] for z in chosen]
    # run[z][t]: ticks zone z stays available from t (so a k-tick changeover fits when run >= k)
    run: list[list[int]] = []
    for bits in avail:
        r = [0] * (horizon + 1)
        for t in range(horizon - 1, -1, -1):
            r[t] = r[t + 1] + 1 if bits[t] else 0
        run.append(r)
    nz = len(chosen)
    blank = [INF] * width
    idle = [INF] * width
    idle[0] = 0.0
    on_od = blank
    spot = [blank for _ in range(nz)]
    pending: dict[int, list[list[float] | None]] = {}
    best = INF
    for t in range(horizon + 1):
        arrived = pending.pop(t, None)
        if arrived is not None:
            if arrived[0] is not None:
                on_od = list(map(min, on_od, arrived[0]))
            for z in range(nz):
                got = arrived[z + 1]
                if got is not None:
                    spot[z] = list(map(min, spot[z], got))
        w_done = t - work
        if 0 <= w_done < width:
            best = min(best, idle[w_done], on_od[w_done], *(s[w_done] for s in spot))
        if t == horizon:
            break
        floor = list(map(min, idle, on_od, *spot))
        if k == 0:  # launches are instantaneous: any state may run on any available pool this very tick
            on_od = floor
            spot = [floor if avail[z][t] else spot[z] for z in range(nz)]
        nxt_idle = [INF, *floor[:-1]]
        nxt_od = [a + od for a in on_od]
        nxt_spot = []
        for z in range(nz):
            if avail[z][t]:
                c = price[z][t]
                nxt_spot.append([a + c for a in spot[z]])
            else:
                nxt_spot.append(blank)
        if 0 < k < width and t + k <= horizon:
            slot = pending.setdefault(t + k, [None] * (nz + 1))
            head = floor[: width - k]
            _offer(slot, 0, [INF] * k + [a + od * k for a in head])
            for z in range(nz):
                if run[z][t] >= k:
                    c = sum(price[z][t : t + k])
                    _offer(slot, z + 1, [INF] * k + [a + c for a in head])
        idle, on_od, spot = nxt_idle, nxt_od, nxt_spot
    return best


def optimum_on_demand_hours(trace: SpotTrace, job: DeadlineJob, cost: float | None = None, bump: float = 1e-3) -> float:
    """Hours an optimal plan bills on on-demand (changeovers included): the derivative of the optimum's cost in
    the on-demand price, measured as the cost's change when on-demand costs `bump` USD an hour more (exact while
    the bump changes no choice; among optimal plans it picks the one with the least on-demand). `cost`: the
    optimum's cost when already known. 0 when no plan meets the deadline."""
    base = optimum_cost(trace, job) if cost is None else cost
    if not math.isfinite(base):
        return 0.0
    return max(0.0, round((optimum_cost(trace, job, on_demand_extra_usd=bump) - base) / bump, 6))


def _offer(slot: list[list[float] | None], i: int, values: list[float]) -> None:
    have = slot[i]
    slot[i] = values if have is None else list(map(min, have, values))
