"""Checkpoint copies between real emulators (moto S3, gcp-storage-emulator, Azurite) and local files: byte-identical
results on every hop, bounded memory, resume after a crash without re-uploading, corruption and missing-source
errors. Objects are 16-64 MiB of random bytes in 8 MiB parts; the whole module runs in well under a minute.
"""

from __future__ import annotations

import hashlib
import os
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests

from providers.storage import (
    ChecksumMismatch,
    JsonFileCopyStateStore,
    LocalStore,
    MemoryCopyStateStore,
    ObjectNotFound,
    ObjectStore,
    Verify,
    copy_checkpoint,
    verify_object,
)
from tests.storage_emulators import Crash, RecordingStore, crash_after

pytest_plugins = ["tests.storage_emulators"]

MiB = 1024 * 1024
CHUNK = 8 * MiB


@dataclass
class Backend:
    """A store under test plus native SDK calls to seed and inspect it without going through the adapter."""

    name: str
    store: ObjectStore
    put: Callable[[str, bytes], None]
    get: Callable[[str], bytes]


@pytest.fixture(scope="session")
def s3_backend(s3_client: Any) -> Backend:
    from providers.storage.s3 import S3Store

    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    s3_client.create_bucket(Bucket=bucket)
    return Backend(
        "s3",
        S3Store(s3_client, bucket),
        put=lambda k, d: s3_client.put_object(Bucket=bucket, Key=k, Body=d),
        get=lambda k: s3_client.get_object(Bucket=bucket, Key=k)["Body"].read(),
    )


@pytest.fixture(scope="session")
def gcs_backend(gcs_client: Any) -> Backend:
    from providers.storage.gcs import GCSStore

    bucket = gcs_client.create_bucket(f"ckpt-{uuid.uuid4().hex[:8]}")
    return Backend(
        "gcs",
        GCSStore(gcs_client, bucket.name),
        put=lambda k, d: bucket.blob(k).upload_from_string(d),
        get=lambda k: bucket.blob(k).download_as_bytes(),
    )


@pytest.fixture(scope="session")
def azure_backend(azure_service: Any) -> Backend:
    from providers.storage.azure_blob import AzureBlobStore

    container = azure_service.create_container(f"ckpt-{uuid.uuid4().hex[:8]}")
    return Backend(
        "azure",
        AzureBlobStore(container),
        put=lambda k, d: container.upload_blob(k, d, overwrite=True),
        get=lambda k: container.download_blob(k).readall(),
    )


@pytest.fixture(scope="session")
def local_backend(tmp_path_factory: pytest.TempPathFactory) -> Backend:
    store = LocalStore(tmp_path_factory.mktemp("ckpt-local"))

    def put(key: str, data: bytes) -> None:
        store.path(key).parent.mkdir(parents=True, exist_ok=True)
        store.path(key).write_bytes(data)

    return Backend("local", store, put=put, get=lambda k: store.path(k).read_bytes())


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Callable[[str], Backend]:
    return lambda name: request.getfixturevalue(f"{name}_backend")


def _key(label: str) -> str:
    return f"jobs/{label}-{uuid.uuid4().hex[:8]}/ckpt.bin"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


PAIRS = [("s3", "gcs"), ("gcs", "azure"), ("azure", "s3"), ("local", "s3"), ("s3", "local")]
STORE_CHECKSUM = {"s3", "gcs"}  # stores whose own checksum verifies a copy without reading it back


@pytest.mark.integration
@pytest.mark.parametrize(("src_name", "dst_name"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_copy_is_byte_identical(src_name: str, dst_name: str, backend: Callable[[str], Backend]) -> None:
    src, dst = backend(src_name), backend(dst_name)
    data = os.urandom(24 * MiB + 4097)  # three full parts and a short one
    src_key, dst_key = _key("src"), _key("dst")
    src.put(src_key, data)
    seen: list[int] = []

    result = copy_checkpoint(src.store, src_key, dst.store, dst_key, progress=lambda done, _total: seen.append(done))

    assert result.sha256 == _sha(data)
    assert _sha(dst.get(dst_key)) == _sha(data)
    assert result.bytes == len(data)
    assert result.resumed_from_bytes == 0
    assert result.egress_gb == Decimal(len(data)) / Decimal(2**30)
    assert result.verified_by == ("store-checksum" if dst_name in STORE_CHECKSUM else "read-back")
    assert seen == [CHUNK, 2 * CHUNK, 3 * CHUNK, len(data)]


@pytest.mark.integration
def test_copy_memory_stays_within_a_few_chunks(gcs_backend: Backend, local_backend: Backend) -> None:
    """GCS (out of process) to local files, so tracemalloc sees only the copy's own allocations: moto runs in this
    process and would count its stored objects, and the Azure SDK's `list()` over a response generator with a
    `__len__` preallocates 8 bytes of pointers per body byte (64 MiB per 8 MiB window, virtual, never touched:
    tracemalloc counts it, RSS does not)."""
    key = _key("big")
    gcs_backend.put(key, os.urandom(64 * MiB))
    tracemalloc.start()
    try:
        result = copy_checkpoint(gcs_backend.store, key, local_backend.store, key, chunk_size=CHUNK)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.bytes == 64 * MiB
    assert peak < 4 * CHUNK, f"peak {peak / MiB:.1f} MiB for a 64 MiB copy in {CHUNK // MiB} MiB chunks"


@pytest.mark.integration
@pytest.mark.parametrize("dst_name", ["s3", "gcs", "azure", "local"])
def test_crashed_copy_resumes_without_resending_parts(
    dst_name: str, backend: Callable[[str], Backend], local_backend: Backend, tmp_path: Path
) -> None:
    dst = backend(dst_name)
    data = os.urandom(24 * MiB + 1000)
    src_key, dst_key = _key("src"), _key("dst")
    local_backend.put(src_key, data)
    states = tmp_path / "copy-states"
    first = RecordingStore(dst.store)

    with pytest.raises(Crash):
        copy_checkpoint(
            local_backend.store,
            src_key,
            first,
            dst_key,
            state=JsonFileCopyStateStore(states),
            progress=crash_after(2 * CHUNK),
        )
    assert first.sent == [1, 2]
    assert dst.store.stat(dst_key) is None, "nothing may be visible before complete()"
    assert len(list(states.glob("*.json"))) == 1

    second = RecordingStore(dst.store)
    result = copy_checkpoint(local_backend.store, src_key, second, dst_key, state=JsonFileCopyStateStore(states))

    assert second.sent == [3, 4], "parts the store already held were uploaded again"
    assert result.resumed_from_bytes == 2 * CHUNK
    assert result.egress_gb == Decimal(len(data)) / Decimal(2**30), "the prefix is re-read from the source"
    assert result.sha256 == _sha(data)
    assert _sha(dst.get(dst_key)) == _sha(data)
    assert list(states.glob("*.json")) == []


@pytest.mark.integration
@pytest.mark.parametrize("dst_name", ["s3", "gcs", "azure", "local"])
def test_corruption_in_transit_is_caught_and_the_object_removed(
    dst_name: str, backend: Callable[[str], Backend], local_backend: Backend
) -> None:
    dst = backend(dst_name)
    data = os.urandom(2 * CHUNK + 1)
    src_key, dst_key = _key("src"), _key("dst")
    local_backend.put(src_key, data)

    with pytest.raises(ChecksumMismatch) as err:
        copy_checkpoint(local_backend.store, src_key, RecordingStore(dst.store, corrupt_part=2), dst_key)

    assert dst_key in str(err.value)
    assert dst.store.stat(dst_key) is None, "a corrupt checkpoint must not be left behind"


@pytest.mark.integration
@pytest.mark.parametrize("dst_name", ["s3", "gcs", "azure", "local"])
def test_object_corrupted_after_upload_fails_verification(
    dst_name: str, backend: Callable[[str], Backend], local_backend: Backend
) -> None:
    dst = backend(dst_name)
    data = os.urandom(2 * CHUNK + 1)
    src_key, dst_key = _key("src"), _key("dst")
    local_backend.put(src_key, data)
    result = copy_checkpoint(local_backend.store, src_key, dst.store, dst_key)
    verify_object(dst.store, dst_key, result.digests, mode=Verify.READ_BACK)

    dst.put(dst_key, data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped

    for mode in (Verify.AUTO, Verify.READ_BACK):
        with pytest.raises(ChecksumMismatch, match="corrupt"):
            verify_object(dst.store, dst_key, result.digests, mode=mode)


@pytest.mark.integration
@pytest.mark.parametrize("src_name", ["s3", "gcs", "azure", "local"])
def test_missing_source_is_object_not_found(
    src_name: str, backend: Callable[[str], Backend], local_backend: Backend
) -> None:
    src = backend(src_name)
    key = _key("missing")
    with pytest.raises(ObjectNotFound, match="does not exist, so it cannot be copied") as err:
        copy_checkpoint(src.store, key, local_backend.store, _key("dst"))
    assert src.store.uri(key) in str(err.value)
    assert err.value.uri == src.store.uri(key)


@pytest.mark.integration
@pytest.mark.parametrize("dst_name", ["s3", "gcs", "azure", "local"])
def test_empty_checkpoint_copies(dst_name: str, backend: Callable[[str], Backend], local_backend: Backend) -> None:
    dst = backend(dst_name)
    src_key, dst_key = _key("empty"), _key("empty")
    local_backend.put(src_key, b"")
    result = copy_checkpoint(local_backend.store, src_key, dst.store, dst_key)
    assert result.sha256 == _sha(b"")
    assert dst.get(dst_key) == b""


@pytest.mark.integration
def test_gcs_resume_continues_from_a_mid_part_offset(gcs_backend: Backend, local_backend: Backend) -> None:
    """GCS may persist only part of a chunk; the session resumes from the server's offset, not the part's start."""
    data = os.urandom(3 * CHUNK + 10)
    src_key, dst_key = _key("src"), _key("dst")
    local_backend.put(src_key, data)
    states = MemoryCopyStateStore()
    with pytest.raises(Crash):
        copy_checkpoint(local_backend.store, src_key, gcs_backend.store, dst_key, state=states, progress=crash_after(1))
    (state,) = states.states.values()
    half = CHUNK + CHUNK // 2  # the server holds part 1 and half of part 2
    resp = requests.put(state.token, data=data[CHUNK:half], headers={"Content-Range": f"bytes {CHUNK}-{half - 1}/*"})
    assert resp.status_code == 308

    recorder = RecordingStore(gcs_backend.store)
    result = copy_checkpoint(local_backend.store, src_key, recorder, dst_key, state=states)

    assert recorder.sent == [2, 3, 4]
    assert result.resumed_from_bytes == CHUNK
    assert _sha(gcs_backend.get(dst_key)) == _sha(data)
