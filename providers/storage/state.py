"""Where a checkpoint copy keeps what it needs to resume after a crash: the `CopyStateStore` contract and two
implementations (in memory, one JSON file per copy). The broker plugs in a database-backed one.

Contract: `save` is durable when it returns and replaces any earlier state of the same copy id; `load` returns
the last saved state or None; `delete` converges. A state is small (no data, no hash state): which source version
was being copied, in which part size, and the destination's upload token. That token can be a capability (a GCS
session URL lets its holder write the object for a week), so keep states where only the broker can read them;
the JSON store writes its files with mode 0600.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class CopyState:
    """The resumable part of one copy. `bytes_done` is informational (the store's own listing is authoritative)."""

    src_uri: str
    dst_uri: str
    size: int
    src_version: str | None
    part_size: int
    token: str
    bytes_done: int = 0

    def with_progress(self, bytes_done: int) -> CopyState:
        return replace(self, bytes_done=bytes_done)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CopyState:
        return cls(
            src_uri=str(data["src_uri"]),
            dst_uri=str(data["dst_uri"]),
            size=int(data["size"]),
            src_version=None if data.get("src_version") is None else str(data["src_version"]),
            part_size=int(data["part_size"]),
            token=str(data["token"]),
            bytes_done=int(data.get("bytes_done", 0)),
        )


def copy_id_for(src_uri: str, dst_uri: str) -> str:
    """The default id of the copy of `src_uri` to `dst_uri`: stable, so a restarted process finds its state."""
    return hashlib.sha256(f"{src_uri}\n{dst_uri}".encode()).hexdigest()[:32]


class CopyStateStore(Protocol):
    """Durable resume state of checkpoint copies, keyed by copy id. See the module docstring."""

    def load(self, copy_id: str) -> CopyState | None: ...

    def save(self, copy_id: str, state: CopyState) -> None: ...

    def delete(self, copy_id: str) -> None: ...


class MemoryCopyStateStore:
    """States in a dict: survives a failed call within one process (and tests), not a process restart."""

    def __init__(self) -> None:
        self.states: dict[str, CopyState] = {}

    def load(self, copy_id: str) -> CopyState | None:
        return self.states.get(copy_id)

    def save(self, copy_id: str, state: CopyState) -> None:
        self.states[copy_id] = state

    def delete(self, copy_id: str) -> None:
        self.states.pop(copy_id, None)


class JsonFileCopyStateStore:
    """One `<copy id>.json` per copy in `directory`, replaced atomically (temp file, fsync, rename)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def _path(self, copy_id: str) -> Path:
        if not copy_id or "/" in copy_id or copy_id.startswith("."):
            raise ValueError(f"unusable copy id {copy_id!r}")
        return self.directory / f"{copy_id}.json"

    def load(self, copy_id: str) -> CopyState | None:
        try:
            text = self._path(copy_id).read_text()
        except FileNotFoundError:
            return None
        return CopyState.from_json(json.loads(text))

    def save(self, copy_id: str, state: CopyState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{copy_id}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(state.to_json(), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(copy_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def delete(self, copy_id: str) -> None:
        self._path(copy_id).unlink(missing_ok=True)
