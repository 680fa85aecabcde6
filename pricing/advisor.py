"""AWS Spot Instance Advisor: interruption-frequency bands per region, OS and instance type, as hourly rates.

Role: the prior for a spot pool's `interruption_rate_per_hour` (see `pricing.risk`, which later blends it with what
the broker itself saw). AWS publishes the advisor as a public JSON document (no API, no SLA):
`{"ranges": [{"index": 1, "label": "5-10%", "max": 11, ...}, ...],
"spot_advisor": {region: {"Linux"|"Windows": {instance_type: {"r": range index, "s": savings %}}}}}`.
The shared data also holds the same bands flattened to CSV (`spot-advisor-gpu-interruption-bands.csv`).

Contract:
- A band's label is a monthly interruption frequency ("the share of spot instances of this type and region that
  were reclaimed over the last month"). `Band.monthly_fraction` is the band's midpoint (2.5%, 7.5%, 12.5%, 17.5%,
  25% for the five standard bands) and `Band.rate_per_hour` the constant hazard that reclaims that fraction in a
  30-day month: `-ln(1 - p) / 720`.
- `SpotAdvisor.band(region, instance_type)` returns `None` when the advisor has no entry; callers choose their
  own default and say so in the offering's `interruption_basis`.
- `fetch_advisor(http_get)` never opens a connection itself: the caller injects the URL fetch, so tests run offline.
  Any failure to fetch or parse becomes a `pricing.feeds.FeedError` naming the feed "aws-spot-advisor".
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pricing.feeds import FeedError

SPOT_ADVISOR_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
FEED_NAME = "aws-spot-advisor"
HOURS_PER_MONTH = 30 * 24

# The five bands AWS has published since 2018, with the midpoints the broker uses as the band's frequency.
STANDARD_LABELS: dict[int, str] = {0: "<5%", 1: "5-10%", 2: "10-15%", 3: "15-20%", 4: ">20%"}
_MIDPOINTS: dict[str, float] = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}


def monthly_fraction(label: str) -> float:
    """The midpoint monthly interruption fraction of a band label ("<5%", "5-10%", ">20%", ...)."""
    text = label.strip().replace(" ", "")
    if text in _MIDPOINTS:
        return _MIDPOINTS[text]
    if m := re.fullmatch(r"<(\d+(?:\.\d+)?)%", text):
        return float(m.group(1)) / 200
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)%", text):
        return (float(m.group(1)) + float(m.group(2))) / 200
    if m := re.fullmatch(r">(\d+(?:\.\d+)?)%", text):
        return min(0.99, float(m.group(1)) * 1.25 / 100)
    raise ValueError(f"not a spot advisor band label: {label!r}")


def rate_per_hour(fraction_per_month: float) -> float:
    """The constant hourly hazard that interrupts `fraction_per_month` of instances over a 30-day month."""
    return -math.log1p(-fraction_per_month) / HOURS_PER_MONTH


@dataclass(frozen=True, slots=True)
class Band:
    """One advisor band for one (region, OS, instance type). `savings_pct` is the advisor's saving vs on-demand."""

    index: int
    label: str
    monthly_fraction: float
    savings_pct: int | None = None

    @classmethod
    def of(cls, index: int, label: str | None = None, savings_pct: int | None = None) -> Band:
        text = label if label is not None else STANDARD_LABELS[index]
        return cls(index, text, monthly_fraction(text), savings_pct)

    @property
    def rate_per_hour(self) -> float:
        return rate_per_hour(self.monthly_fraction)

    def describe(self, source: str = FEED_NAME) -> str:
        """The band as an interruption basis, e.g. `aws-spot-advisor band 1 (5-10%/month)`."""
        return f"{source} band {self.index} ({self.label}/month)"


class SpotAdvisor:
    """Advisor bands keyed by (region, OS, instance type). Build with `from_json`, `from_bands_csv` or
    `fetch_advisor`; `band()` looks one up (OS defaults to Linux)."""

    def __init__(self, bands: Mapping[tuple[str, str, str], Band], source: str = FEED_NAME, as_of: str = "") -> None:
        self._bands = dict(bands)
        self.source = source
        self.as_of = as_of

    def __len__(self) -> int:
        return len(self._bands)

    @property
    def regions(self) -> frozenset[str]:
        return frozenset(region for region, _, _ in self._bands)

    def band(self, region: str, instance_type: str, os: str = "Linux") -> Band | None:
        return self._bands.get((region, os, instance_type))

    def items(self) -> Iterable[tuple[tuple[str, str, str], Band]]:
        return self._bands.items()

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any], source: str = FEED_NAME, as_of: str = "") -> SpotAdvisor:
        """Parse the advisor JSON document (raw bytes, gzip-compressed bytes, text, or already decoded)."""
        doc: Any
        if isinstance(data, bytes):
            raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
            doc = json.loads(raw)
        elif isinstance(data, str):
            doc = json.loads(data)
        else:
            doc = data
        if not isinstance(doc, Mapping) or not isinstance(doc.get("spot_advisor"), Mapping):
            raise ValueError("spot advisor JSON has no 'spot_advisor' object")
        labels = dict(STANDARD_LABELS)
        for entry in doc.get("ranges") or ():
            labels[int(entry["index"])] = str(entry["label"])
        bands: dict[tuple[str, str, str], Band] = {}
        for region, by_os in doc["spot_advisor"].items():
            for os_name, by_type in by_os.items():
                for instance_type, entry in by_type.items():
                    index = int(entry["r"])
                    savings = entry.get("s")
                    bands[(region, os_name, instance_type)] = Band.of(
                        index, labels.get(index), int(savings) if savings is not None else None
                    )
        return cls(bands, source, as_of)

    @classmethod
    def from_bands_csv(cls, path: Path | str, source: str = FEED_NAME) -> SpotAdvisor:
        """Parse the flattened CSV (`snapshot_date,region,os,instance_type,interruption_band_index,
        interruption_band_label,savings_pct_vs_ondemand`)."""
        bands: dict[tuple[str, str, str], Band] = {}
        dates: set[str] = set()
        with Path(path).open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                savings = (row.get("savings_pct_vs_ondemand") or "").strip()
                bands[(row["region"], row["os"], row["instance_type"])] = Band.of(
                    int(row["interruption_band_index"]),
                    row.get("interruption_band_label") or None,
                    int(savings) if savings else None,
                )
                if row.get("snapshot_date"):
                    dates.add(row["snapshot_date"])
        return cls(bands, source, max(dates) if dates else "")


def fetch_advisor(http_get: Callable[[str], bytes], url: str = SPOT_ADVISOR_URL) -> SpotAdvisor:
    """Fetch and parse the public advisor document through the injected `http_get(url) -> body bytes`."""
    try:
        body = http_get(url)
    except Exception as exc:
        raise FeedError(FEED_NAME, f"could not fetch {url}: {type(exc).__name__}: {exc}") from exc
    try:
        return SpotAdvisor.from_json(body)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise FeedError(FEED_NAME, f"unusable document from {url}: {type(exc).__name__}: {exc}") from exc
