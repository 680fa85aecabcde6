"""Object keys every store accepts: the one check that keeps a name from reaching outside its store's root.

A key is a `/`-separated relative name. `safe_key(key)` returns it unchanged when it is safe and raises `UnsafeKey`
naming the reason otherwise. Refused: the empty key; a leading `/` (absolute); an empty segment (`a//b`, or a
trailing `/`); `.` and `..` segments; backslashes (a separator on some systems and SDKs); NUL and every other
control character (Unicode category Cc: C0, DEL, C1); a string that is not valid UTF-8 (lone surrogates, such as
undecodable file names); more than `MAX_KEY_BYTES` UTF-8 bytes (S3's and GCS's limit). Percent-decoding is done
before (`parse_uri` unquotes), so `%2e%2e` arrives here as `..` and is refused.

A safe key joined under any directory or key prefix stays beneath it, lexically: no segment can climb, and no
segment can restart from the root. (On a filesystem, symlinks are the other way out: `LocalStore` refuses those
itself.) `safe_segment` is the same check for one path segment (tenant names, job and placement ids);
`safe_list_prefix` for listing prefixes, which may end in `/` or be empty; `join_key` puts a safe key under a
store's key prefix.
"""

from __future__ import annotations

import unicodedata

from providers.storage.base import StorageError

MAX_KEY_BYTES = 1024


class UnsafeKey(StorageError):
    """A key (or URI) that would reach outside its store's root, or that the store refuses to name."""


def _refuse(key: str, reason: str) -> UnsafeKey:
    return UnsafeKey(f"object name {key!r} is refused: {reason}")


def safe_key(key: str) -> str:
    """`key` unchanged when it is a safe relative name; raises `UnsafeKey` saying why it is not."""
    if not isinstance(key, str) or not key:
        raise _refuse(str(key), "it is empty")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise _refuse(key, "it is not valid UTF-8") from None
    if size > MAX_KEY_BYTES:
        raise _refuse(key[:64] + "...", f"it is {size} bytes long, more than {MAX_KEY_BYTES}")
    if key.startswith("/"):
        raise _refuse(key, "it is absolute (starts with '/')")
    if "\\" in key:
        raise _refuse(key, "it contains a backslash")
    if any(unicodedata.category(ch) == "Cc" for ch in key):
        raise _refuse(key, "it contains NUL or another control character")
    for segment in key.split("/"):
        if segment == "":
            raise _refuse(key, "it has an empty path segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise _refuse(key, f"it has a {segment!r} path segment")
    return key


def safe_segment(name: str) -> str:
    """`name` unchanged when it is one safe path segment (a safe key without `/`); raises `UnsafeKey`."""
    safe_key(name)
    if "/" in name:
        raise _refuse(name, "it must be a single path segment (no '/')")
    return name


def safe_list_prefix(prefix: str) -> str:
    """`prefix` unchanged when it may be listed: empty, or a safe key optionally followed by one `/`."""
    if prefix:
        safe_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def safe_store_prefix(prefix: str) -> str:
    """`prefix` unchanged when it is a store's key prefix: empty (the whole bucket) or a safe key ending in `/`."""
    if prefix:
        if not prefix.endswith("/"):
            raise _refuse(prefix, "a store prefix must end in '/'")
        safe_key(prefix[:-1])
    return prefix


def join_key(store_prefix: str, key: str) -> str:
    """`key` (checked by `safe_key`) beneath `store_prefix` (empty or ending in `/`)."""
    return store_prefix + safe_key(key)
