"""Service-layer errors. Each names the field or resource at fault; the app maps them to HTTP status codes."""

from __future__ import annotations


class BrokerError(Exception):
    status_code = 400

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Unprocessable(BrokerError):
    """The request is well-formed but cannot be honoured (422)."""

    status_code = 422


class Conflict(BrokerError):
    """The request conflicts with the resource's current state (409)."""

    status_code = 409


class NotFoundError(BrokerError):
    """No such resource in the caller's tenant (404). Another tenant's resource is reported the same way."""

    status_code = 404

    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(kind, f"no {kind} {ident!r}")


class PayloadTooLarge(BrokerError):
    """The request's content passes a size limit once read or decompressed (413); the message names the limit."""

    status_code = 413


class TooManyRequests(BrokerError):
    """A per-tenant cap is reached (429); the message names the cap and its setting."""

    status_code = 429
