"""Move the workload's checkpoint directory to and from the job's checkpoint prefix in the store.

Layout under the prefix (`CheckpointSpec.uri`, ending in `/`):
- `data/<sha256>`: file contents, content-addressed, so a file that did not change since the last snapshot is not
  sent again, and a half-written snapshot never overwrites anything a manifest refers to;
- `MANIFEST.json`, written last: `{"version": 1, "job_id", "placement_id", "checkpoint", "done", "total",
  "created_at", "files": [{"path", "size", "sha256"}]}`. A snapshot exists once its manifest does, so a reader
  (the next attempt, the broker's copy between stores) never sees a half-uploaded checkpoint.

Snapshot: the directory's regular files are hard-linked into a private staging directory first (renames by the
workload after that do not change what is uploaded), symbolic links are never followed (a link to a host file must
not leak it), and temporary files (`*.tmp`, names starting with `.`) are skipped. After a new manifest, the data
objects only the snapshot before the previous one referred to are deleted.

Restore: the manifest is read and checked (relative paths only, no `..`, hex digests), each file downloaded and
verified against its SHA-256 into the empty checkpoint directory; any failure raises `CheckpointError` and the
attempt is infra_failed. No manifest means no checkpoint yet (start from scratch).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from agent.compat import UTC
from agent.protocol import MANIFEST_NAME, Progress
from agent.stores import Store, StoreError

log = logging.getLogger("overspill.agent.checkpoints")
MANIFEST_VERSION = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_FILES = 100_000


class CheckpointError(Exception):
    """A checkpoint could not be restored or uploaded; the message is safe to log."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    files: tuple[FileEntry, ...]
    checkpoint: float | None = None
    done: float | None = None
    total: float | None = None
    job_id: str = ""
    placement_id: str = ""
    created_at: str = ""

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "version": MANIFEST_VERSION,
            "job_id": self.job_id,
            "placement_id": self.placement_id,
            "checkpoint": self.checkpoint,
            "done": self.done,
            "total": self.total,
            "created_at": self.created_at,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
        }
        return json.dumps(body, sort_keys=True, indent=1).encode()

    @property
    def fraction_checkpointed(self) -> float | None:
        if self.checkpoint is None or not self.total:
            return None
        return min(1.0, max(0.0, self.checkpoint / self.total))


def safe_relative_path(path: object) -> str:
    """`path` if it is a plain relative POSIX path inside a directory; raises CheckpointError otherwise."""
    if not isinstance(path, str) or not path or len(path) > 1024 or "\0" in path or "\\" in path:
        raise CheckpointError(f"manifest file path {path!r} is not a relative path")
    pure = PurePosixPath(path)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")):
        raise CheckpointError(f"manifest file path {path!r} must be relative, without '.' or '..'")
    return str(pure)


def parse_manifest(data: bytes) -> Manifest:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise CheckpointError(f"{MANIFEST_NAME} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("version") != MANIFEST_VERSION:
        raise CheckpointError(f"{MANIFEST_NAME}: version must be {MANIFEST_VERSION}")
    files = raw.get("files")
    if not isinstance(files, list) or len(files) > MAX_FILES:
        raise CheckpointError(f"{MANIFEST_NAME}: files must be a list of at most {MAX_FILES}")
    entries, seen = [], set()
    for item in files:
        if not isinstance(item, dict):
            raise CheckpointError(f"{MANIFEST_NAME}: every file must be an object")
        path = safe_relative_path(item.get("path"))
        size, digest = item.get("size"), item.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise CheckpointError(f"{MANIFEST_NAME}: size of {path!r} must be a non-negative integer")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise CheckpointError(f"{MANIFEST_NAME}: sha256 of {path!r} must be 64 lower-case hex digits")
        if path in seen:
            raise CheckpointError(f"{MANIFEST_NAME}: {path!r} is listed twice")
        seen.add(path)
        entries.append(FileEntry(path, size, digest))

    def number(name: str) -> float | None:
        v = raw.get(name)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return Manifest(
        tuple(entries),
        number("checkpoint"),
        number("done"),
        number("total"),
        str(raw.get("job_id", "")),
        str(raw.get("placement_id", "")),
        str(raw.get("created_at", "")),
    )


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fp:
        while chunk := fp.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _skipped(name: str) -> bool:
    return name.startswith(".") or name.endswith(".tmp")


class Checkpointer:
    def __init__(
        self, store: Store, prefix: str, directory: Path, staging: Path, *, job_id: str, placement_id: str
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.directory = directory
        self.staging = staging
        self.job_id = job_id
        self.placement_id = placement_id
        self._lock = threading.Lock()  # one snapshot at a time
        self._known: set[str] = set()  # data objects known to be in the store
        self._hashes: dict[tuple[int, int, int], str] = {}  # (inode, size, mtime_ns) -> sha256
        self._history: list[Manifest] = []  # manifests this agent wrote, oldest first
        self.last: Manifest | None = None  # the newest durable manifest (restored or written)

    def _data_key(self, digest: str) -> str:
        return f"{self.prefix}data/{digest}"

    # --------------------------------------------------------------------------------------------------- restore

    def restore(self) -> Manifest | None:
        """Fill the (emptied) directory from the store's newest checkpoint; None when there is none."""
        try:
            data = self.store.get(self.prefix + MANIFEST_NAME)
        except StoreError as exc:
            raise CheckpointError(f"reading the checkpoint manifest: {exc}") from None
        if data is None:
            return None
        manifest = parse_manifest(data)
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        root = self.directory.resolve()
        for entry in manifest.files:
            target = (self.directory / entry.path).resolve()
            if root not in target.parents:
                raise CheckpointError(f"manifest file path {entry.path!r} leaves the checkpoint directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                found = self.store.download(self._data_key(entry.sha256), target)
            except StoreError as exc:
                raise CheckpointError(f"downloading {entry.path}: {exc}") from None
            if not found:
                raise CheckpointError(
                    f"checkpoint file {entry.path} ({entry.sha256[:12]}...) is missing from the store"
                )
            if target.stat().st_size != entry.size or _sha256_file(target) != entry.sha256:
                raise CheckpointError(f"checkpoint file {entry.path} does not match its manifest (corrupt download)")
            self._known.add(entry.sha256)
        self.last = manifest
        self._history.append(manifest)
        return manifest

    # -------------------------------------------------------------------------------------------------- snapshot

    def _stage(self) -> list[tuple[str, Path]]:
        """Hard-link (or copy) every regular file of the directory into the staging directory."""
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir(parents=True, mode=0o700)
        staged: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(self.directory, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
            for name in sorted(filenames):
                if _skipped(name):
                    continue
                src = Path(dirpath) / name
                try:
                    st = src.lstat()
                except FileNotFoundError:  # renamed away meanwhile
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue  # symlinks, sockets, devices: never followed or read
                rel = src.relative_to(self.directory).as_posix()
                dst = self.staging / str(len(staged))
                try:
                    os.link(src, dst, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except OSError:
                    shutil.copyfile(src, dst, follow_symlinks=False)
                staged.append((rel, dst))
        return staged

    def snapshot(self, progress: Progress | None) -> Manifest | None:
        """Upload the directory as a new checkpoint (MANIFEST.json last); None when it holds no file. Raises
        CheckpointError when the store refuses it (the previous checkpoint stays the durable one)."""
        with self._lock:
            staged = self._stage()
            if not staged:
                return None
            entries = []
            try:
                for rel, path in staged:
                    st = path.stat()
                    key = (st.st_ino, st.st_size, st.st_mtime_ns)
                    digest = self._hashes.get(key) or _sha256_file(path)
                    self._hashes[key] = digest
                    if digest not in self._known:
                        self.store.put_file(self._data_key(digest), path)
                        self._known.add(digest)
                    entries.append(FileEntry(rel, st.st_size, digest))
                manifest = Manifest(
                    tuple(entries),
                    progress.checkpoint if progress else None,
                    progress.done if progress else None,
                    progress.total if progress else None,
                    self.job_id,
                    self.placement_id,
                    datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
                )
                self.store.put(self.prefix + MANIFEST_NAME, manifest.to_json(), content_type="application/json")
            except StoreError as exc:
                raise CheckpointError(f"uploading the checkpoint: {exc}") from None
            finally:
                shutil.rmtree(self.staging, ignore_errors=True)
            self.last = manifest
            self._history.append(manifest)
            self._collect()
            return manifest

    def _collect(self) -> None:
        """Delete data objects only a manifest older than the last two referred to (best effort)."""
        if len(self._history) < 3:
            return
        old = self._history.pop(0)
        keep = {f.sha256 for m in self._history for f in m.files}
        for entry in old.files:
            if entry.sha256 in keep:
                continue
            try:
                self.store.delete(self._data_key(entry.sha256))
                self._known.discard(entry.sha256)
            except StoreError as exc:
                log.info("could not delete an old checkpoint object: %s", exc)
