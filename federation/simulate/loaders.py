"""Read the public traces the simulator replays, from a path the caller gives (nothing is copied or downloaded).

Contract: each loader reads one file format and returns `federation.simulate.traces` values, raising
`ValueError` naming the file when it is not of that format.
- `load_segments_csv`: SkyNomad's joined availability + spot price segments
  (`zone,start_utc,end_utc,ticks,available,spot_price_usd_per_hr`), resampled onto a uniform grid.
- `load_availability_json`: "Can't Be Late" spot-traces files (`{"metadata": {"gap_seconds"}, "data": [0/1...]}`,
  1 = available), one file per zone, priced at a constant spot price.
- `load_on_demand_prices`: on-demand price per region of one instance type from a SkyPilot-format catalog.
- `load_gcp_probes`: SkyNomad's GCP spot launch probes (`scheduled_utc,zone,requested,created,capacity_exhausted`),
  a zone counted available at a probe when at least `need` of the requested VMs were created, priced per zone from
  the GCP SkyPilot catalog (`load_gcp_zone_prices`: host row + accelerator row).
- `load_philly`: the Philly job trace (`#job id,arrival time (sec),topology,shape,size,duration (sec)`).
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from federation.simulate.traces import EPOCH, Segment, SpotTrace, TraceJob, ZoneSeries, region_of, resample


def _utc_seconds(text: str) -> float:
    return datetime.fromisoformat(text.strip()).replace(tzinfo=UTC).timestamp()


def load_segments_csv(
    path: Path,
    on_demand_usd: Mapping[str, float],
    gap_seconds: int = 300,
    zones: Sequence[str] | None = None,
) -> SpotTrace:
    """A segments file on a `gap_seconds` grid over the window all (chosen) zones cover."""
    segments: dict[str, list[Segment]] = {}
    try:
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                zone = row["zone"]
                if zones is not None and zone not in zones:
                    continue
                segments.setdefault(zone, []).append(
                    Segment(
                        _utc_seconds(row["start_utc"]),
                        _utc_seconds(row["end_utc"]),
                        row["available"].strip() == "1",
                        float(row["spot_price_usd_per_hr"]),
                    )
                )
    except (OSError, KeyError, ValueError, csv.Error) as exc:
        raise ValueError(f"{path}: not an availability/price segments file ({exc})") from exc
    if not segments:
        raise ValueError(f"{path}: no rows for zones {list(zones or [])}")
    for segs in segments.values():
        segs.sort(key=lambda s: s.start)
    missing = {region_of(z) for z in segments} - set(on_demand_usd)
    if missing:
        raise ValueError(f"no on-demand price for regions {sorted(missing)}")
    return resample(segments, gap_seconds, on_demand_usd, source=f"{path.name}@{gap_seconds}s")


def load_availability_json(
    paths: Mapping[str, Path], spot_usd: Mapping[str, float], on_demand_usd: Mapping[str, float]
) -> SpotTrace:
    """Zone name -> spot-traces JSON file; every file must share one `gap_seconds`; trimmed to the shortest."""
    series: list[tuple[str, list[bool]]] = []
    gap: int | None = None
    for zone, path in paths.items():
        try:
            doc = json.loads(path.read_text())
            g = int(doc["metadata"]["gap_seconds"])
            bits = [int(v) > 0 for v in doc["data"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a spot availability trace ({exc})") from exc
        if gap is not None and g != gap:
            raise ValueError(f"{path}: gap_seconds {g} differs from {gap}")
        gap = g
        series.append((zone, bits))
    if gap is None:
        raise ValueError("no trace files given")
    n = min(len(b) for _, b in series)
    zones = tuple(
        ZoneSeries(z, region_of(z), tuple(b[:n]), tuple(float(spot_usd[z]) for _ in range(n))) for z, b in series
    )
    return SpotTrace(EPOCH, gap, zones, dict(on_demand_usd), source="spot-traces")


def load_spot_prices(path: Path, instance_type: str) -> dict[str, float]:
    """Region -> the cheapest spot USD/h of `instance_type` over its zones in a SkyPilot-format `vms.csv`."""
    prices: dict[str, float] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row.get("InstanceType") != instance_type or not row.get("SpotPrice"):
                continue
            try:
                value = float(row["SpotPrice"])
            except ValueError:
                continue
            region = row["Region"]
            prices[region] = min(value, prices.get(region, value))
    return prices


def load_on_demand_prices(path: Path, instance_type: str) -> dict[str, float]:
    """Region -> on-demand USD/h of `instance_type` in a SkyPilot-format `vms.csv` (first priced row wins)."""
    prices: dict[str, float] = {}
    try:
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("InstanceType") == instance_type and row.get("Price"):
                    prices.setdefault(row["Region"], float(row["Price"]))
    except (OSError, KeyError, ValueError, csv.Error) as exc:
        raise ValueError(f"{path}: not a SkyPilot catalog ({exc})") from exc
    if not prices:
        raise ValueError(f"{path}: no priced rows for {instance_type}")
    return prices


def load_philly(path: Path, limit: int | None = None, skip: int = 0) -> list[TraceJob]:
    """Jobs `skip` .. `skip + limit` of the Philly trace, arrivals re-based to the first kept job."""
    jobs: list[TraceJob] = []
    try:
        with path.open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader)
            if len(header) < 6 or "arrival" not in header[1]:
                raise ValueError(f"unexpected header {header}")
            for i, row in enumerate(reader):
                if i < skip:
                    continue
                if limit is not None and len(jobs) >= limit:
                    break
                jobs.append(TraceJob(row[0], float(row[1]), int(row[4]), float(row[5])))
    except (OSError, ValueError, IndexError, StopIteration, csv.Error) as exc:
        raise ValueError(f"{path}: not a Philly job trace ({exc})") from exc
    if not jobs:
        return jobs
    t0 = jobs[0].arrival_s
    return [TraceJob(j.id, j.arrival_s - t0, j.gpus, j.duration_s) for j in jobs]


def load_gcp_zone_prices(
    path: Path, host_type: str, accelerator: str, count: int = 1
) -> dict[str, tuple[str, float, float]]:
    """Zone -> (region, on-demand USD/h, spot USD/h) of a GCP VM in a SkyPilot-format GCP catalog, where a VM's
    price is its host row (`InstanceType` = `host_type`) plus its accelerator row (empty `InstanceType`,
    `AcceleratorName` x `AcceleratorCount`). Zones missing either row, or either price, are left out."""
    hosts: dict[str, tuple[str, float, float]] = {}
    accs: dict[str, tuple[float, float]] = {}
    try:
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                if not row.get("Price") or not row.get("SpotPrice"):
                    continue
                zone, prices = row["AvailabilityZone"], (float(row["Price"]), float(row["SpotPrice"]))
                if row["InstanceType"] == host_type:
                    hosts[zone] = (row["Region"], *prices)
                elif (
                    not row["InstanceType"]
                    and row["AcceleratorName"] == accelerator
                    and float(row["AcceleratorCount"] or 0) == count
                ):
                    accs[zone] = prices
    except (OSError, KeyError, ValueError, csv.Error) as exc:
        raise ValueError(f"{path}: not a SkyPilot GCP catalog ({exc})") from exc
    return {z: (r, od + accs[z][0], spot + accs[z][1]) for z, (r, od, spot) in hosts.items() if z in accs}


def load_gcp_probes(
    path: Path,
    prices: Mapping[str, tuple[str, float, float]],
    need: int = 1,
    vms: int = 1,
    zones: Sequence[str] | None = None,
) -> SpotTrace:
    """The probes of `path` on their own grid (the probe interval; a missing probe repeats the zone's last one): a
    zone is up at a probe when `created` >= `need`. A pool is `vms` VMs, priced `vms` x the zone's catalog price
    (`prices`, from `load_gcp_zone_prices`); the on-demand price of a region is its cheapest zone's."""
    probes: dict[str, dict[float, bool]] = {}
    try:
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                zone = row["zone"]
                if zones is not None and zone not in zones:
                    continue
                at = datetime.fromisoformat(row["scheduled_utc"].replace("Z", "+00:00")).timestamp()
                probes.setdefault(zone, {})[at] = int(row["created"]) >= need
    except (OSError, KeyError, ValueError, csv.Error) as exc:
        raise ValueError(f"{path}: not a GCP spot probe file ({exc})") from exc
    if not probes:
        raise ValueError(f"{path}: no probes for zones {list(zones or [])}")
    missing = sorted(set(probes) - set(prices))
    if missing:
        raise ValueError(f"no catalog price for zones {missing}")
    times = sorted({t for by in probes.values() for t in by})
    gap = int(min(b - a for a, b in itertools.pairwise(times))) if len(times) > 1 else 600
    n = int((times[-1] - times[0]) // gap) + 1
    series = []
    for zone in sorted(probes):
        by, bits, last = probes[zone], [], False
        for i in range(n):
            last = by.get(times[0] + i * gap, last)
            bits.append(last)
        region, _, spot = prices[zone]
        series.append(ZoneSeries(zone, region, tuple(bits), tuple(spot * vms for _ in range(n))))
    od: dict[str, float] = {}
    for zone in probes:
        region, price, _ = prices[zone]
        od[region] = min(price * vms, od.get(region, price * vms))
    start = datetime.fromtimestamp(times[0], UTC)
    return SpotTrace(start, gap, tuple(series), od, provider="gcp", source=f"{path.name} (created >= {need})")
