"""A stdlib HTTP server on a free 127.0.0.1 port, run in a thread, for the fakes that stand in for cloud APIs.

Subclasses call `_serve(handler_base)` at the end of `__init__`; the handler class gets an `owner` attribute
pointing back at the fake. Use the fake as a context manager.
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class QuietHTTPServer(ThreadingHTTPServer):
    """A threaded stdlib server for test stand-ins that stays quiet when a client goes away mid-request (a test
    that ended, a client's timeout): socketserver would print that traceback to whatever `sys.stderr` is at the
    time, which may be another test's captured output. Any other error is still printed."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class LocalServer:
    _server: QuietHTTPServer
    _thread: threading.Thread

    def _serve(self, handler_base: type[BaseHTTPRequestHandler]) -> None:
        handler = type("Handler", (handler_base,), {"owner": self})
        self._server = QuietHTTPServer(("127.0.0.1", 0), handler)
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
