"""Report delivery: a directory (under `reports_dir`), an S3 bucket, email (SMTP) or a webhook (raw POST).

A destination is a JSON object with a `type`. Two checks, both before it is stored (so a bad one is a 422 naming
the field, not a failed run later), and again at delivery (settings may have changed since):

- `validate_destination(dest)`: its shape, from the request alone. `directory.path` and `s3.prefix` are relative
  key paths without NUL or other control characters, backslashes, a leading `/` or `..` segments; `s3.bucket` is
  an S3 bucket name; `email.to` are plain addresses (`destination.to[i]` names a bad one); `webhook.url` is an
  http(s) URL without user info (`broker.finance.outbound.check_url_shape`).
- `check_destination(settings, tenant, dest)`: what the operator allows. An S3 destination must lie under one of
  the tenant's prefixes in `OVERSPILL_REPORT_DESTINATIONS` (none configured: no S3 destination at all), so a
  finance key cannot write into the broker's checkpoint buckets or probe which buckets exist; a webhook naming an
  IP address literally must be public or in `OVERSPILL_WEBHOOK_ALLOWED_NETWORKS`; a directory is refused in the
  serverless runtime (`settings.serverless`: a Lambda container's disk is ephemeral and private to it).

`deliver` either delivers or raises `DeliveryError`, whose message never says more than the tenant may know: an
S3 failure is "delivery to the configured destination failed" (the cause, which could tell an existing bucket
from a missing one, goes to the broker's log), a webhook failure names `scheme://host` and the status only.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from broker.config.settings import Settings
from broker.finance.notify import NotifyError, check_emails, post_file, send_email
from broker.finance.outbound import UnsafeTarget, check_url, check_url_shape, redact_url
from broker.finance.reports.paths import BUCKET as _BUCKET
from broker.finance.reports.paths import key_path, parse_s3_prefix

log = logging.getLogger(__name__)

TYPES = ("directory", "s3", "email", "webhook")
_REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+){1,4}")
S3_FAILED = "delivery to the configured destination failed"


class DeliveryError(Exception):
    """The report was produced but could not be delivered where asked."""


class DestinationRefused(DeliveryError):
    """The destination is not one the settings allow (retrying cannot help)."""


def validate_destination(dest: dict[str, Any] | None) -> dict[str, Any]:
    """Returns the normalised destination; raises ValueError naming the bad key."""
    if not dest:
        return {}
    kind = dest.get("type")
    if kind not in TYPES:
        raise ValueError(f"destination.type must be one of {', '.join(TYPES)}")
    if kind == "directory":
        return {"type": kind, "path": key_path(dest.get("path", ""), "destination.path")}
    if kind == "s3":
        bucket = dest.get("bucket")
        if not isinstance(bucket, str) or not bucket:
            raise ValueError("destination.bucket is required for s3")
        if not _BUCKET.fullmatch(bucket):
            raise ValueError("destination.bucket is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-')")
        region = dest.get("region")
        if region is not None and (not isinstance(region, str) or not _REGION.fullmatch(region)):
            raise ValueError("destination.region is not an AWS region name (e.g. us-east-1)")
        prefix = key_path(dest.get("prefix", ""), "destination.prefix")
        return {"type": kind, "bucket": bucket, "prefix": prefix, "region": region}
    if kind == "email":
        to = dest.get("to")
        if isinstance(to, str):
            to = [to]
        if not isinstance(to, list) or not to or len(to) > 20:
            raise ValueError("destination.to must be one to 20 email addresses")
        return {"type": kind, "to": check_emails(to, "destination.to")}
    url = dest.get("url")
    return {"type": kind, "url": check_url_shape(url, "destination.url")}


def check_destination(settings: Settings, tenant: str, dest: dict[str, Any]) -> dict[str, Any]:
    """`dest` (already validated) if the settings allow it for `tenant`; ValueError naming the field otherwise."""
    kind = dest.get("type")
    if kind == "directory" and settings.serverless:
        raise ValueError(
            "destination.type directory is not available in the serverless runtime (a Lambda container's disk is "
            "ephemeral and private to it): use s3, email or webhook"
        )
    if kind == "s3":
        prefixes = [parse_s3_prefix(p, "report_destinations") for p in settings.report_destinations.get(tenant, [])]
        folder = dest.get("prefix") or ""
        folder = folder + "/" if folder else ""
        if not any(dest.get("bucket") == bucket and folder.startswith(prefix) for bucket, prefix in prefixes):
            allowed = ", ".join(f"s3://{b}/{p}" for b, p in prefixes) or "none configured for your tenant"
            raise ValueError(
                f"destination.bucket/prefix must lie under a report destination the operator configured ({allowed})"
            )
    if kind == "webhook":
        check_url(dest.get("url", ""), "destination.url", settings.webhook_networks)
    return dest


def deliver(
    settings: Settings, tenant: str, dest: dict[str, Any], filename: str, content: bytes, content_type: str
) -> str:
    """Deliver and return where it went (a path, s3:// URL, addresses or `scheme://host` of the URL)."""
    try:
        dest = check_destination(settings, tenant, validate_destination(dest))  # normalised, as checked
    except ValueError as exc:
        raise DestinationRefused(str(exc)) from exc
    kind = dest.get("type")
    if kind == "directory":
        root = settings.resolved_reports_dir.resolve()
        target_dir = (root / dest.get("path", "")).resolve()
        if not target_dir.is_relative_to(root):
            raise DestinationRefused("destination.path is outside the reports directory")
        try:
            target_dir.mkdir(parents=True, exist_ok=True)
            target = target_dir / filename
            tmp = target.with_suffix(target.suffix + ".part")
            tmp.write_bytes(content)
            tmp.replace(target)  # readers never see half a file
        except OSError as exc:
            raise DeliveryError(f"writing {dest.get('path') or '.'}/{filename}: {exc.strerror}") from exc
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
    try:
        post_file(settings, dest["url"], filename, content, content_type)
    except UnsafeTarget as exc:  # not worth retrying: the answer it resolved to is no place to send to
        raise DestinationRefused(str(exc)) from exc
    except NotifyError as exc:
        raise DeliveryError(str(exc)) from exc
    return redact_url(dest["url"])


def _to_s3(settings: Settings, dest: dict[str, Any], filename: str, content: bytes, content_type: str) -> str:
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError as exc:  # the 'aws' extra is not installed
        raise DeliveryError("S3 delivery needs boto3 (pip install 'overspill[aws]')") from exc
    deadline = settings.delivery_deadline_seconds
    client = boto3.client(
        "s3",
        endpoint_url=settings.reports_s3_endpoint_url or settings.aws_endpoint_url,
        region_name=dest.get("region") or "us-east-1",
        config=Config(connect_timeout=min(10.0, deadline), read_timeout=deadline, retries={"total_max_attempts": 1}),
    )
    key = f"{dest['prefix']}/{filename}" if dest.get("prefix") else filename
    try:
        client.put_object(Bucket=dest["bucket"], Key=key, Body=content, ContentType=content_type)
    except (BotoCoreError, ClientError) as exc:
        log.warning("report delivery to s3://%s/%s failed: %s", dest["bucket"], key, exc)
        raise DeliveryError(S3_FAILED) from exc
    return f"s3://{dest['bucket']}/{key}"
