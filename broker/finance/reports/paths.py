"""Report destination paths and S3 prefixes, parsed with no settings in hand.

`key_path(value, field)` normalises a relative key path and `parse_s3_prefix(value, field)` an `s3://bucket/prefix/`
URI; both raise ValueError naming `field`. They live apart from `deliver` so that `broker.config.settings` can
validate `report_destinations` at start-up without importing the delivery code (which needs the settings).

Imports nothing of the broker.
"""

from __future__ import annotations

import re

MAX_PATH = 256
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def key_path(value: object, field: str) -> str:
    """A relative, normalised key path (`a/b`, or "" for none); ValueError naming `field` otherwise."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string")
    if len(value) > MAX_PATH:
        raise ValueError(f"{field} is longer than {MAX_PATH} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError(f"{field} must not contain NUL or other control characters")
    if "\\" in value:
        raise ValueError(f"{field} must use '/' separators, not backslashes")
    if value.startswith("/"):
        raise ValueError(f"{field} must be relative (no leading '/')")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{field} must not contain '..'")
    return "/".join(parts)


def parse_s3_prefix(value: str, field: str) -> tuple[str, str]:
    """`s3://bucket/prefix/` as (bucket, "prefix/") ("" for a whole bucket); ValueError naming `field`."""
    if not isinstance(value, str) or not value.startswith("s3://"):
        raise ValueError(f"{field}: {value!r} is not an s3://bucket/prefix/ URI")
    bucket, _, prefix = value.removeprefix("s3://").partition("/")
    if not BUCKET.fullmatch(bucket):
        raise ValueError(f"{field}: {bucket!r} is not an S3 bucket name")
    path = key_path(prefix, field)
    return bucket, (path + "/" if path else "")
