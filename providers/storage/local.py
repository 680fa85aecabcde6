"""Checkpoints in a local (or mounted) filesystem directory, behind the `ObjectStore` contract.

An upload writes `<key>.partial` next to the target, each part at its own offset; `complete` truncates it to the
final size, fsyncs it, renames it over `<key>` and fsyncs the directory, so a reader sees the old object or the
whole new one, never a torn file. Resume needs no remote state: the token is the partial file's name, and
`completed_parts` re-hashes the parts the partial file already holds (local reads are cheap), so a part torn by
a crash is found by its MD5 and sent again. No checksum is stored, so `digests_match` is None (read it back).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from providers.storage.base import (
    DEFAULT_CHUNK_SIZE,
    Digests,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    SourceChanged,
    StorageError,
    UploadGone,
    part_count,
    part_length,
)

PARTIAL_SUFFIX = ".partial"


def _version(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}-{st.st_size}"


class LocalStore:
    """Objects are files under `root`; a key is a relative path (no `..`, no leading `/`)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()

    def path(self, key: str) -> Path:
        target = (self.root / key.lstrip("/")).resolve()
        if target != self.root and self.root not in target.parents:
            raise StorageError(f"key {key!r} escapes the store root {self.root}", uri=self.uri(key))
        return target

    def uri(self, key: str) -> str:
        return (self.root / key.lstrip("/")).as_uri()

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self.path(key).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key=key, size=st.st_size, version=_version(st))

    def open_read(
        self, key: str, offset: int = 0, *, chunk_size: int = DEFAULT_CHUNK_SIZE, version: str | None = None
    ) -> Iterator[bytes]:
        try:
            f = self.path(key).open("rb")
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{self.uri(key)} does not exist", uri=self.uri(key)) from exc
        if version is not None and _version(os.fstat(f.fileno())) != version:
            f.close()
            raise SourceChanged(f"{self.uri(key)} changed since it was stat'ed", uri=self.uri(key))
        f.seek(offset)
        return self._chunks(f, chunk_size)

    @staticmethod
    def _chunks(f: BinaryIO, chunk_size: int) -> Iterator[bytes]:
        with f:
            while chunk := f.read(chunk_size):
                yield chunk

    def begin_upload(self, key: str, *, size: int, part_size: int) -> LocalUpload:
        partial = self._partial(key)
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(b"")
        return LocalUpload(self, key, partial, size=size, part_size=part_size)

    def resume_upload(self, key: str, token: str, *, size: int, part_size: int) -> LocalUpload:
        partial = self._partial(key)
        if token != partial.name or not partial.exists():
            raise UploadGone(f"no partial upload {partial} to resume", uri=self.uri(key))
        return LocalUpload(self, key, partial, size=size, part_size=part_size)

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = self.path(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        if not base.is_dir():
            return
        for dirpath, _dirs, files in os.walk(base):
            for name in sorted(files):
                rel = (Path(dirpath) / name).relative_to(self.root).as_posix()
                if rel.startswith(prefix) and not name.endswith(PARTIAL_SUFFIX):
                    info = self.stat(rel)
                    if info is not None:
                        yield info

    def digests_match(self, info: ObjectInfo, digests: Digests) -> bool | None:
        return None

    def _partial(self, key: str) -> Path:
        target = self.path(key)
        return target.with_name(target.name + PARTIAL_SUFFIX)


class LocalUpload:
    """Parts written in place into `<key>.partial`; see `LocalStore`."""

    def __init__(self, store: LocalStore, key: str, partial: Path, *, size: int, part_size: int) -> None:
        self._store = store
        self._key = key
        self._partial = partial
        self._size = size
        self._part_size = part_size

    @property
    def token(self) -> str:
        return self._partial.name

    def upload_part(self, number: int, data: bytes, *, md5: str | None = None) -> PartInfo:
        try:
            with self._partial.open("r+b") as f:
                f.seek((number - 1) * self._part_size)
                f.write(data)
        except FileNotFoundError as exc:
            raise UploadGone(f"{self._partial} vanished during the upload", uri=self._store.uri(self._key)) from exc
        return PartInfo(number=number, size=len(data), md5=md5 or hashlib.md5(data).hexdigest())

    def completed_parts(self) -> list[PartInfo]:
        parts: list[PartInfo] = []
        try:
            have = self._partial.stat().st_size
            f = self._partial.open("rb")
        except FileNotFoundError:
            return parts
        with f:
            for number in range(1, part_count(self._size, self._part_size) + 1):
                want = part_length(number, self._size, self._part_size)
                if (number - 1) * self._part_size + want > have:
                    break
                data = f.read(want)
                parts.append(PartInfo(number=number, size=want, md5=hashlib.md5(data).hexdigest()))
        return parts

    def complete(self, parts: Sequence[PartInfo], digests: Digests) -> None:
        uri = self._store.uri(self._key)
        if sum(p.size for p in parts) != digests.size:
            raise StorageError(f"parts of {uri} add up to {sum(p.size for p in parts)} bytes, not {digests.size}")
        try:
            with self._partial.open("r+b") as f:
                f.truncate(digests.size)
                f.flush()
                os.fsync(f.fileno())
        except FileNotFoundError as exc:
            raise UploadGone(f"{self._partial} vanished before completion", uri=uri) from exc
        target = self._store.path(self._key)
        os.replace(self._partial, target)
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def abort(self) -> None:
        self._partial.unlink(missing_ok=True)
