"""Sending finance notifications: a JSON webhook POST, a file POST and an email through SMTP (smtplib).

Contract: each function either delivers or raises `NotifyError` naming what failed; nothing is retried here (the
callers keep state and retry on a later tick). Webhooks go through `broker.finance.outbound.post`: public
addresses only (unless the operator allowed a network), pinned, no redirects, one total deadline
(`delivery_deadline_seconds`), and errors that show the URL as `scheme://host` and the answer's status only.
Addresses are checked again before an email is built (`email_problem`), so a bad one stored before validation
existed fails that email alone, as a `NotifyError`.
"""

from __future__ import annotations

import json
import re
import smtplib
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage
from typing import Any

from broker.config.settings import Settings
from broker.finance.outbound import NotifyError, post

__all__ = ["NotifyError", "check_emails", "email_problem", "post_file", "post_webhook", "send_email"]

_DOMAIN = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def email_problem(value: object) -> str | None:
    """Why `value` is not one plain ASCII addr-spec (`local@domain`), or None when it is."""
    if not isinstance(value, str) or not value:
        return "is not an email address"
    if len(value) > 254:
        return "is longer than 254 characters"
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in value):
        return "must not contain spaces or control characters (CR, LF, NUL...)"
    if not value.isascii():
        return "must be ASCII"
    if any(c in value for c in ',;<>()[]"\\'):
        return "must be one plain address (local@domain), not a list or a display name"
    try:
        address = Address(addr_spec=value)
    except (ValueError, IndexError, HeaderParseError):
        return "is not an email address"
    if address.addr_spec != value or not address.username or not _DOMAIN.fullmatch(address.domain):
        return "is not an email address"
    return None


def check_emails(values: list[str], field: str) -> list[str]:
    """`values` if each is an address; ValueError naming `field[i]` otherwise."""
    for i, value in enumerate(values):
        problem = email_problem(value)
        if problem:
            raise ValueError(f"{field}[{i}] {problem}")
    return values


def post_webhook(settings: Settings, url: str, payload: Any) -> None:
    """POST `payload` as JSON; any 2xx answer is success."""
    post(
        url,
        json.dumps(payload).encode(),
        {"Content-Type": "application/json"},
        allowed=settings.webhook_networks,
        deadline_seconds=settings.delivery_deadline_seconds,
    )


def post_file(settings: Settings, url: str, filename: str, content: bytes, content_type: str) -> None:
    """POST a file (a report) as the raw request body, its name in `X-Overspill-Filename`."""
    post(
        url,
        content,
        {"Content-Type": content_type, "X-Overspill-Filename": filename},
        allowed=settings.webhook_networks,
        deadline_seconds=settings.delivery_deadline_seconds,
    )


def send_email(
    settings: Settings,
    to: list[str],
    subject: str,
    body: str,
    attachments: list[tuple[str, bytes, str]] | None = None,
) -> None:
    """Send one email to `to` through `settings.smtp_host`; attachments are (filename, bytes, mime type)."""
    if not settings.smtp_host:
        raise NotifyError("email not sent: OVERSPILL_SMTP_HOST is not configured")
    try:
        check_emails(list(to), "to")
    except ValueError as exc:
        raise NotifyError(f"email not sent: {exc}") from exc
    msg = EmailMessage()
    try:
        msg["From"] = settings.smtp_from
        msg["To"] = ", ".join(to)
        msg["Subject"] = subject
    except (ValueError, HeaderParseError) as exc:
        raise NotifyError(f"email not sent: {exc}") from exc
    msg.set_content(body)
    for filename, content, mime in attachments or []:
        maintype, _, subtype = mime.partition("/")
        msg.add_attachment(content, maintype=maintype, subtype=subtype or "octet-stream", filename=filename)
    try:
        with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=settings.delivery_deadline_seconds) as smtp:
            if settings.smtp_starttls:
                smtp.starttls()
            if settings.smtp_username:
                smtp.login(settings.smtp_username, settings.smtp_password)
            smtp.send_message(msg)
    except (OSError, smtplib.SMTPException) as exc:
        raise NotifyError(f"email to {', '.join(to)} via {settings.smtp_host}: {exc}") from exc
