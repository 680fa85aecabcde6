"""Import SkyPilot-format catalog files (`vms.csv`, schemas v5-v8, plain or gzip) into offerings.

Contract: `import_catalog(path, provider=None, observed_at=...)` streams the file once with the csv module and
returns an `ImportResult`: one on-demand and (when priced) one spot `Offering` per GPU instance type and zone,
priced `Price(source="catalog:<file name>", observed_at, estimated=False)`, with canonical accelerator names
(`providers.accelerators`) and per-GPU memory (GpuInfo's `SizeInMiB` when present, else the accelerator table).
The provider comes from the file name or its folder (`aws`, `gcp`, `azure`, `lambda`, ...) unless given.
An unreadable file, a missing column or a malformed row (beyond `max_malformed`) raises `FeedError` naming the
file and line; everything else is skipped or kept as below, counted by reason in `reasons` and, for the first
`MAX_WARNINGS`, explained in `warnings`.

Decisions on the catalogs' traps:
- Azure raw files leave `Generation` values such as `V1,V2` unquoted: a row with surplus fields is repaired by
  joining them back at the `Generation` column, only when every joined piece looks like a generation (`V<n>`).
- GCP lists accelerators as rows with an EMPTY InstanceType priced apart from the host. A GPU host (a2-highgpu-Ng
  = A100 xN, a2-megagpu-16g = A100 x16, a2-ultragpu-Ng = A100-80GB xN, a3-highgpu-Ng and a3-edgegpu-8g = H100 xN,
  a3-megagpu-8g = H100-MEGA x8, a3-ultragpu-8g = H200 x8, a4-highgpu-8g = B200 x8, g2-standard-N = L4 x1/2/4/8)
  is priced host + accelerator row of the same zone, for on-demand and spot alike. N1 hosts take attachable GPUs
  (K80, P4, P100, T4, V100): one offering `<host>+<ACC>x<count>` per sensible combo in a zone where both are
  priced: n1-standard or n1-highmem (highcpu's 0.9 GiB per vCPU starves a GPU's input pipeline; GCP attaches no
  GPU to memory-optimised n1-ultramem/megamem), at least N1_MIN_VCPUS_PER_GPU (4) vCPUs per GPU, and within
  GCP's documented vCPU and memory maxima for that GPU count. Other n1 hosts are CPU-only. A GPU host with no
  accelerator row in its zone, or an accelerator row no host uses, is skipped with a warning.
- An empty SpotPrice gives no spot offering; an empty on-demand Price skips the row (a spot pool without its
  on-demand twin has no counterfactual cost for the ledger). Spot >= on-demand is kept as listed (no discount).
- A price of exactly 700.0 is the catalogs' placeholder for "unknown", not a price: it is treated as missing
  (an estimated 700 would still be shown and ranked as a price). A price of 0 is missing too, except as the host
  part of a GCP VM: a4-highgpu-8g hosts are listed at 0 and their B200 row carries the whole VM price.
- Rows without an accelerator (CPU-only), TPU rows and fractional GPUs (Azure's 1/6 A10) are skipped.
- Empty AvailabilityZone (Azure, Lambda) means the region is the zone. A duplicate pool keeps its first row.
- Catalogs carry no interruption data: spot offerings get the prior of `pricing.risk.spot_prior` (AWS: the Spot
  Advisor band of the `advisor` passed in, or the assumed default band; GCP and Azure: their documented defaults),
  named in `interruption_basis`; the broker's own reclaims update it when the pools are stored.
"""

from __future__ import annotations

import csv
import gzip
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Protocol, TextIO

from pricing.advisor import SpotAdvisor
from pricing.feeds import FeedError
from pricing.risk import spot_prior
from pricing.transfer import internet_egress_usd_per_gb
from providers.accelerators import canonical, memory_gib
from providers.model import CapacityType, Offering, Price

MAX_WARNINGS = 20
PLACEHOLDER_PRICES = frozenset({Decimal("700")})
# fmt: off
KNOWN_PROVIDERS = frozenset({
    "aws", "gcp", "azure", "lambda", "oci", "ibm", "runpod", "fluidstack", "paperspace", "cudo", "vast", "nebius",
    "digitalocean", "scp", "hyperbolic", "primeintellect", "seeweb", "vsphere", "kubernetes",
})
_PROVIDER_ALIASES = {"ec2": "aws", "amazon": "aws", "google": "gcp", "gce": "gcp", "lambdalabs": "lambda"}
REQUIRED_COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "Price", "Region")
# Reasons worth a line each in `warnings` (the others are only counted).
_LOUD = frozenset({
    "missing_on_demand", "malformed", "duplicate", "no_accelerator_in_zone", "accelerator_without_host",
    "accelerator_without_instance_type", "unknown_gpu_host", "host_accelerator_mismatch",
})
# fmt: on

# GCP hosts that imply their GPUs: pattern -> (accelerator, count or None to read it from the `Ng` suffix).
_GCP_GPU_HOSTS: tuple[tuple[re.Pattern[str], str, int | None], ...] = (
    (re.compile(r"a2-highgpu-(\d+)g"), "A100", None),
    (re.compile(r"a2-megagpu-(16)g"), "A100", None),
    (re.compile(r"a2-ultragpu-(\d+)g"), "A100-80GB", None),
    (re.compile(r"a3-highgpu-(\d+)g"), "H100", None),
    (re.compile(r"a3-edgegpu-8g(-nolssd)?"), "H100", 8),
    (re.compile(r"a3-megagpu-8g"), "H100-MEGA", 8),
    (re.compile(r"a3-ultragpu-8g(-nolssd)?"), "H200", 8),
    (re.compile(r"a4-highgpu-8g"), "B200", 8),
)
_G2_L4_COUNT = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
_N1_HOST = re.compile(r"n1-(standard|highmem)-\d+")
N1_MIN_VCPUS_PER_GPU = 4
# GCP N1 + GPU limits: accelerator -> {count: (max vCPUs, max memory GiB)} (cloud.google.com/compute/docs/gpus).
N1_GPU_LIMITS: dict[str, dict[int, tuple[int, int]]] = {
    "K80": {1: (8, 52), 2: (16, 104), 4: (32, 208), 8: (64, 208)},
    "P4": {1: (24, 156), 2: (48, 312), 4: (96, 624)},
    "P100": {1: (16, 104), 2: (32, 208), 4: (96, 624)},
    "T4": {1: (48, 312), 2: (48, 312), 4: (96, 624)},
    "V100": {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)},
}
_GENERATION = re.compile(r"V\d+")
_SIZE_MIB = re.compile(r"""SizeInMiB['"]?\s*:\s*([0-9.]+)""")


@dataclass(slots=True)
class ImportResult:
    """What one file gave. `rows` counts data rows; `skipped` those that made no offering (by reason in
    `reasons`, which also counts kept oddities such as `spot_not_cheaper` or `generation_repaired`)."""

    path: Path
    provider: str
    offerings: list[Offering]
    rows: int
    skipped: int
    warnings: list[str]
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Row:
    """One catalog row reduced to what pricing needs; `used` marks GCP rows that went into an offering."""

    line: int
    instance_type: str
    accelerator: str
    count: int
    gpu_memory_gib: int
    vcpus: int
    memory_gib: Decimal
    region: str
    zone: str
    price: Decimal | None
    spot: Decimal | None
    used: bool = False


class _Malformed(Exception):
    pass


class _CsvReader(Protocol):
    line_num: int

    def __iter__(self) -> Iterator[list[str]]: ...

    def __next__(self) -> list[str]: ...


def infer_provider(path: Path) -> str | None:
    """The provider named by the file name (`gcp_vms_...csv.gz`) or, failing that, its folder (`aws/vms.csv`)."""
    for name in (path.name, path.parent.name):
        tokens = {_PROVIDER_ALIASES.get(t, t) for t in re.split(r"[^a-z0-9]+", name.lower())}
        found = tokens & KNOWN_PROVIDERS
        if len(found) == 1:
            return found.pop()
        if found:
            return None  # ambiguous
    return None


def import_catalog(
    path: Path,
    *,
    provider: str | None = None,
    observed_at: datetime,
    max_malformed: int = 0,
    advisor: SpotAdvisor | None = None,
) -> ImportResult:
    """Read one catalog file into offerings (see the module docstring for every rule)."""
    feed = f"catalog:{path.name}"
    chosen = provider.strip().lower() if provider else infer_provider(path)
    if not chosen:
        raise FeedError(feed, f"cannot tell the provider from the file name {path}; pass provider=")
    if observed_at.tzinfo is None:
        raise ValueError("observed_at must be timezone-aware (UTC)")
    importer = _Importer(path, chosen, observed_at, max_malformed, advisor)
    try:
        with _open_text(path) as fh:
            importer.read(csv.reader(fh))
    except FeedError:
        raise
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, csv.Error) as exc:
        where = f"near line {importer.line}: " if importer.line else ""
        raise FeedError(feed, f"{where}unreadable ({type(exc).__name__}: {exc})") from exc
    return importer.result()


def _open_text(path: Path) -> TextIO:
    with path.open("rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    if gzipped:
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


class _Importer:
    """State of one import: parses rows, holds GCP hosts and accelerator rows for the join, emits offerings."""

    def __init__(
        self, path: Path, provider: str, observed_at: datetime, max_malformed: int, advisor: SpotAdvisor | None = None
    ) -> None:
        self.advisor = advisor
        self.path = path
        self.feed = f"catalog:{path.name}"
        self.provider = provider
        self.observed_at = observed_at
        self.max_malformed = max_malformed
        self.egress = internet_egress_usd_per_gb(provider)
        self.gcp = provider == "gcp"
        self.line = 0  # the first physical line of the row being read
        self.rows = 0
        self.malformed = 0
        self.skipped = 0
        self.offerings: list[Offering] = []
        self.keys: set[str] = set()
        self.reasons: Counter[str] = Counter()
        self.warnings: list[str] = []
        self.gpu_hosts: list[tuple[_Row, str, int]] = []
        self.n1_hosts: list[_Row] = []
        self.accel_rows: dict[str, list[_Row]] = {}
        self._gpu_info: dict[str, int | None] = {}
        self._canonical: dict[str, str] = {}

    # -- reading -------------------------------------------------------------------------------------------------

    def read(self, reader: _CsvReader) -> None:
        self.line = 1
        header = next(reader, None)
        if not header:
            raise FeedError(self.feed, "line 1: empty file, expected a SkyPilot vms.csv header")
        names = [h.strip() for h in header]
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise FeedError(self.feed, f"line 1: missing column(s) {', '.join(missing)}; header is {names}")
        col = {n: i for i, n in enumerate(names)}
        width = len(names)
        generation = col.get("Generation")
        self.line = reader.line_num + 1
        for row in reader:
            if any(row):
                self.rows += 1
                try:
                    self._row(row if len(row) == width else self._repair(row, width, generation), col)
                except _Malformed as exc:
                    self.malformed += 1
                    if self.malformed > self.max_malformed:
                        raise FeedError(self.feed, f"line {self.line}: {exc}") from None
                    self._skip("malformed", str(exc))
            self.line = reader.line_num + 1
        if self.gcp:
            self._join_gcp()

    def _repair(self, row: list[str], width: int, generation: int | None) -> list[str]:
        surplus = len(row) - width
        if surplus > 0 and generation is not None:
            pieces = row[generation : generation + surplus + 1]
            if all(_GENERATION.fullmatch(p.strip()) for p in pieces):
                self.reasons["generation_repaired"] += 1
                return [*row[:generation], ",".join(pieces), *row[generation + surplus + 1 :]]
        raise _Malformed(f"{len(row)} fields, the header has {width}")

    def _row(self, row: list[str], col: dict[str, int]) -> None:
        itype = row[col["InstanceType"]].strip()
        acc_raw = row[col["AcceleratorName"]].strip()
        if self.gcp and itype:
            implied = _gcp_implied_gpus(itype)
            if implied is not None:
                host = self._parse(row, col, itype, "", 0)
                if acc_raw and self._canon(acc_raw) != implied[0]:
                    self._note("host_accelerator_mismatch", f"{itype} lists {acc_raw}, implies {implied[0]}")
                self.gpu_hosts.append((host, *implied))
                return
            if not acc_raw and _N1_HOST.fullmatch(itype):
                self.n1_hosts.append(self._parse(row, col, itype, "", 0))
                return
            if not acc_raw and "gpu" in itype:
                self._skip("unknown_gpu_host", f"{itype} looks like a GPU host of an unknown family")
                return
        if not acc_raw or acc_raw.lower().startswith("tpu"):
            self._skip("tpu" if acc_raw else "cpu_only")
            return
        count = _count(row[col["AcceleratorCount"]])
        if count is None:
            self._skip("fractional_gpu")
            return
        accelerator = self._canon(acc_raw)
        if itype:
            if not self._emit(self._parse(row, col, itype, accelerator, count), itype):
                self.skipped += 1
        elif self.gcp:
            self._add_accelerator_row(self._parse(row, col, "", accelerator, count))
        else:
            self._skip("accelerator_without_instance_type", f"{acc_raw} x{count} has no InstanceType")

    def _add_accelerator_row(self, r: _Row) -> None:
        same_zone = self.accel_rows.setdefault(r.zone, [])
        if any(a.accelerator == r.accelerator and a.count == r.count for a in same_zone):
            self._skip("duplicate", f"{r.accelerator} x{r.count} in {r.zone} listed twice")
            return
        same_zone.append(r)

    def _parse(self, row: list[str], col: dict[str, int], itype: str, accelerator: str, count: int) -> _Row:
        region = row[col["Region"]].strip()
        if not region:
            raise _Malformed("empty Region")
        zone_at = col.get("AvailabilityZone")
        zone = (row[zone_at].strip() if zone_at is not None else "") or region
        gpu_mem: int | None = None
        info_at = col.get("GpuInfo")
        if accelerator and info_at is not None:
            gpu_mem = self._gpu_memory(row[info_at])
        if gpu_mem is None:
            gpu_mem = memory_gib(accelerator) if accelerator else 0
        spot_at = col.get("SpotPrice")
        vcpus, memory = row[col["vCPUs"]], row[col["MemoryGiB"]]
        if not itype and not vcpus.strip() and not memory.strip():
            vcpus = memory = "0"  # a GCP accelerator row: the host brings CPUs and memory
        return _Row(
            line=self.line,
            instance_type=itype,
            accelerator=accelerator,
            count=count,
            gpu_memory_gib=gpu_mem,
            vcpus=int(_number(vcpus, "vCPUs")),
            memory_gib=_number(memory, "MemoryGiB"),
            region=region,
            zone=zone,
            price=self._price(row[col["Price"]], "Price"),
            spot=self._price(row[spot_at], "SpotPrice") if spot_at is not None else None,
        )

    def _price(self, raw: str, column: str) -> Decimal | None:
        if not raw.strip():
            return None
        value = _number(raw, column)
        if value in PLACEHOLDER_PRICES:
            self.reasons["placeholder_price"] += 1
            return None
        return value

    def _gpu_memory(self, info: str) -> int | None:
        if info not in self._gpu_info:
            m = _SIZE_MIB.search(info)
            self._gpu_info[info] = round(float(m.group(1)) / 1024) if m else None
        return self._gpu_info[info]

    def _canon(self, name: str) -> str:
        if name not in self._canonical:
            self._canonical[name] = canonical(name)
        return self._canonical[name]

    # -- GCP join ------------------------------------------------------------------------------------------------

    def _join_gcp(self) -> None:
        for host, accelerator, count in self.gpu_hosts:
            accel = next(
                (a for a in self.accel_rows.get(host.zone, ()) if a.accelerator == accelerator and a.count == count),
                None,
            )
            if accel is None:
                need = f"{host.instance_type} needs {accelerator} x{count}"
                self._skip("no_accelerator_in_zone", f"line {host.line}: {need}, {host.zone} lists no such row")
                continue
            accel.used = True
            if not self._emit(_combine(host, accel), host.instance_type, line=host.line):
                self.skipped += 1
        for host in self.n1_hosts:
            for accel in self.accel_rows.get(host.zone, ()):
                limit = N1_GPU_LIMITS.get(accel.accelerator, {}).get(accel.count)
                if limit is None or host.vcpus > limit[0] or host.memory_gib > limit[1]:
                    continue
                if host.vcpus < N1_MIN_VCPUS_PER_GPU * accel.count:
                    continue
                itype = f"{host.instance_type}+{accel.accelerator}x{accel.count}"
                if self._emit(_combine(host, accel), itype, line=host.line):
                    host.used = accel.used = True
            if not host.used:
                self.skipped += 1
                self.reasons["cpu_only"] += 1
        for rows in self.accel_rows.values():
            for accel in rows:
                if not accel.used:
                    what = f"{accel.accelerator} x{accel.count} in {accel.zone}"
                    self._skip("accelerator_without_host", f"line {accel.line}: {what} has no host there")

    # -- emitting ------------------------------------------------------------------------------------------------

    def _emit(self, r: _Row, itype: str, *, line: int | None = None) -> bool:
        """Add the row's on-demand (and spot) offerings; False when it gives none."""
        where = f"line {line or r.line}: {itype} in {r.zone}"
        if not r.price:  # None (empty or placeholder) or 0
            self._skip("missing_on_demand", f"{where} has no on-demand price", count=False)
            return False
        on_demand = self._offering(r, itype, CapacityType.ON_DEMAND, r.price)
        if on_demand.key in self.keys:
            self._skip("duplicate", f"{where} repeats pool {on_demand.key}", count=False)
            return False
        self.keys.add(on_demand.key)
        self.offerings.append(on_demand)
        if not r.spot:
            self.reasons["no_spot_price"] += 1
            return True
        if r.spot >= r.price:
            self.reasons["spot_not_cheaper"] += 1
        spot = self._offering(r, itype, CapacityType.SPOT, r.spot)
        if spot.key not in self.keys:
            self.keys.add(spot.key)
            self.offerings.append(spot)
        return True

    def _offering(self, r: _Row, itype: str, capacity: CapacityType, hourly: Decimal) -> Offering:
        spot = capacity is CapacityType.SPOT
        prior = spot_prior(self.provider, r.region, itype, self.advisor) if spot else None
        return Offering(
            provider=self.provider,
            region=r.region,
            zone=r.zone,
            instance_type=itype,
            accelerator=r.accelerator,
            accelerator_count=r.count,
            gpu_memory_gib=r.gpu_memory_gib,
            vcpus=r.vcpus,
            memory_gib=r.memory_gib,
            capacity_type=capacity,
            price=Price(hourly, self.feed, self.observed_at),
            egress_usd_per_gb=self.egress,
            interruption_rate_per_hour=prior.rate_per_hour if prior else 0.0,
            interruption_basis=f"catalog prior: {prior.basis}"[:200] if prior else "",
        )

    def _skip(self, reason: str, detail: str = "", *, count: bool = True) -> None:
        """Count a skipped row under `reason` (and as skipped unless the caller counts it itself)."""
        if count:
            self.skipped += 1
        self._note(reason, detail if detail.startswith("line ") else f"line {self.line}: {detail}")

    def _note(self, reason: str, detail: str) -> None:
        self.reasons[reason] += 1
        if reason in _LOUD and len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(f"{self.feed} {reason}: {detail}")

    def result(self) -> ImportResult:
        summary = [f"{self.feed} {reason}: {n}" for reason, n in sorted(self.reasons.items())]
        return ImportResult(
            path=self.path,
            provider=self.provider,
            offerings=self.offerings,
            rows=self.rows,
            skipped=self.skipped,
            warnings=[*self.warnings, *summary],
            reasons=dict(self.reasons),
        )


def _gcp_implied_gpus(itype: str) -> tuple[str, int] | None:
    """The GPUs a GCP host type carries (`a3-highgpu-8g` -> H100 x8), None for hosts without built-in GPUs."""
    if itype.startswith("g2-standard-"):
        vcpus = itype.removeprefix("g2-standard-")
        count = _G2_L4_COUNT.get(int(vcpus)) if vcpus.isdigit() else None
        return ("L4", count) if count else None
    for pattern, accelerator, fixed in _GCP_GPU_HOSTS:
        m = pattern.fullmatch(itype)
        if m:
            return accelerator, fixed if fixed is not None else int(m.group(1))
    return None


def _combine(host: _Row, accel: _Row) -> _Row:
    """A GCP VM: the host's shape with the accelerator's GPUs, prices summed (spot only when both have one)."""
    price = host.price + accel.price if host.price is not None and accel.price is not None else None
    spot = host.spot + accel.spot if host.spot is not None and accel.spot is not None else None
    return replace(
        host,
        accelerator=accel.accelerator,
        count=accel.count,
        gpu_memory_gib=accel.gpu_memory_gib,
        price=price,
        spot=spot,
        used=False,
    )


def _number(raw: str, column: str) -> Decimal:
    try:
        value = Decimal(raw.strip())
    except InvalidOperation:
        raise _Malformed(f"{column} {raw!r} is not a number") from None
    if not value.is_finite() or value < 0:
        raise _Malformed(f"{column} {raw!r} is not a non-negative number")
    return value


def _count(raw: str) -> int | None:
    """A whole GPU count, None for a fraction of a GPU."""
    value = _number(raw, "AcceleratorCount")
    if value == 0:
        raise _Malformed("AcceleratorCount is 0 for a named accelerator")
    return int(value) if value == value.to_integral_value() else None
