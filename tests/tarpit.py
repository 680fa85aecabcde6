"""A tarpit HTTP server on 127.0.0.1 for the slow-webhook attacks: it accepts every connection and then either
never answers (`mode="silent"`: reads the request, sends nothing) or trickles an answer that never ends
(`mode="trickle"`: a status line, then one header byte every `interval` seconds, forever).

`connections` counts accepted connections, `open` those not yet closed by the client. Use it as a context manager
(leaving it closes every connection and the listening socket).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Literal, Self


class Tarpit:
    def __init__(self, mode: Literal["silent", "trickle"] = "silent", *, interval: float = 0.2) -> None:
        self.mode = mode
        self.interval = interval
        self.connections = 0
        self.open = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(512)
        self._listener.settimeout(0.1)
        self._clients: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="tarpit", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self.open += 1
                self._clients.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        conn.settimeout(self.interval)
        try:
            if self.mode == "trickle":
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not self._stop.is_set():
                try:
                    if not conn.recv(65536):  # the client gave up
                        return
                except TimeoutError:
                    pass
                if self.mode == "trickle":
                    conn.sendall(b"X")  # a header name that never ends
        except OSError:
            return
        finally:
            with self._lock:
                self.open -= 1
            conn.close()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._listener.close()
        with self._lock:
            for conn in self._clients:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
