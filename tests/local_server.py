"""A stdlib HTTP server on a free 127.0.0.1 port, run in a thread, for the fakes that stand in for cloud APIs.

Subclasses call `_serve(handler_base)` at the end of `__init__`; the handler class gets an `owner` attribute
pointing back at the fake. Use the fake as a context manager.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self


class LocalServer:
    _server: ThreadingHTTPServer
    _thread: threading.Thread

    def _serve(self, handler_base: type[BaseHTTPRequestHandler]) -> None:
        handler = type("Handler", (handler_base,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2)
