"""Cut a source stream into upload parts in a background thread, hashing every byte on the way.

`PartReader` reads ahead exactly one part: while the consumer uploads part n, the thread reads and hashes part
n+1, then waits until the consumer takes it before reading further. So at most two parts (plus the source
SDK's current chunk) are in memory whatever the object size. It computes the whole object's SHA-256 and MD5 and
each part's MD5 (`digests()` once the stream is exhausted). Errors raised by the source surface in the consumer
as they were raised; `close()` stops the thread and closes the source (call it when the consumer gives up).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from providers.storage.base import Digests, SourceChanged


@dataclass(frozen=True, slots=True)
class Part:
    """Bytes `[(number-1)*part_size, ...)` of the source, with their MD5 (hex)."""

    number: int
    data: bytes
    md5: str


class _End:
    pass


_END = _End()


class PartReader:
    """Iterate to get `Part`s in order; see the module docstring. `uri` only names the source in errors."""

    def __init__(self, chunks: Iterator[bytes], *, size: int, part_size: int, uri: str = "") -> None:
        self._chunks = chunks
        self._size = size
        self._part_size = part_size
        self._uri = uri
        self._sha256 = hashlib.sha256()
        self._md5 = hashlib.md5()
        self._part_md5s: list[str] = []
        self._handoff: queue.Queue[Part | BaseException | _End] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self.bytes_read = 0
        self._thread = threading.Thread(target=self._run, name="checkpoint-part-reader", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[Part]:
        while True:
            item = self._handoff.get()
            self._handoff.task_done()  # lets the reader start on the next part while this one is uploaded
            if isinstance(item, _End):
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def digests(self) -> Digests:
        """The checksums of everything read; valid once iteration has finished."""
        return Digests(
            size=self.bytes_read,
            sha256=self._sha256.hexdigest(),
            md5=self._md5.hexdigest(),
            part_size=self._part_size,
            part_md5s=tuple(self._part_md5s),
        )

    def close(self) -> None:
        """Stop reading and wait for the thread; safe to call more than once and after the end."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._handoff.get(timeout=0.05)
                self._handoff.task_done()
            except queue.Empty:
                pass
        self._thread.join()

    def _emit(self, item: Part | BaseException | _End) -> bool:
        """Hand `item` over and wait until the consumer has taken it; False when asked to stop."""
        while not self._stop.is_set():
            try:
                self._handoff.put(item, timeout=0.05)
                break
            except queue.Full:
                continue
        else:
            return False
        self._handoff.join()
        return not self._stop.is_set()

    def _part(self, pieces: list[bytes | memoryview]) -> Part:
        first = pieces[0]
        data = first if len(pieces) == 1 and isinstance(first, bytes) else b"".join(pieces)
        md5 = hashlib.md5(data).hexdigest()
        self._part_md5s.append(md5)
        return Part(number=len(self._part_md5s), data=data, md5=md5)

    def _run(self) -> None:
        try:
            self._read()
        except BaseException as exc:  # forwarded to the consumer thread, which re-raises it
            self._emit(exc)
        finally:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()

    def _read(self) -> None:
        pieces: list[bytes | memoryview] = []
        have = 0
        for chunk in self._chunks:
            if self._stop.is_set():
                return
            self._sha256.update(chunk)
            self._md5.update(chunk)
            self.bytes_read += len(chunk)
            if self.bytes_read > self._size:
                raise SourceChanged(f"{self._uri} holds more than the {self._size} bytes it had", uri=self._uri)
            if have == 0 and len(chunk) == self._part_size:
                if not self._emit(self._part([chunk])):
                    return
                continue
            view = memoryview(chunk)
            while view:
                take = min(len(view), self._part_size - have)
                pieces.append(chunk if take == len(chunk) else view[:take])
                have += take
                view = view[take:]
                if have == self._part_size:
                    part = self._part(pieces)
                    pieces, have = [], 0
                    if not self._emit(part):
                        return
        if self.bytes_read != self._size:
            raise SourceChanged(f"{self._uri} ended after {self.bytes_read} of {self._size} bytes", uri=self._uri)
        if have and not self._emit(self._part(pieces)):
            return
        self._emit(_END)
