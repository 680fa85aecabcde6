"""Report delivery: a directory (under `reports_dir`), an S3 bucket, email (SMTP) or a webhook (raw POST).

A destination is a JSON object with a `type`; `validate_destination` checks it before it is stored (so a bad
one is a 422 naming the field, not a failed run later). `deliver` either delivers or raises `DeliveryError`.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from broker.finance.notify import NotifyError, post_file, send_email
from broker.settings import Settings

TYPES = ("directory", "s3", "email", "webhook")


class DeliveryError(Exception):
    """The report was produced but could not be delivered where asked."""


def validate_destination(dest: dict[str, Any] | None) -> dict[str, Any]:
    """Returns the normalised destination; raises ValueError naming the bad key."""
    if not dest:
        return {}
    kind = dest.get("type")
    if kind not in TYPES:
        raise ValueError(f"destination.type must be one of {', '.join(TYPES)}")
    if kind == "directory":
        path = str(dest.get("path", ""))
        parts = PurePosixPath(path).parts
        if path.startswith("/") or ".." in parts:
            raise ValueError("destination.path must be relative to the reports directory, without '..'")
        return {"type": kind, "path": path}
    if kind == "s3":
        bucket = dest.get("bucket")
        if not isinstance(bucket, str) or not bucket:
            raise ValueError("destination.bucket is required for s3")
        return {"type": kind, "bucket": bucket, "prefix": str(dest.get("prefix", "")), "region": dest.get("region")}
    if kind == "email":
        to = dest.get("to")
        if isinstance(to, str):
            to = [to]
        if not isinstance(to, list) or not to or not all(isinstance(a, str) and "@" in a for a in to):
            raise ValueError("destination.to must be one or more email addresses")
        return {"type": kind, "to": to}
    url = dest.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError("destination.url must be an http(s) URL")
    return {"type": kind, "url": url}


def deliver(settings: Settings, dest: dict[str, Any], filename: str, content: bytes, content_type: str) -> str:
    """Deliver and return where it went (a path, s3:// URL, addresses or URL)."""
    kind = dest.get("type")
    if kind == "directory":
        root = settings.resolved_reports_dir.resolve()
        target_dir = (root / dest.get("path", "")).resolve()
        if not target_dir.is_relative_to(root):
            raise DeliveryError(f"directory {target_dir} is outside {root}")
        try:
            target_dir.mkdir(parents=True, exist_ok=True)
            target = target_dir / filename
            tmp = target.with_suffix(target.suffix + ".part")
            tmp.write_bytes(content)
            tmp.replace(target)  # readers never see half a file
        except OSError as exc:
            raise DeliveryError(f"writing {target_dir / filename}: {exc}") from exc
        return str(target)
    if kind == "s3":
        return _to_s3(settings, dest, filename, content, content_type)
    if kind == "email":
        try:
            send_email(
                settings,
                list(dest["to"]),
                f"[overspill] cost report {filename}",
                f"The cost report {filename} is attached.\n",
                [(filename, content, content_type.split(";")[0])],
            )
        except NotifyError as exc:
            raise DeliveryError(str(exc)) from exc
        return ", ".join(dest["to"])
    if kind == "webhook":
        try:
            post_file(dest["url"], filename, content, content_type)
        except NotifyError as exc:
            raise DeliveryError(str(exc)) from exc
        return str(dest["url"])
    raise DeliveryError(f"unknown destination type {kind!r}")


def _to_s3(settings: Settings, dest: dict[str, Any], filename: str, content: bytes, content_type: str) -> str:
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError as exc:  # the 'aws' extra is not installed
        raise DeliveryError("S3 delivery needs boto3 (pip install 'overspill[aws]')") from exc
    client = boto3.client(
        "s3",
        endpoint_url=settings.reports_s3_endpoint_url or settings.aws_endpoint_url,
        region_name=dest.get("region") or "us-east-1",
    )
    key = str(PurePosixPath(dest.get("prefix") or ".") / filename).removeprefix("./")
    try:
        client.put_object(Bucket=dest["bucket"], Key=key, Body=content, ContentType=content_type)
    except (BotoCoreError, ClientError) as exc:
        raise DeliveryError(f"s3://{dest['bucket']}/{key}: {exc}") from exc
    return f"s3://{dest['bucket']}/{key}"
