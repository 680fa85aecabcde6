"""Reading provider billing exports (CSV, CSV.gz, Parquet) as rows, with bounded memory and CPU whatever the file.

A bill is uploaded by a finance key, so a small file must not be able to cost gigabytes once decompressed. Contract
of `read_rows(path, limits)`: yields each row as a dict of column -> value and raises `BillTooLarge` (the API's
413, naming the limit and its setting) as soon as a limit is passed, or `BillError` (422) for a file it cannot
read; it never holds more than one chunk of the file, one line and (Parquet) one batch of rows at a time.

- CSV and CSV.gz are streamed: the gzip stream (several members allowed) is inflated a chunk at a time, never
  more than `max_bytes` in all, and beyond its first MiB never more than `max_ratio` times the compressed bytes
  read so far (real exports compress 5-30x; a bomb does ~1000x, so it is refused after about one MiB of output,
  in milliseconds); text is decoded incrementally and split into lines of at most `MAX_LINE_BYTES`; at most
  `max_columns` columns and `max_rows` rows. A plain CSV larger than `max_bytes` is refused before it is read.
- Parquet: the footer is read first: more than `max_rows` rows or `max_columns` columns, or an uncompressed size of
  the wanted columns over `max_bytes`, is refused before any data page is read. Then the wanted columns are read a
  batch of `PARQUET_BATCH_ROWS` rows at a time, string columns kept dictionary-encoded (a dictionary-encoded bomb
  repeats one huge value: it is measured before it is expanded); the rows and the bytes actually decoded are
  counted against the same limits, so a footer that lies does not get further; beyond the first MiB the decoded
  bytes may not pass `max_ratio` times the pages' stated size (a dictionary or run-length bomb does), and no value
  may be longer than `MAX_FIELD_BYTES`.
"""

from __future__ import annotations

import codecs
import csv
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from broker.config.settings import Settings

REQUIRED = ("ResourceId", "BilledCost", "ChargePeriodStart")
OPTIONAL = ("EffectiveCost", "ListCost", "ProviderName", "BillingPeriodStart", "BillingPeriodEnd")
MAX_LINE_BYTES = 1024 * 1024
MAX_FIELD_BYTES = 64 * 1024
PARQUET_BATCH_ROWS = 4096
_READ = 64 * 1024
_INFLATE = 256 * 1024
_RATIO_AFTER = 1024 * 1024


class BillError(ValueError):
    """The file is not a FOCUS-form billing export the broker can read (names the column or row)."""


class BillTooLarge(BillError):
    """The file passes one of the size limits (names it and the setting that raises it)."""


@dataclass(frozen=True)
class BillLimits:
    max_bytes: int = 256 * 1024 * 1024
    max_rows: int = 2_000_000
    max_columns: int = 400
    max_ratio: float = 100.0

    @classmethod
    def from_settings(cls, settings: Settings) -> BillLimits:
        return cls(
            max_bytes=settings.bill_max_decompressed_bytes,
            max_rows=settings.bill_max_rows,
            max_columns=settings.bill_max_columns,
            max_ratio=settings.bill_max_expansion_ratio,
        )


def read_rows(path: Path, limits: BillLimits | None = None) -> Iterator[dict[str, Any]]:
    """Rows of a FOCUS export as dicts (CSV, CSV.gz or Parquet by file name), within `limits`."""
    limits = limits or BillLimits()
    name = path.name.lower()
    if name.endswith(".parquet"):
        yield from _parquet_rows(path, limits)
        return
    gz = name.endswith(".gz")
    if not gz and path.stat().st_size > limits.max_bytes:
        raise BillTooLarge(_over_bytes(path.name, limits))
    with path.open("rb") as raw:
        chunks = _inflate(raw, path.name, limits) if gz else _plain(raw)
        lines = _lines(chunks, path.name, gz)
        reader = csv.DictReader(lines)
        try:
            header = reader.fieldnames or []
        except csv.Error as exc:
            raise BillError(f"{path.name}: the header line is not CSV ({exc})") from exc
        _check_columns(header, limits)
        rows = 0
        try:
            for row in reader:
                rows += 1
                if rows > limits.max_rows:
                    raise BillTooLarge(_over_rows(path.name, limits))
                yield row
        except csv.Error as exc:
            raise BillError(f"row {reader.line_num}: not CSV ({exc})") from exc


def _over_bytes(name: str, limits: BillLimits) -> str:
    return (
        f"{name} is larger than {limits.max_bytes} bytes once decompressed "
        "(the limit is OVERSPILL_BILL_MAX_DECOMPRESSED_BYTES)"
    )


def _over_ratio(name: str, limits: BillLimits) -> str:
    return (
        f"{name} grows more than {limits.max_ratio:g} times once decompressed or decoded, which no billing export "
        "does (a decompression bomb?); the limit is OVERSPILL_BILL_MAX_EXPANSION_RATIO"
    )


def _over_rows(name: str, limits: BillLimits) -> str:
    return f"{name} has more than {limits.max_rows} rows (the limit is OVERSPILL_BILL_MAX_ROWS)"


def _check_columns(header: list[str], limits: BillLimits) -> None:
    if len(header) > limits.max_columns:
        raise BillTooLarge(
            f"the bill has {len(header)} columns, more than {limits.max_columns} "
            "(the limit is OVERSPILL_BILL_MAX_COLUMNS)"
        )
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise BillError(f"column {missing[0]} is missing (a FOCUS export has {', '.join(REQUIRED)})")


def _plain(raw: IO[bytes]) -> Iterator[bytes]:
    while chunk := raw.read(_READ):
        yield chunk


def _inflate(raw: IO[bytes], name: str, limits: BillLimits) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file (one or more members), a bounded chunk at a time."""
    inflater = zlib.decompressobj(wbits=31)
    pending = b""
    read = produced = 0
    started = False
    while True:
        if not pending:
            pending = raw.read(_READ)
            read += len(pending)
            if not pending:
                break
        try:
            out = inflater.decompress(pending, _INFLATE)
        except zlib.error as exc:
            raise BillError(f"{name} is not a readable gzip-compressed UTF-8 CSV file ({exc})") from exc
        started = True
        pending = inflater.unconsumed_tail
        if inflater.eof:  # the end of one gzip member; another may follow
            pending = inflater.unused_data + pending
            inflater = zlib.decompressobj(wbits=31)
            started = False
        produced += len(out)
        if produced > limits.max_bytes:
            raise BillTooLarge(_over_bytes(name, limits))
        consumed = max(1, read - len(pending))
        if produced > _RATIO_AFTER and produced > limits.max_ratio * consumed:
            raise BillTooLarge(_over_ratio(name, limits))
        if out:
            yield out
    if started:
        raise BillError(f"{name} is not a readable gzip-compressed UTF-8 CSV file (it ends in the middle of a stream)")


def _lines(chunks: Iterator[bytes], name: str, gz: bool) -> Iterator[str]:
    """Decoded lines (with their line ends), each at most MAX_LINE_BYTES characters."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    pending = ""

    def decode(chunk: bytes, final: bool = False) -> str:
        try:
            return decoder.decode(chunk, final)
        except UnicodeDecodeError as exc:
            what = "gzip-compressed " if gz else ""
            raise BillError(f"{name} is not a readable {what}UTF-8 CSV file ({exc})") from exc

    for chunk in chunks:
        pending += decode(chunk)
        start = 0
        while (end := pending.find("\n", start)) >= 0:
            yield pending[start : end + 1]
            start = end + 1
        pending = pending[start:]
        if len(pending) > MAX_LINE_BYTES:
            raise BillTooLarge(f"{name} has a line longer than {MAX_LINE_BYTES} characters")
    pending += decode(b"", final=True)
    if pending:
        yield pending


def _parquet_rows(path: Path, limits: BillLimits) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise BillError("reading Parquet needs pyarrow (pip install 'overspill[parquet]')") from exc
    try:
        meta = pq.read_metadata(path)
        schema = pq.read_schema(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
        raise BillError(f"{path.name} is not a readable Parquet file ({exc})") from exc
    if meta.num_rows > limits.max_rows:
        raise BillTooLarge(_over_rows(path.name, limits))
    _check_columns(list(schema.names), limits)
    wanted = [c for c in (*REQUIRED, *OPTIONAL) if c in schema.names]
    leaf = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    indices = [leaf[c] for c in wanted if c in leaf]
    declared = sum(
        meta.row_group(g).column(i).total_uncompressed_size for g in range(meta.num_row_groups) for i in indices
    )
    if declared > limits.max_bytes:
        raise BillTooLarge(_over_bytes(path.name, limits))
    strings = [
        c
        for c in wanted
        if pa.types.is_string(t := schema.field(c).type) or pa.types.is_large_string(t) or pa.types.is_binary(t)
    ]
    rows = decoded = 0
    try:
        reader = pq.ParquetFile(path, read_dictionary=strings)
        for batch in reader.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted, use_threads=False):
            rows += batch.num_rows
            if rows > limits.max_rows:
                raise BillTooLarge(_over_rows(path.name, limits))
            for name, column in zip(batch.schema.names, batch.columns, strict=True):
                if isinstance(column, pa.DictionaryArray):
                    lengths = pc.binary_length(column.dictionary)
                    longest = pc.max(lengths).as_py() or 0
                    if longest > MAX_FIELD_BYTES:
                        raise BillTooLarge(f"column {name} has a value longer than {MAX_FIELD_BYTES} bytes")
                    decoded += int(pc.sum(pc.take(lengths, column.indices)).as_py() or 0)
                else:
                    decoded += column.nbytes
            if decoded > limits.max_bytes:
                raise BillTooLarge(_over_bytes(path.name, limits))
            if decoded > _RATIO_AFTER and decoded > limits.max_ratio * max(declared, 1):
                raise BillTooLarge(_over_ratio(path.name, limits))
            yield from batch.to_pylist()
    except (OSError, ValueError) as exc:
        if isinstance(exc, BillError):
            raise
        raise BillError(f"{path.name} is not a readable Parquet file ({exc})") from exc
