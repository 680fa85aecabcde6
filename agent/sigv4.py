"""AWS Signature Version 4 for the agent's few AWS calls (S3 objects, Secrets Manager, ECR), standard library only.

`sign()` returns the headers to add to a request so that AWS accepts it; it produces exactly what botocore's
`SigV4Auth` (JSON services) and `S3SigV4Auth` (S3: the path signed as sent, `X-Amz-Content-SHA256` set) produce for
the same request, which tests/test_agent_stores.py checks. The payload hash is passed in, so a large file can be
hashed once and streamed. Credentials never appear in anything this module returns except the signature itself
and the session token header AWS requires.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote, urlsplit

from agent.compat import UTC

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNSIGNED = frozenset({"authorization", "user-agent", "expect", "connection", "keep-alive", "x-amzn-trace-id"})


@dataclass(frozen=True)
class AwsCredentials:
    access_key: str
    secret_key: str
    token: str | None = None
    expires_at: datetime | None = None

    def __repr__(self) -> str:  # never print the secret
        return f"AwsCredentials(access_key={self.access_key[:4]}..., expires_at={self.expires_at})"


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _host(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return f"{host}:{parts.port}" if parts.port and parts.port != default else host


def _canonical_query(query: str) -> str:
    pairs = []
    for item in query.split("&") if query else ():
        key, _, value = item.partition("=")
        pairs.append((key, value))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def uri_encode(value: str, *, keep_slash: bool = False) -> str:
    """RFC 3986 encoding as SigV4 wants it (only A-Z a-z 0-9 - _ . ~ unreserved)."""
    return quote(value, safe="-_.~/" if keep_slash else "-_.~")


def sign(
    method: str,
    url: str,
    headers: dict[str, str],
    *,
    payload_sha256: str,
    credentials: AwsCredentials,
    region: str,
    service: str,
    now: datetime | None = None,
) -> dict[str, str]:
    """The headers to add to `headers` (Authorization, X-Amz-Date, X-Amz-Security-Token, and for S3
    X-Amz-Content-SHA256). `url` must already be percent-encoded as it will be sent; its query string is signed."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    added = {"X-Amz-Date": stamp}
    if credentials.token:
        added["X-Amz-Security-Token"] = credentials.token
    if service == "s3":
        added["X-Amz-Content-SHA256"] = payload_sha256
    to_sign = {k.lower(): " ".join(str(v).split()) for k, v in {**headers, **added}.items()}
    to_sign = {k: v for k, v in to_sign.items() if k not in _UNSIGNED}
    to_sign.setdefault("host", _host(url))
    names = sorted(to_sign)
    parts = urlsplit(url)
    path = parts.path or "/"
    if service != "s3":  # every service but S3 signs the path encoded once more
        path = quote(path, safe="/~")
    canonical = "\n".join(
        [
            method.upper(),
            path,
            _canonical_query(parts.query),
            "".join(f"{n}:{to_sign[n]}\n" for n in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{stamp[:8]}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(f"AWS4{credentials.secret_key}".encode(), stamp[:8])
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    added["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return added
