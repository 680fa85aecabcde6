"""`ApiError`, the one exception of the client (`overspill.client`), in a module of its own so the CLI can catch it
without importing the HTTP library until a command really speaks HTTP."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answer: `status` (0 when the broker cannot be reached), `detail` and the problem's `errors`."""

    def __init__(self, status: int, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.detail = message
        self.errors = errors or []
