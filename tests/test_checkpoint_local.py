"""Checkpoint storage pieces that need no emulator: URI parsing and resolution, the part reader, copy states, and
local-to-local copies that crash, resume, meet torn parts and changed sources. Runs in a couple of seconds.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.storage import (
    CopyState,
    JsonFileCopyStateStore,
    LocalStore,
    MemoryCopyStateStore,
    ObjectNotFound,
    SourceChanged,
    StorageError,
    StoreClients,
    UnsafeKey,
    copy_checkpoint,
    parse_uri,
    resolve,
)
from providers.storage.copy import choose_part_size
from providers.storage.parts import PartReader
from tests.storage_emulators import Crash, RecordingStore, crash_after

MiB = 1024 * 1024
CHUNK = 8 * MiB


@pytest.mark.parametrize(
    ("uri", "scheme", "container", "key"),
    [
        ("s3://ckpts/jobs/j1/step-100.pt", "s3", "ckpts", "jobs/j1/step-100.pt"),
        ("gs://ckpts/a%20b/c", "gs", "ckpts", "a b/c"),
        ("az://ckpts/jobs/j1", "az", "ckpts", "jobs/j1"),
        ("https://acct.blob.core.windows.net/ckpts/jobs/j1?sv=x", "az", "ckpts", "jobs/j1"),
        ("file:///var/lib/overspill/j1.pt", "file", "", "/var/lib/overspill/j1.pt"),
    ],
)
def test_parse_uri(uri: str, scheme: str, container: str, key: str) -> None:
    parsed = parse_uri(uri)
    assert (parsed.scheme, parsed.container, parsed.key) == (scheme, container, key)


def test_parse_uri_under_an_emulator_endpoint() -> None:
    parsed = parse_uri(
        "http://127.0.0.1:10000/devstoreaccount1/ckpts/j1", azure_endpoint="http://127.0.0.1:10000/devstoreaccount1/"
    )
    assert (parsed.scheme, parsed.container, parsed.key) == ("az", "ckpts", "j1")


@pytest.mark.parametrize("uri", ["s3://bucket", "ftp://x/y", "file://host/x", "https://example.com/a/b", "gs:///k"])
def test_parse_uri_rejects_what_it_cannot_place(uri: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_uri(uri)
    assert repr(uri) in str(err.value)


def test_resolve_needs_the_client_for_the_scheme() -> None:
    with pytest.raises(StorageError, match="no S3 client"):
        resolve("s3://b/k", StoreClients(), within="s3://b/")


def test_resolve_builds_adapters_from_injected_clients() -> None:
    boto3 = pytest.importorskip("boto3")
    blob = pytest.importorskip("azure.storage.blob")
    from providers.storage.azure_blob import AzureBlobStore
    from providers.storage.s3 import S3Store

    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    azure = blob.BlobServiceClient("https://acct.blob.core.windows.net", credential=None)
    clients = StoreClients(s3=s3, azure=azure)
    store, key = resolve("s3://ckpts/j1/a.pt", clients, within="s3://ckpts/")
    assert isinstance(store, S3Store) and key == "j1/a.pt" and store.uri(key) == "s3://ckpts/j1/a.pt"
    store, key = resolve("s3://ckpts/t/j1/a.pt", clients, within="s3://ckpts/t/")  # confined to a prefix
    assert isinstance(store, S3Store) and key == "j1/a.pt" and store.uri(key) == "s3://ckpts/t/j1/a.pt"
    store, key = resolve(
        "https://acct.blob.core.windows.net/ckpts/j1/a.pt", clients, within="https://acct.blob.core.windows.net/ckpts/"
    )
    assert isinstance(store, AzureBlobStore) and store.uri(key) == "az://ckpts/j1/a.pt"
    with pytest.raises(StorageError, match=r"not other\.blob"):
        resolve(
            "https://other.blob.core.windows.net/ckpts/j1/a.pt",
            clients,
            within="https://other.blob.core.windows.net/ckpts/",
        )


@pytest.mark.parametrize(
    "uri",
    [
        "s3://ckpts/t/../u/a.pt",
        "s3://ckpts/t/%2e%2e/u/a.pt",
        "s3://ckpts/t/",
        "s3://ckpts/tx/a.pt",
        "s3://other/t/a.pt",
        "gs://ckpts/t/a.pt",
        "s3://ckpts/t//a.pt",
        "s3://ckpts/t/a%00.pt",
        "s3://ckpts/t/a%5Cb",
    ],
)
def test_resolve_refuses_what_is_not_beneath_the_prefix(uri: str) -> None:
    with pytest.raises(UnsafeKey):
        resolve(uri, StoreClients(s3=object()), within="s3://ckpts/t/")  # type: ignore[arg-type]


def test_local_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    with pytest.raises(UnsafeKey, match=r"'\.\.' path segment"):
        LocalStore(tmp_path).stat("../etc/passwd")


def test_choose_part_size() -> None:
    assert choose_part_size(64 * MiB, CHUNK) == CHUNK
    assert choose_part_size(1024**4, CHUNK) == 105 * MiB  # 1 TiB in at most 10,000 parts
    with pytest.raises(ValueError, match="chunk_size"):
        choose_part_size(MiB, MiB)


def _pieces(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_part_reader_cuts_uneven_chunks_into_parts() -> None:
    data = os.urandom(20 * MiB + 5)
    reader = PartReader(_pieces(data, 3 * MiB), size=len(data), part_size=CHUNK)
    parts = list(reader)
    reader.close()
    assert [len(p.data) for p in parts] == [CHUNK, CHUNK, 4 * MiB + 5]
    assert b"".join(p.data for p in parts) == data
    assert [p.md5 for p in parts] == [hashlib.md5(p.data).hexdigest() for p in parts]
    digests = reader.digests()
    assert digests.sha256 == hashlib.sha256(data).hexdigest()
    assert digests.md5 == hashlib.md5(data).hexdigest()


def test_part_reader_reports_a_source_shorter_than_its_stat() -> None:
    reader = PartReader(_pieces(b"x" * 100, 30), size=200, part_size=CHUNK, uri="s3://b/k")
    with pytest.raises(SourceChanged, match="ended after 100 of 200"):
        list(reader)
    reader.close()


def test_part_reader_close_stops_reading_early() -> None:
    pulled: list[int] = []

    def source() -> Iterator[bytes]:
        for i in range(100):
            pulled.append(i)
            yield b"\0" * CHUNK

    reader = PartReader(source(), size=100 * CHUNK, part_size=CHUNK)
    next(iter(reader))
    reader.close()
    assert len(pulled) <= 3


def test_json_state_store_round_trip_is_private(tmp_path: Path) -> None:
    store = JsonFileCopyStateStore(tmp_path / "states")
    state = CopyState("s3://a/b", "gs://c/d", 10, '"etag"', CHUNK, "https://session", bytes_done=5)
    store.save("c1", state)
    assert store.load("c1") == state
    assert stat.S_IMODE((tmp_path / "states" / "c1.json").stat().st_mode) == 0o600
    store.delete("c1")
    store.delete("c1")
    assert store.load("c1") is None


@pytest.fixture
def local(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def _put(store: LocalStore, key: str, data: bytes) -> None:
    store.path(key).parent.mkdir(parents=True, exist_ok=True)
    store.path(key).write_bytes(data)


def test_copy_by_file_uris(tmp_path: Path) -> None:
    data = os.urandom(CHUNK + 7)
    (tmp_path / "a.pt").write_bytes(data)
    root = tmp_path.as_uri() + "/"
    src, src_key = resolve((tmp_path / "a.pt").as_uri(), StoreClients(), within=root)
    dst, dst_key = resolve((tmp_path / "out" / "b.pt").as_uri(), StoreClients(), within=root)
    result = copy_checkpoint(src, src_key, dst, dst_key)
    assert (tmp_path / "out" / "b.pt").read_bytes() == data
    assert result.dst_uri == (tmp_path / "out" / "b.pt").as_uri()
    assert not (tmp_path / "out" / "b.pt.partial").exists()


def test_missing_local_source(local: LocalStore) -> None:
    with pytest.raises(
        ObjectNotFound, match=r"checkpoint file://.*/nope\.pt does not exist, so it cannot be copied to file://"
    ):
        copy_checkpoint(local, "nope.pt", local, "dst.pt")


def test_resume_resends_a_part_torn_by_the_crash(local: LocalStore) -> None:
    data = os.urandom(3 * CHUNK + 1000)
    _put(local, "src.pt", data)
    states = MemoryCopyStateStore()
    with pytest.raises(Crash):
        copy_checkpoint(local, "src.pt", local, "dst.pt", state=states, progress=crash_after(2 * CHUNK))
    partial = local.path("dst.pt.partial")
    with partial.open("r+b") as f:  # the crash tore part 1
        f.seek(10)
        f.write(b"\xff\xfe")

    recorder = RecordingStore(local)
    result = copy_checkpoint(local, "src.pt", recorder, "dst.pt", state=states)

    assert recorder.sent == [1, 3, 4]
    assert result.resumed_from_bytes == CHUNK
    assert local.path("dst.pt").read_bytes() == data
    assert states.states == {}


def test_a_source_changed_since_the_crash_starts_over(local: LocalStore) -> None:
    _put(local, "src.pt", os.urandom(3 * CHUNK))
    states = MemoryCopyStateStore()
    with pytest.raises(Crash):
        copy_checkpoint(local, "src.pt", local, "dst.pt", state=states, progress=crash_after(CHUNK))
    newer = os.urandom(3 * CHUNK)
    _put(local, "src.pt", newer)
    os.utime(local.path("src.pt"), ns=(1, 1))  # a different version even on a coarse-mtime filesystem

    recorder = RecordingStore(local)
    result = copy_checkpoint(local, "src.pt", recorder, "dst.pt", state=states)

    assert result.resumed_from_bytes == 0
    assert recorder.sent == [1, 2, 3]
    assert local.path("dst.pt").read_bytes() == newer
