"""A checkpoint copy in its own process, for the crash harness:
`python -m tests.crash_copy_worker SRC_DIR MOTO_URL BUCKET STATE_DIR`.

Copies `ckpt.bin` from a local directory to `s3://BUCKET/ckpt.bin` on the moto server in 5 MiB parts, keeping its
resume state in STATE_DIR (JSON files), and calls `crashpoint("copy.between_parts")` after every part, so
`OVERSPILL_CRASHPOINT=copy.between_parts:N` kills it after part N. Prints the result as one JSON line.
"""

from __future__ import annotations

import json
import sys

from broker.crashpoints import crashpoint
from providers.storage import JsonFileCopyStateStore, copy_checkpoint
from providers.storage.local import LocalStore
from providers.storage.s3 import S3Store
from tests.moto_server import moto_client

PART = 5 * 1024 * 1024


def main() -> None:
    src_dir, moto_url, bucket, state_dir = sys.argv[1:5]
    dst = S3Store(moto_client("s3", "us-east-1", moto_url), bucket)
    result = copy_checkpoint(
        LocalStore(src_dir),
        "ckpt.bin",
        dst,
        "ckpt.bin",
        chunk_size=PART,
        state=JsonFileCopyStateStore(state_dir),
        progress=lambda done, total: crashpoint("copy.between_parts"),
    )
    print(json.dumps({"bytes": result.bytes, "resumed_from_bytes": result.resumed_from_bytes, "md5": result.md5}))


if __name__ == "__main__":
    main()
