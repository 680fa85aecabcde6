"""Checkpoints in a local (or mounted) filesystem directory, behind the `ObjectStore` contract, confined to it.

Confinement. Every key is checked by `safe_key` (no `..`, no absolute path, no NUL or backslash...), and every path
is then walked from the root one directory at a time with directory file descriptors opened `O_NOFOLLOW |
O_DIRECTORY`, so a symlink anywhere below the root (planted by whoever can write there) is never followed: a walk
that meets one raises `UnsafePath`. Files are opened relative to their directory's descriptor with `O_NOFOLLOW |
O_NONBLOCK` and `fstat`-checked: only regular files are read or written, so a FIFO, device, socket or directory
where a checkpoint is expected is refused at once instead of blocking the caller. Hard links are refused wherever
symlinks are: a file read, stat'ed or listed, and an upload's partial file, must have a single link (a hard link
planted by whoever can write there would read out, or write through to, another file on the same filesystem, e.g.
the broker's database). `list` does not descend into symlinked directories and returns only regular files with
one link. The root itself is resolved once, when the store is made:
it is the operator's choice, not an object name. A store may be narrowed to a `prefix` beneath the root (a
tenant's area, a job's checkpoint directory): keys are then joined beneath the prefix, and the prefix's own
directories are walked from the root like any other, so a symlink planted in them is not followed either (a
store opened *at* such a directory, by resolving its path, would follow it: open the trusted root and narrow).

Uploads. An upload writes `<key>.partial` next to the target, each part at its own offset; `complete` truncates it
to the final size, fsyncs it, renames it over `<key>` (a rename replaces a symlink at `<key>`, it never writes
through it) and fsyncs the directory, so a reader sees the old object or the whole new one, never a torn file.
Resume needs no remote state: the token is the partial file's name, and `completed_parts` re-hashes the parts the
partial file already holds (local reads are cheap), so a part torn by a crash is found by its MD5 and sent again.
No checksum is stored, so `digests_match` is None (read it back).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

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
from providers.storage.keys import safe_key, safe_list_prefix, safe_store_prefix

PARTIAL_SUFFIX = ".partial"
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_RW_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_ESCAPES = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)  # a symlink where O_NOFOLLOW was asked, or a non-directory


class UnsafePath(StorageError):
    """A key whose path goes through a symlink, or lands on something other than a regular file of its own (a FIFO,
    device, socket, directory, symlink or multiply-linked file): the local store refuses to touch it."""


def _version(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}-{st.st_size}"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


class LocalStore:
    """Objects are regular files under `root` (and under `prefix` in it, empty or ending in `/`); see the module
    docstring for what a key may and may not reach."""

    def __init__(self, root: Path | str, *, prefix: str = "") -> None:
        self.root = Path(root).resolve()
        self.prefix = safe_store_prefix(prefix)

    def path(self, key: str) -> Path:
        """Where `key` is, for display and tests: the lexical path under the root. The store itself never opens
        it by name (a symlink on the way would be followed); it walks descriptors instead."""
        return self.root / (self.prefix + safe_key(key))

    def uri(self, key: str) -> str:
        return f"{self.root.as_uri().rstrip('/')}/{quote(self.prefix + key, safe='/')}"

    # -- descriptor walk ---------------------------------------------------------------------------------------

    def _unsafe(self, key: str, what: str) -> UnsafePath:
        return UnsafePath(f"{self.uri(key)}: {what}; refused", uri=self.uri(key))

    def _open_dir(self, key: str, dir_fd: int, name: str, *, create: bool) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno in _ESCAPES:
                raise self._unsafe(key, f"path component {name!r} is a symlink or not a directory") from exc
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, dir_fd=dir_fd)
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in _ESCAPES:  # replaced by a symlink between mkdir and open
                raise self._unsafe(key, f"path component {name!r} is a symlink or not a directory") from exc
            raise

    @contextlib.contextmanager
    def _parent(self, key: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """`(descriptor of the directory holding key, key's last segment)`, walked from the root through the
        prefix without following symlinks. Raises FileNotFoundError when a directory on the way is missing (and
        `create` is False)."""
        segments = (self.prefix + safe_key(key)).split("/")
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for name in segments[:-1]:
                child = self._open_dir(key, fd, name, create=create)
                os.close(fd)
                fd = child
            yield fd, segments[-1]
        finally:
            os.close(fd)

    def _open_file(self, key: str, dir_fd: int, name: str, flags: int, *, single_link: bool = False) -> int:
        """Open `name` in `dir_fd` without following a symlink or blocking on a FIFO; only a regular file."""
        try:
            fd = os.open(name, flags, 0o666, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in _ESCAPES:
                raise self._unsafe(key, f"{name!r} is a symlink") from exc
            if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
                raise self._unsafe(key, f"{name!r} is a FIFO, not a regular file") from exc
            if exc.errno == errno.EISDIR:
                raise self._unsafe(key, f"{name!r} is a directory, not a regular file") from exc
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (single_link and st.st_nlink != 1):
            os.close(fd)
            what = _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links"
            raise self._unsafe(key, f"{name!r} is a {what}, not a regular file of its own")
        return fd

    # -- reads ---------------------------------------------------------------------------------------------------

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            with self._parent(key) as (dir_fd, name):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise self._unsafe(key, f"it is a {_kind(st.st_mode)}, not a regular file")
        if st.st_nlink != 1:
            raise self._unsafe(key, f"it is a file with {st.st_nlink} hard links, not a regular file of its own")
        return ObjectInfo(key=key, size=st.st_size, version=_version(st))

    def open_read(
        self, key: str, offset: int = 0, *, chunk_size: int = DEFAULT_CHUNK_SIZE, version: str | None = None
    ) -> Iterator[bytes]:
        try:
            with self._parent(key) as (dir_fd, name):
                fd = self._open_file(key, dir_fd, name, _READ_FLAGS, single_link=True)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{self.uri(key)} does not exist", uri=self.uri(key)) from exc
        f = os.fdopen(fd, "rb")
        if version is not None and _version(os.fstat(fd)) != version:
            f.close()
            raise SourceChanged(f"{self.uri(key)} changed since it was stat'ed", uri=self.uri(key))
        f.seek(offset)
        return self._chunks(f, chunk_size)

    @staticmethod
    def _chunks(f: BinaryIO, chunk_size: int) -> Iterator[bytes]:
        with f:
            while chunk := f.read(chunk_size):
                yield chunk

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Regular files whose key starts with `prefix`, in key order; symlinks, special files, partial uploads
        and anything below a symlinked directory are left out."""
        full = self.prefix + safe_list_prefix(prefix)
        base = full.rsplit("/", 1)[0] if "/" in full else ""
        try:
            if base:
                with LocalStore(self.root)._parent(base + "/x") as (dir_fd, _):
                    fd = os.dup(dir_fd)
            else:
                fd = os.open(self.root, _DIR_FLAGS)
        except FileNotFoundError:
            return
        for info in self._walk(fd, base + "/" if base else "", full):
            yield ObjectInfo(key=info.key[len(self.prefix) :], size=info.size, version=info.version)

    def _walk(self, dir_fd: int, rel: str, prefix: str) -> Iterator[ObjectInfo]:
        """Entries of the directory `dir_fd` (at root-relative path `rel`), depth first; closes `dir_fd`."""
        try:
            with os.scandir(dir_fd) as it:
                names = sorted(entry.name for entry in it)
            for name in names:
                key = rel + name
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode) and (key + "/").startswith(prefix[: len(key) + 1]):
                    try:
                        child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                    except OSError:
                        continue  # replaced by a symlink (or removed) since the stat: skip it
                    yield from self._walk(child, key + "/", prefix)
                elif (
                    stat.S_ISREG(st.st_mode)
                    and st.st_nlink == 1
                    and key.startswith(prefix)
                    and not name.endswith(PARTIAL_SUFFIX)
                ):
                    yield ObjectInfo(key=key, size=st.st_size, version=_version(st))
        finally:
            os.close(dir_fd)

    def digests_match(self, info: ObjectInfo, digests: Digests) -> bool | None:
        return None

    # -- writes --------------------------------------------------------------------------------------------------

    def begin_upload(self, key: str, *, size: int, part_size: int) -> LocalUpload:
        with self._parent(key, create=True) as (dir_fd, name):
            fd = self._open_file(key, dir_fd, name + PARTIAL_SUFFIX, _RW_FLAGS | os.O_CREAT, single_link=True)
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        return LocalUpload(self, key, size=size, part_size=part_size)

    def resume_upload(self, key: str, token: str, *, size: int, part_size: int) -> LocalUpload:
        name = safe_key(key).rsplit("/", 1)[-1] + PARTIAL_SUFFIX
        if token != name:
            raise UploadGone(f"no partial upload {token!r} to resume at {self.uri(key)}", uri=self.uri(key))
        try:
            os.close(self.open_partial(key))
        except FileNotFoundError as exc:
            raise UploadGone(f"no partial upload {name} to resume", uri=self.uri(key)) from exc
        return LocalUpload(self, key, size=size, part_size=part_size)

    def open_partial(self, key: str) -> int:
        """A read-write descriptor of `key`'s partial upload (a regular, singly-linked file); FileNotFoundError
        when there is none."""
        with self._parent(key) as (dir_fd, name):
            return self._open_file(key, dir_fd, name + PARTIAL_SUFFIX, _RW_FLAGS, single_link=True)

    def publish(self, key: str) -> None:
        """Rename `key`'s partial upload over `key` and make the rename durable."""
        with self._parent(key) as (dir_fd, name):
            try:
                os.replace(name + PARTIAL_SUFFIX, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except IsADirectoryError as exc:
                raise self._unsafe(key, f"{name!r} is a directory") from exc
            os.fsync(dir_fd)

    def delete(self, key: str) -> None:
        self._unlink(key, "")

    def _unlink(self, key: str, suffix: str) -> None:
        try:
            with self._parent(key) as (dir_fd, name):
                os.unlink(name + suffix, dir_fd=dir_fd)  # removes a symlink itself, never its target
        except FileNotFoundError:
            return
        except IsADirectoryError as exc:
            raise self._unsafe(key, "it is a directory") from exc


class LocalUpload:
    """Parts written in place into `<key>.partial`; see `LocalStore`. Every call re-walks the path."""

    def __init__(self, store: LocalStore, key: str, *, size: int, part_size: int) -> None:
        self._store = store
        self._key = key
        self._size = size
        self._part_size = part_size

    @property
    def token(self) -> str:
        return self._key.rsplit("/", 1)[-1] + PARTIAL_SUFFIX

    def _open(self, when: str) -> int:
        try:
            return self._store.open_partial(self._key)
        except FileNotFoundError as exc:
            uri = self._store.uri(self._key)
            raise UploadGone(f"the partial upload of {uri} vanished {when}", uri=uri) from exc

    def upload_part(self, number: int, data: bytes, *, md5: str | None = None) -> PartInfo:
        fd = self._open("during the upload")
        try:
            view, at = memoryview(data), (number - 1) * self._part_size
            while view:
                written = os.pwrite(fd, view, at)
                view, at = view[written:], at + written
        finally:
            os.close(fd)
        return PartInfo(number=number, size=len(data), md5=md5 or hashlib.md5(data).hexdigest())

    def completed_parts(self) -> list[PartInfo]:
        parts: list[PartInfo] = []
        try:
            fd = self._store.open_partial(self._key)
        except FileNotFoundError:
            return parts
        with os.fdopen(fd, "rb") as f:
            have = os.fstat(fd).st_size
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
        fd = self._open("before completion")
        try:
            os.ftruncate(fd, digests.size)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._store.publish(self._key)

    def abort(self) -> None:
        self._store._unlink(self._key, PARTIAL_SUFFIX)
