"""Sending finance notifications: a JSON webhook POST and an email through SMTP (smtplib).

Contract: each function either delivers or raises `NotifyError` naming what failed; nothing is retried here (the
callers keep state and retry on a later tick).
"""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from typing import Any

import httpx

from broker.settings import Settings

TIMEOUT_SECONDS = 10.0


class NotifyError(Exception):
    """A webhook or email could not be delivered."""


def post_webhook(url: str, payload: Any, *, timeout: float = TIMEOUT_SECONDS) -> None:
    """POST `payload` as JSON; any 2xx answer is success."""
    try:
        response = httpx.post(url, json=payload, timeout=timeout)
    except httpx.HTTPError as exc:
        raise NotifyError(f"webhook {url}: {type(exc).__name__}: {exc}") from exc
    if not 200 <= response.status_code < 300:
        raise NotifyError(f"webhook {url} answered {response.status_code}: {response.text[:200]}")


def post_file(url: str, filename: str, content: bytes, content_type: str, *, timeout: float = 60.0) -> None:
    """POST a file (a report) as the raw request body, its name in `X-Overspill-Filename`."""
    try:
        response = httpx.post(
            url,
            content=content,
            headers={"Content-Type": content_type, "X-Overspill-Filename": filename},
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        raise NotifyError(f"webhook {url}: {type(exc).__name__}: {exc}") from exc
    if not 200 <= response.status_code < 300:
        raise NotifyError(f"webhook {url} answered {response.status_code}: {response.text[:200]}")


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
    msg = EmailMessage()
    msg["From"] = settings.smtp_from
    msg["To"] = ", ".join(to)
    msg["Subject"] = subject
    msg.set_content(body)
    for filename, content, mime in attachments or []:
        maintype, _, subtype = mime.partition("/")
        msg.add_attachment(content, maintype=maintype, subtype=subtype or "octet-stream", filename=filename)
    try:
        with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=TIMEOUT_SECONDS) as smtp:
            if settings.smtp_starttls:
                smtp.starttls()
            if settings.smtp_username:
                smtp.login(settings.smtp_username, settings.smtp_password)
            smtp.send_message(msg)
    except (OSError, smtplib.SMTPException) as exc:
        raise NotifyError(f"email to {', '.join(to)} via {settings.smtp_host}: {exc}") from exc
