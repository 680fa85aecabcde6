"""Ship the workload's merged stdout/stderr to the attempt's log prefix in the store, in order, while it runs.

The stream is cut into chunks every `flush_seconds` (5) or `chunk_bytes` (1 MiB), whichever comes first; each chunk
is named by its byte offset in the stream (`protocol.log_chunk_name`), so a reader lists the prefix and concatenates
in name order, from any offset. Chunks wait in a spool directory on local disk until the store has them, and are
sent strictly in order: a store outage delays the log, it does not reorder or lose it. The spool is bounded
(`spool_limit`, 256 MiB): past it the oldest waiting chunk's content is replaced by a one-line marker saying how many
bytes were dropped, under the same name.

Known secret values are replaced by `[redacted]` before anything is spooled, kept as the tail, or sent, also when a
value is split across two reads (values shorter than 4 bytes are left alone: masking them would wreck the log).
`tail()` is the last `tail_bytes` of the (redacted) stream, for the final report.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from agent.protocol import log_chunk_name, parse_log_chunk_name
from agent.stores import Store, StoreError

log = logging.getLogger("overspill.agent.logs")
MiB = 1024 * 1024
REDACTED = b"[redacted]"


class Redactor:
    """Replaces every occurrence of the given values in a byte stream, holding back only a possible prefix of one."""

    def __init__(self, values: Iterable[str] = (), min_length: int = 4) -> None:
        self.values: list[bytes] = []
        self.held = b""
        for v in values:
            self.add(v, min_length)

    def add(self, value: str, min_length: int = 4) -> None:
        raw = value.encode()
        if len(raw) >= min_length and raw not in self.values:
            self.values.append(raw)
            self.values.sort(key=len, reverse=True)

    def feed(self, data: bytes) -> bytes:
        if not self.values:
            return data
        data = self.held + data
        for v in self.values:
            data = data.replace(v, REDACTED)
        keep = 0
        for v in self.values:  # the longest tail of `data` that could still grow into a value
            for k in range(min(len(v) - 1, len(data)), keep, -1):
                if v.startswith(data[-k:]):
                    keep = k
                    break
        self.held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        held, self.held = self.held, b""
        return held


class LogShipper:
    def __init__(
        self,
        store: Store,
        prefix: str,
        spool_dir: Path,
        *,
        redactor: Redactor | None = None,
        flush_seconds: float = 5.0,
        chunk_bytes: int = MiB,
        spool_limit: int = 256 * MiB,
        tail_bytes: int = 4096,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.spool = spool_dir
        self.spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.redactor = redactor or Redactor()
        self.flush_seconds = flush_seconds
        self.chunk_bytes = chunk_bytes
        self.spool_limit = spool_limit
        self.tail_bytes = tail_bytes
        self._lock = threading.Condition()
        self._buf = bytearray()
        self._buf_since: float | None = None
        self._tail = bytearray()
        self._offset = self._resume_offset()  # the stream offset of the first byte in _buf
        self._readers: list[threading.Thread] = []
        self._closing = False
        self._stop_uploading = False
        self.uploaded_bytes = 0
        self.dropped_bytes = 0
        self.last_error: str | None = None
        self._uploader = threading.Thread(target=self._upload_loop, name="log-upload", daemon=True)
        self._uploader.start()

    def _resume_offset(self) -> int:
        """After an agent restart, continue the stream where the last run left it (names are offsets)."""
        try:
            end = int((self.spool / "offset").read_text())
        except (OSError, ValueError):
            end = 0
        for path in self.spool.iterdir():
            start = parse_log_chunk_name(path.name)
            if start is not None:
                end = max(end, start + path.stat().st_size)
        return end

    # ----------------------------------------------------------------------------------------------- input side

    def follow(self, stream: IO[bytes]) -> None:
        """Read `stream` to its end in a thread."""
        thread = threading.Thread(target=self._read_loop, args=(stream,), name="log-read", daemon=True)
        self._readers.append(thread)
        thread.start()

    def _read_loop(self, stream: IO[bytes]) -> None:
        fd = stream.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            self.write(data)
        with contextlib.suppress(OSError):
            stream.close()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._append(self.redactor.feed(data))

    def note(self, text: str) -> None:
        """An agent line in the stream (what it is doing, why it failed)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._lock:
            self._append(self.redactor.feed(f"[overspill-agent {stamp}] {text}\n".encode()))

    def _append(self, data: bytes) -> None:
        if not data:
            return
        if self._buf_since is None:
            self._buf_since = time.monotonic()
        self._buf += data
        self._tail += data
        if len(self._tail) > self.tail_bytes:
            del self._tail[: len(self._tail) - self.tail_bytes]
        if len(self._buf) >= self.chunk_bytes:
            self._seal()

    def _seal(self) -> None:
        """Move the buffer into the spool as one chunk (lock held)."""
        if not self._buf:
            return
        path = self.spool / log_chunk_name(self._offset)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(self._buf)
        os.replace(tmp, path)
        self._offset += len(self._buf)
        (self.spool / "offset.tmp").write_text(str(self._offset))
        os.replace(self.spool / "offset.tmp", self.spool / "offset")
        self._buf.clear()
        self._buf_since = None
        self._enforce_limit()
        self._lock.notify_all()

    def _enforce_limit(self) -> None:
        chunks = self._spooled()
        total = sum(p.stat().st_size for p in chunks)
        for path in chunks:
            if total <= self.spool_limit:
                break
            size = path.stat().st_size
            if path.read_bytes().startswith(b"[overspill-agent] dropped"):
                continue
            marker = f"[overspill-agent] dropped {size} bytes of log here: the store was unreachable\n".encode()
            path.write_bytes(marker)
            self.dropped_bytes += size
            total -= size - len(marker)

    def _spooled(self) -> list[Path]:
        return sorted(p for p in self.spool.iterdir() if parse_log_chunk_name(p.name) is not None)

    def tail(self) -> str:
        with self._lock:
            return bytes(self._tail).decode("utf-8", errors="replace")

    @property
    def offset(self) -> int:
        with self._lock:
            return self._offset + len(self._buf)

    # ---------------------------------------------------------------------------------------------- upload side

    def _upload_loop(self) -> None:
        delay = 0.5
        while True:
            with self._lock:
                while True:
                    if self._stop_uploading:
                        return
                    due = self._buf_since is not None and time.monotonic() - self._buf_since >= self.flush_seconds
                    if due:
                        self._seal()
                    chunks = self._spooled()
                    if chunks:
                        break
                    if self._closing and not self._buf and all(not t.is_alive() for t in self._readers):
                        return
                    wait = self.flush_seconds
                    if self._buf_since is not None:
                        wait = max(0.01, self.flush_seconds - (time.monotonic() - self._buf_since))
                    self._lock.wait(min(wait, 1.0))
            path = chunks[0]
            try:
                data = path.read_bytes()
                self.store.put(self.prefix + path.name, data, content_type="text/plain; charset=utf-8")
            except StoreError as exc:
                if self.last_error is None:
                    log.warning("log upload failed, keeping the chunks on disk and retrying: %s", exc)
                self.last_error = str(exc)
                with self._lock:
                    self._lock.wait(delay)
                delay = min(30.0, delay * 2)
                continue
            delay = 0.5
            self.last_error = None
            self.uploaded_bytes += len(data)
            with contextlib.suppress(OSError):
                path.unlink()

    def close(self, timeout: float) -> bool:
        """Wait for the stream's end, send everything left; True when the store has the whole log."""
        deadline = time.monotonic() + timeout
        for thread in self._readers:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._append(self.redactor.flush())
            self._seal()
            self._closing = True
            self._lock.notify_all()
        self._uploader.join(max(0.0, deadline - time.monotonic()))
        done = not self._uploader.is_alive()
        with self._lock:
            self._stop_uploading = True
            self._lock.notify_all()
        return done and not self._spooled()
