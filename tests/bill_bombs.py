"""Hostile billing exports for the bill-upload attack tests and benchmarks/security_bench.py: a gzip bomb (valid
FOCUS CSV rows, repeated, compressed about 1000:1) and a Parquet bomb (one long ResourceId repeated through a
dictionary page and run-length-encoded indices: a few KB on disk, gigabytes once decoded). Both are built in
bounded memory."""

from __future__ import annotations

import zlib
from pathlib import Path

HEADER = b"ResourceId,BilledCost,EffectiveCost,ListCost,ChargePeriodStart,ProviderName\n"
ROW = b"i-0a1b2c3d4e5f60001,0.01,0.01,0.03,2026-10-01T00:00:00Z,AWS\n"


def gzip_bomb(decompressed_bytes: int) -> bytes:
    """A .csv.gz whose CSV (a header and the same valid row) is about `decompressed_bytes` long."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [packer.compress(HEADER)]
    block = ROW * (1024 * 1024 // len(ROW))
    written = len(HEADER)
    while written < decompressed_bytes:
        out.append(packer.compress(block))
        written += len(block)
    out.append(packer.flush())
    return b"".join(out)


def parquet_bomb(path: Path, rows: int, value_bytes: int) -> int:
    """Write a Parquet FOCUS file of `rows` rows whose ResourceId is one `value_bytes`-long value; returns its size
    on disk. Decoded, the ResourceId column alone is `rows * value_bytes` bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def repeat(value: object, kind: pa.DataType) -> pa.DictionaryArray:
        indices = pa.array([0] * rows, type=pa.int32())
        return pa.DictionaryArray.from_arrays(indices, pa.array([value], type=kind))

    table = pa.table(
        {
            "ResourceId": repeat("i-" + "a" * (value_bytes - 2), pa.string()),
            "BilledCost": repeat(0.01, pa.float64()),
            "ChargePeriodStart": repeat("2026-10-01T00:00:00Z", pa.string()),
            "ProviderName": repeat("AWS", pa.string()),
        }
    )
    pq.write_table(table, path, compression="zstd", row_group_size=rows, write_statistics=False)
    return path.stat().st_size
