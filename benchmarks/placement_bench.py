"""Placement latency: how long `federation.placement.place()` and `quote()` take on a large catalog.

What it measures
  1. Building a deterministic synthetic catalog of `--offerings` pools (default 60,000): 15 canonical
     accelerators, many providers, regions and zones, instance types with 1/2/4/8 GPUs, spot and on-demand
     (plus a few on-prem pools with a queue wait), random prices and interruption rates from `--seed`.
     When the shared data folder holds `catalog/skypilot_v8_aws_vms_pfamily_gpu_subset.csv` (the real AWS
     P-family catalog), its rows are loaded as well (one on-demand and one spot pool per row; an empty price
     makes no pool).
  2. `PriceBook.build` over all of them (wall time).
  3. `place()` for `--decisions` random job specs (varied accelerator lists, GPU counts, total ceilings, some
     deadlines, hourly ceilings, region and provider restrictions, blocklists, remote checkpoints), timed one
     by one with `time.perf_counter_ns`: p50 / p90 / p99 / max in ms and decisions per second.
  4. `quote()` (the full explanation path: every pool of the job's accelerators judged and sorted) for
     `--quotes` specs (default 200), timed the same way; it also checks that `place()` picks the same pool as
     `quote().best` for those specs.
  5. Peak RSS of the process (`resource.getrusage`).

Shared data is looked for in `--data`, then `$OVERSPILL_SHARED_DATA`, then `../shared/data` next to the repository;
without it only the synthetic catalog is used.

Run (from the repository root):
    python benchmarks/placement_bench.py
    python benchmarks/placement_bench.py --offerings 200000 --decisions 5000 --json
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from federation.placement import Candidate, PlacementContext, PlacementParams, place, quote
from pricing.book import PriceBook
from providers.accelerators import ACCELERATORS, canonical, memory_gib
from providers.model import CapacityType, JobSpec, Offering, Price

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_CATALOG = Path("catalog") / "skypilot_v8_aws_vms_pfamily_gpu_subset.csv"
NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
FOUR_PLACES = Decimal("0.0001")

# Rough on-demand USD per GPU-hour of each canonical accelerator (the synthetic market scatters around it).
BASE_GPU_HOUR_USD: dict[str, float] = {
    "K80": 0.90,
    "T4": 0.53,
    "V100": 3.06,
    "V100-32GB": 3.90,
    "A10": 1.10,
    "A10G": 1.21,
    "L4": 0.85,
    "L40S": 1.95,
    "A100": 3.67,
    "A100-80GB": 5.12,
    "H100": 6.88,
    "H100-MEGA": 7.50,
    "H200": 8.60,
    "B200": 11.20,
    "MI300X": 6.00,
}

# Synthetic provider names (distinct from the real catalog's `aws`, so keys never collide) and price factors.
PROVIDERS: dict[str, float] = {
    "syn-aws": 1.00,
    "syn-gcp": 0.95,
    "syn-azure": 1.05,
    "syn-oci": 0.85,
    "syn-lambda": 0.70,
    "syn-coreweave": 0.80,
    "syn-runpod": 0.65,
    "syn-nebius": 0.75,
    "syn-vultr": 0.90,
    "syn-ibm": 1.15,
}
GEOS = ("us-east", "us-west", "us-central", "eu-west", "eu-central", "eu-north", "ap-south", "ap-northeast", "sa-east")
GPU_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Figures:
    """Latency summary of one timed series."""

    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    per_second: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Figures:
        ordered = sorted(samples_ns)

        def pct(p: float) -> float:
            # nearest-rank percentile
            idx = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
            return ordered[idx] / 1e6

        total_s = sum(ordered) / 1e9
        return cls(
            count=len(ordered),
            p50_ms=pct(50),
            p90_ms=pct(90),
            p99_ms=pct(99),
            max_ms=ordered[-1] / 1e6,
            mean_ms=statistics.fmean(ordered) / 1e6,
            per_second=len(ordered) / total_s if total_s > 0 else float("inf"),
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "count": self.count,
            "p50_ms": round(self.p50_ms, 4),
            "p90_ms": round(self.p90_ms, 4),
            "p99_ms": round(self.p99_ms, 4),
            "max_ms": round(self.max_ms, 4),
            "mean_ms": round(self.mean_ms, 4),
            "per_second": round(self.per_second, 1),
        }


def _money(value: float) -> Decimal:
    return Decimal(repr(value)).quantize(FOUR_PLACES)


def synthetic_offerings(n: int, seed: int) -> Iterator[Offering]:
    """Exactly `n` distinct pools, deterministic for a seed.

    Zones are filled round-robin over providers (region index grows until `n` is reached); each zone offers a
    random subset of the accelerators, each in 1/2/4/8-GPU types of one or two instance families, spot and
    on-demand. One zone in 25 is an on-prem cluster (capacity `on_prem`, a queue wait instead of a price).
    """
    rng = random.Random(seed)
    accelerators = list(ACCELERATORS)
    made = 0
    region_idx = 0
    observed = NOW - timedelta(minutes=5)
    while True:
        for provider, provider_factor in PROVIDERS.items():
            region = f"{GEOS[region_idx % len(GEOS)]}-{region_idx // len(GEOS) + 1}"
            region_factor = rng.uniform(0.9, 1.3)
            egress = _money(rng.choice((0.0, 0.01, 0.02, 0.05, 0.08, 0.09, 0.12)))
            for zone_letter in "abc"[: rng.randint(1, 3)]:
                on_prem = rng.random() < 0.04
                # on-prem clusters are one provider; their region names keep their keys distinct
                pool_region = f"dc-{provider.removeprefix('syn-')}-{region}" if on_prem else region
                zone = f"{pool_region}{zone_letter}"
                offered = rng.sample(accelerators, rng.randint(4, len(accelerators)))
                for acc in offered:
                    base = BASE_GPU_HOUR_USD[acc] * provider_factor * region_factor
                    families = rng.randint(1, 2)
                    for family in range(families):
                        for count in GPU_COUNTS:
                            instance_type = f"{acc.lower()}.f{family}.x{count}"
                            vcpus = count * rng.choice((4, 8, 12, 16, 24))
                            memory = Decimal(vcpus * rng.choice((4, 8, 12)))
                            on_demand = base * count * rng.uniform(0.92, 1.12)
                            if on_prem:
                                pools = [(CapacityType.ON_PREM, on_demand * 0.35, 0.0, rng.expovariate(1 / 3.0))]
                            else:
                                spot_rate = rng.expovariate(1 / 0.08) if rng.random() < 0.9 else rng.uniform(0.3, 2)
                                pools = [
                                    (CapacityType.ON_DEMAND, on_demand, 0.0, 0.0),
                                    (CapacityType.SPOT, on_demand * rng.uniform(0.22, 0.9), spot_rate, 0.0),
                                ]
                            for capacity, price, rate, wait in pools:
                                yield Offering(
                                    provider="syn-onprem" if on_prem else provider,
                                    region=pool_region,
                                    zone=zone,
                                    instance_type=instance_type,
                                    accelerator=acc,
                                    accelerator_count=count,
                                    gpu_memory_gib=memory_gib(acc),
                                    vcpus=vcpus,
                                    memory_gib=memory,
                                    capacity_type=capacity,
                                    price=Price(_money(price), "synthetic", observed),
                                    interruption_rate_per_hour=rate,
                                    egress_usd_per_gb=Decimal(0) if on_prem else egress,
                                    expected_wait_hours=wait,
                                    available=rng.random() < 0.97,
                                )
                                made += 1
                                if made >= n:
                                    return
        region_idx += 1


@dataclass(frozen=True, slots=True)
class RealCatalog:
    path: Path
    rows: int
    offerings: list[Offering]
    empty_prices: int
    rows_without_price: int


def load_real_catalog(path: Path, seed: int) -> RealCatalog:
    """One on-demand pool (Price) and one spot pool (SpotPrice) per row; an empty price makes no pool.

    The catalog carries no interruption rates: spot pools get a deterministic rate drawn from `seed`.
    """
    rng = random.Random(seed ^ 0x5EED)
    offerings: list[Offering] = []
    rows = empty = priceless = 0
    with path.open(newline="") as fh:
        for rec in csv.DictReader(fh):
            rows += 1
            acc = canonical(rec["AcceleratorName"])
            count = int(float(rec["AcceleratorCount"]))
            made = 0
            for column, capacity in (("Price", CapacityType.ON_DEMAND), ("SpotPrice", CapacityType.SPOT)):
                raw = (rec.get(column) or "").strip()
                if not raw:
                    empty += 1
                    continue
                offerings.append(
                    Offering(
                        provider="aws",
                        region=rec["Region"],
                        zone=rec["AvailabilityZone"],
                        instance_type=rec["InstanceType"],
                        accelerator=acc,
                        accelerator_count=count,
                        gpu_memory_gib=memory_gib(acc),
                        vcpus=int(float(rec["vCPUs"])),
                        memory_gib=Decimal(rec["MemoryGiB"]),
                        capacity_type=capacity,
                        price=Price(Decimal(raw), "skypilot-catalog-v8", NOW - timedelta(hours=1)),
                        interruption_rate_per_hour=rng.uniform(0.01, 0.25) if capacity is CapacityType.SPOT else 0.0,
                        egress_usd_per_gb=Decimal("0.09"),
                    )
                )
                made += 1
            if made == 0:
                priceless += 1
    return RealCatalog(path, rows, offerings, empty, priceless)


def find_real_catalog(data: str | None) -> Path | None:
    candidates = [data] if data else [os.environ.get("OVERSPILL_SHARED_DATA"), str(REPO_ROOT.parent / "shared/data")]
    for folder in candidates:
        if folder and (Path(folder) / REAL_CATALOG).is_file():
            return Path(folder) / REAL_CATALOG
    return None


def random_specs(n: int, seed: int, book: PriceBook) -> list[tuple[JobSpec, PlacementContext]]:
    """`n` varied job specs with their placement contexts, deterministic for a seed and a catalog."""
    rng = random.Random(seed + 1)
    accelerators = sorted(book.by_accelerator)
    regions = sorted({o.region for o in book})
    providers = sorted({o.provider for o in book})
    params = PlacementParams(wait_value_usd_per_gpu_hour=0.5)
    out: list[tuple[JobSpec, PlacementContext]] = []
    for i in range(n):
        accs = tuple(rng.sample(accelerators, min(len(accelerators), rng.choice((1, 1, 2, 2, 3, 4)))))
        gpus = rng.choice((1, 1, 1, 2, 2, 4, 4, 8, 8))
        work_gpu_hours = Decimal(rng.choice((1, 2, 5, 10, 24, 50, 100, 250, 800)))
        typical = min(BASE_GPU_HOUR_USD.get(a, 4.0) for a in accs) * float(work_gpu_hours)
        ceiling = _money(typical * rng.choice((0.15, 0.3, 0.6, 1.0, 2.0, 5.0)) + 1).quantize(Decimal("0.01"))
        max_hourly = None
        if rng.random() < 0.3:
            max_hourly = _money(min(BASE_GPU_HOUR_USD.get(a, 4.0) for a in accs) * gpus * rng.uniform(0.3, 1.5))
        deadline = NOW + timedelta(hours=rng.uniform(1, 200)) if rng.random() < 0.25 else None
        allowed_regions = (
            tuple(rng.sample(regions, min(len(regions), rng.randint(1, 4)))) if rng.random() < 0.15 else ()
        )
        allowed_providers = (
            tuple(rng.sample(providers, min(len(providers), rng.randint(1, 3)))) if rng.random() < 0.1 else ()
        )
        checkpoint_at = (rng.choice(providers), rng.choice(regions)) if rng.random() < 0.3 else None
        blocklist = frozenset({rng.choice(providers)}) if rng.random() < 0.1 else frozenset()
        spec = JobSpec(
            tenant="bench",
            team=f"team{i % 7}",
            project="bench",
            name=f"job-{i}",
            image="ghcr.io/acme/train:1.0",
            command=("python", "train.py"),
            accelerators=accs,
            gpu_count=gpus,
            max_total_usd=ceiling,
            min_gpu_memory_gib=rng.choice((0, 0, 0, 24, 40, 80)),
            cpus=rng.choice((0, 0, 8, 32)),
            work_gpu_hours=work_gpu_hours,
            deadline_at=deadline,
            max_hourly_usd=max_hourly,
            checkpoint_size_gb=Decimal(rng.choice((0, 5, 50, 500))),
            allowed_providers=allowed_providers,
            allowed_regions=allowed_regions,
            preemptible=rng.random() < 0.85,
        )
        spent = Decimal(0) if rng.random() < 0.8 else (ceiling * Decimal("0.3")).quantize(Decimal("0.01"))
        ctx = PlacementContext(
            now=NOW,
            remaining_work_hours=spec.work_hours,
            spent_usd=spent,
            blocklist=blocklist,
            checkpoint_at=checkpoint_at,
            checkpoint_egress_usd_per_gb=Decimal("0.09"),
            params=params,
        )
        out.append((spec, ctx))
    return out


def peak_rss_mib() -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def run(args: argparse.Namespace) -> dict[str, Any]:
    say = (lambda *_: None) if args.json else print
    say(f"placement_bench: python {platform.python_version()}, {os.cpu_count()} CPUs, seed {args.seed}")

    t0 = time.perf_counter()
    offerings = list(synthetic_offerings(args.offerings, args.seed))
    gen_s = time.perf_counter() - t0
    say(f"synthetic catalog: {len(offerings):,} offerings generated in {gen_s:.2f} s")

    real_info: dict[str, Any] | None = None
    real_path = find_real_catalog(args.data)
    if real_path is not None and not args.no_real:
        real = load_real_catalog(real_path, args.seed)
        offerings.extend(real.offerings)
        real_info = {
            "path": str(real.path),
            "rows": real.rows,
            "offerings": len(real.offerings),
            "empty_prices_skipped": real.empty_prices,
            "rows_without_any_price": real.rows_without_price,
        }
        say(
            f"real catalog: {real.rows} rows from {real.path} -> {len(real.offerings)} offerings "
            f"({real.empty_prices} empty prices skipped, {real.rows_without_price} rows with no price at all)"
        )
    else:
        reason = "--no-real" if args.no_real else f"{REAL_CATALOG} not found (use --data or OVERSPILL_SHARED_DATA)"
        say(f"real catalog: not loaded ({reason})")

    t0 = time.perf_counter()
    book = PriceBook.build(offerings, NOW)
    build_s = time.perf_counter() - t0
    groups = {acc: len(items) for acc, items in book.by_accelerator.items()}
    say(
        f"PriceBook.build: {len(book):,} offerings, {len(groups)} accelerators "
        f"(largest group {max(groups.values(), default=0):,}) in {build_s * 1000:.1f} ms"
    )

    specs = random_specs(args.decisions, args.seed, book)
    for spec, ctx in specs[: min(50, len(specs))]:  # warm-up (not measured)
        place(spec, book, ctx)

    gc.collect()
    place_ns: list[int] = []
    cpu_ns: list[int] = []
    found_ns: list[int] = []
    none_ns: list[int] = []
    for spec, ctx in specs:
        c = time.thread_time_ns()
        t = time.perf_counter_ns()
        best = place(spec, book, ctx)
        elapsed = time.perf_counter_ns() - t
        cpu_ns.append(time.thread_time_ns() - c)
        place_ns.append(elapsed)
        (found_ns if best is not None else none_ns).append(elapsed)
    placed = len(found_ns)
    place_fig = Figures.of(place_ns)
    cpu_fig = Figures.of(cpu_ns)
    found_fig = Figures.of(found_ns) if found_ns else None
    none_fig = Figures.of(none_ns) if none_ns else None

    quote_specs = random_specs(args.quotes, args.seed + 100, book)
    quote_ns: list[int] = []
    judged = 0
    disagreements = 0
    for spec, ctx in quote_specs:
        t = time.perf_counter_ns()
        q = quote(spec, book, ctx)
        quote_ns.append(time.perf_counter_ns() - t)
        judged += len(q.candidates) + len(q.rejections)
        fast: Candidate | None = place(spec, book, ctx)
        if (fast.offering.key if fast else None) != (q.best.offering.key if q.best else None):
            disagreements += 1
    quote_fig = Figures.of(quote_ns)
    rss = peak_rss_mib()

    result: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "seed": args.seed,
        "synthetic_offerings": args.offerings,
        "real_catalog": real_info,
        "book_offerings": len(book),
        "accelerators": len(groups),
        "largest_group": max(groups.values(), default=0),
        "generate_s": round(gen_s, 3),
        "build_ms": round(build_s * 1000, 1),
        "place": {
            **place_fig.as_dict(),
            "placed": placed,
            "found_a_pool": found_fig.as_dict() if found_fig else None,
            "no_pool": none_fig.as_dict() if none_fig else None,
            "thread_cpu": cpu_fig.as_dict(),
        },
        "quote": {
            **quote_fig.as_dict(),
            "pools_judged_mean": round(judged / max(1, len(quote_specs)), 1),
            "place_disagrees_with_quote": disagreements,
        },
        "peak_rss_mib": round(rss, 1),
    }
    if not args.json:
        print()
        print(f"{'':<8}{'n':>7}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'max ms':>10}{'mean ms':>10}{'per s':>11}")
        rows = [
            ("place", place_fig),
            ("  found", found_fig),
            ("  none", none_fig),
            ("  cpu", cpu_fig),
            ("quote", quote_fig),
        ]
        for name, fig in rows:
            if fig is None:
                continue
            print(
                f"{name:<8}{fig.count:>7}{fig.p50_ms:>10.3f}{fig.p90_ms:>10.3f}{fig.p99_ms:>10.3f}"
                f"{fig.max_ms:>10.3f}{fig.mean_ms:>10.3f}{fig.per_second:>11,.0f}"
            )
        print()
        print(f"place: {placed}/{len(specs)} specs found a pool ('found' / 'none' rows split the timings)")
        print("  cpu: the same decisions in thread CPU time (what a decision costs when it is not preempted)")
        print(
            f"quote: {result['quote']['pools_judged_mean']:,} pools judged per quote on average; "
            f"place() and quote().best disagree on {disagreements}/{len(quote_specs)} specs"
        )
        print(f"peak RSS: {rss:.1f} MiB")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offerings", type=int, default=60_000, help="synthetic offerings (default 60000)")
    parser.add_argument("--decisions", type=int, default=2_000, help="timed place() calls (default 2000)")
    parser.add_argument("--quotes", type=int, default=200, help="timed quote() calls (default 200)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    parser.add_argument("--data", help="shared data folder (default $OVERSPILL_SHARED_DATA or ../shared/data)")
    parser.add_argument("--no-real", action="store_true", help="do not load the real catalog even if present")
    parser.add_argument("--json", action="store_true", help="print one JSON object of figures")
    args = parser.parse_args(argv)
    if args.offerings < 1 or args.decisions < 1 or args.quotes < 1:
        parser.error("--offerings, --decisions and --quotes must be at least 1")
    result = run(args)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
