"""Real local receivers for finance deliveries: an HTTP server that records POSTs (webhooks) and an SMTP server
(aiosmtpd) that records messages."""

from __future__ import annotations

import email
import threading
from email.message import Message
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any, Self

from tests.local_server import LocalServer
from tests.moto_server import free_port


class _Handler(BaseHTTPRequestHandler):
    owner: WebhookSink

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.owner.lock:
            self.owner.requests.append((self.path, dict(self.headers), body))
            status = self.owner.status
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class WebhookSink(LocalServer):
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.status = 200
        self.lock = threading.Lock()
        self._serve(_Handler)


class SmtpSink:
    """aiosmtpd on a free port; `messages` are the parsed emails received."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[Message] = []
        self.port = free_port()
        sink = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                sink.messages.append(email.message_from_bytes(envelope.content))
                return "250 OK"

        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> Self:
        self._controller.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._controller.stop()
