"""Real parts for the finance attack tests: an HTTP service on a local address standing for an internal target (it
records what reaches it and answers with a status and a body of its choosing), a finance API client, and a
ledger to spend against."""

from __future__ import annotations

import socket
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from fastapi.testclient import TestClient

from broker.api.auth import Role, create_key
from broker.app import create_app
from broker.runtime import Runtime


class InternalService:
    """An HTTP server on `host` (default 127.0.0.1) that records every request (method, path, headers, body) and
    answers `status` with `body`: what a broker's network neighbour (an admin API, a metadata service) looks like."""

    def __init__(self, host: str = "127.0.0.1", *, status: int = 200, body: bytes = b"") -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.status = status
        self.body = body
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("Content-Length", "0") or 0)
                data = self.rfile.read(length) if length else b""
                owner.requests.append((self.command, self.path, dict(self.headers), data))
                self.send_response(owner.status)
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

            do_GET = do_POST = do_PUT = _any

            def log_message(self, format: str, *args: Any) -> None:
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
        self._server = server_class((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, host: str | None = None) -> str:
        name = host or str(self._server.server_address[0])
        return f"http://{f'[{name}]' if ':' in name else name}:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


def finance_client(rt: Runtime, now: datetime, tenant: str = "demo") -> TestClient:
    """An API client holding a `finance` key of `tenant` (the role the findings are about)."""
    client = TestClient(create_app(runtime=rt))
    key = create_key(rt.engine, tenant=tenant, role=Role.FINANCE, name="finance", now=now)
    client.headers["Authorization"] = f"Bearer {key}"
    return client
