"""Outbound HTTP to addresses tenants choose (budget webhooks, report webhooks), safe against SSRF and slow servers.

A finance key names the URL, so the broker must not become its proxy into the network it runs in. Contract:

- `check_url(url, field, allowed)` (at creation, a 422 naming `field` when it raises `ValueError`): scheme `http`
  or `https`, a host, no user info, no control characters or whitespace, an ASCII host (punycode for IDNs), at
  most `MAX_URL_LENGTH` characters; a host that is a literal IP address (in any form `inet_aton` accepts, such as
  `2130706433`) must be public or inside an operator-allowed network, and `localhost` counts as 127.0.0.1. A
  name's DNS answers are only known at delivery, so they are checked there.
- `post(url, content, headers, allowed, deadline_seconds)`: resolves the host once, refuses (`UnsafeTarget`) if ANY
  resolved address is not public: loopback, private (RFC 1918), shared (RFC 6598 100.64/10), link-local (169.254/16,
  which holds the cloud metadata service, and fe80::/10), unique-local (fc00::/7), multicast, unspecified, reserved,
  or such an IPv4 address inside IPv6 (IPv4-mapped, 6to4, Teredo, NAT64 64:ff9b::/96); an address inside one of
  the `allowed` networks (`OVERSPILL_WEBHOOK_ALLOWED_NETWORKS`) is accepted. It then connects to that checked
  address itself (DNS rebinding cannot switch it between check and connect) while the request keeps the original
  host in its `Host` header and, for https, in SNI and the certificate check. No proxy from the environment, no
  redirect (a 3xx is a failed delivery), no retry. The whole delivery, DNS included, has one deadline: every
  connect, TLS handshake, read and write gets at most what is left of it, so a server that accepts and never
  answers, or trickles a byte at a time, is cut off when it passes (`DeliveryTimeout`). Returns the status; any
  non-2xx raises `NotifyError` saying the status only: the answer's body is never read into an error, a log or an
  event.
- `redact_url(url)`: `scheme://host[:port]` only. Webhook URLs carry tokens in their path or query; logs, errors
  and run/alert records show this form, never the full URL.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpcore

MAX_URL_LENGTH = 500
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_CHUNK = 64 * 1024


class NotifyError(Exception):
    """A webhook or email could not be delivered (the message names the target in its redacted form)."""


class UnsafeTarget(NotifyError):
    """The URL's host is (or resolves to) an address the broker does not send to."""


class DeliveryTimeout(NotifyError):
    """The delivery did not finish within its total deadline."""


def redact_url(url: str) -> str:
    """`scheme://host[:port]`: what may be shown of a webhook URL (its path and query may carry a token)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<invalid url>"
    if not host:
        return "<invalid url>"
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}{f':{port}' if port else ''}"


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (`10.20.0.0/16`, `fd00::/8`, a bare address) as networks; ValueError naming the bad one."""
    out: list[Network] = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IP network (CIDR)") from exc
    return tuple(out)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def is_public(ip: IPAddress) -> bool:
    """True for a globally routable unicast address (see the module docstring for what is not)."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d is a.b.c.d
            return is_public(ip.ipv4_mapped)
        if any(not is_public(v4) for v4 in embedded):
            return False
        if ip.is_site_local:
            return False
    return not (
        not ip.is_global
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
    )


def is_allowed(ip: IPAddress, allowed: Sequence[Network]) -> bool:
    """Public, or inside a network the operator opened (an IPv4-mapped address is judged as its IPv4)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return is_public(ip) or any(ip.version == net.version and ip in net for net in allowed)


def _literal_ip(host: str) -> IPAddress | None:
    """The address a host names literally, in any form the resolver would accept (`127.1`, `0x7f000001`)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if all(c in "0123456789abcdefABCDEFxX." for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def check_url(url: object, field: str, allowed: Sequence[Network] = ()) -> str:
    """The URL if a webhook may be created with it; ValueError whose message starts with `field`."""
    url = check_url_shape(url, field)
    host = urlsplit(url).hostname or ""
    ip = _literal_ip(host)
    if host == "localhost" or host.endswith(".localhost"):
        ip = ipaddress.IPv4Address("127.0.0.1")  # the broker's own host, whatever the resolver says
    if ip is not None and not is_allowed(ip, allowed):
        raise ValueError(
            f"{field} points at a non-public address ({ip}); deliveries go to public addresses only "
            "(an operator can open a private network with OVERSPILL_WEBHOOK_ALLOWED_NETWORKS)"
        )
    return url


def check_url_shape(url: object, field: str) -> str:
    """What `check_url` checks that needs no settings: scheme, host, no user info, no control characters."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"{field} must be an http(s) URL")
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"{field} is longer than {MAX_URL_LENGTH} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise ValueError(f"{field} must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError as exc:
        raise ValueError(f"{field} is not a valid URL ({exc})") from exc
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{field} must be an http(s) URL")
    if "@" in parts.netloc:
        raise ValueError(f"{field} must not carry user info (user:password@); put a token in the path or query")
    host = parts.hostname or ""
    if not host:
        raise ValueError(f"{field} must name a host")
    if not host.isascii():
        raise ValueError(f"{field}: write an internationalised host name in its punycode (xn--) form")
    return url


def resolve(host: str, port: int, allowed: Sequence[Network], deadline: float) -> IPAddress:
    """One checked address of `host` (the first the resolver gave); UnsafeTarget if any answer is not allowed."""
    literal = _literal_ip(host)
    if literal is not None:
        addresses = [literal]
    else:
        answers = _getaddrinfo(host, port, deadline)
        addresses = []
        for *_ignored, sockaddr in answers:
            ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if ip not in addresses:
                addresses.append(ip)
        if not addresses:
            raise NotifyError(f"{host} has no address")
    refused = [ip for ip in addresses if not is_allowed(ip, allowed)]
    if refused:
        raise UnsafeTarget(
            f"{host} resolves to a non-public address ({refused[0]}); deliveries go to public addresses only"
        )
    return addresses[0]


def _getaddrinfo(host: str, port: int, deadline: float) -> list[Any]:
    """`socket.getaddrinfo` within the deadline (the resolver cannot be interrupted: a late answer is dropped)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["answers"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, name="overspill-resolve", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        raise DeliveryTimeout(f"resolving {host} took longer than the delivery deadline")
    if "error" in box:
        raise NotifyError(f"cannot resolve {host}: {box['error']}")
    return list(box["answers"])


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation gets at most what is left of the delivery's deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def _left(self, timeout: float | None, exc: type[Exception]) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise exc("the delivery's total deadline passed")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), _CHUNK):  # a server reading slowly cannot stretch one big write
            self._inner.write(buffer[start : start + _CHUNK], self._left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, self._left(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _PinnedBackend(httpcore.NetworkBackend):
    """Connects to the address checked before, whatever host the request names."""

    def __init__(self, address: IPAddress, deadline: float) -> None:
        self._address = address
        self._deadline = deadline
        self._sync = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ConnectTimeout("the delivery's total deadline passed")
        stream = self._sync.connect_tcp(
            str(self._address),
            port,
            timeout=left if timeout is None else min(timeout, left),
            local_address=local_address,
            socket_options=socket_options,
        )
        return _DeadlineStream(stream, self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not delivery targets")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def post(
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    *,
    allowed: Sequence[Network] = (),
    deadline_seconds: float,
) -> int:
    """POST `content` to `url` under the rules of the module docstring; returns the 2xx status."""
    shown = redact_url(url)
    deadline = time.monotonic() + deadline_seconds
    try:
        check_url(url, "url", allowed)
    except ValueError as exc:
        raise UnsafeTarget(f"webhook {shown}: {str(exc).removeprefix('url ')}") from exc
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        address = resolve(host, port, allowed, deadline)
    except NotifyError as exc:
        raise type(exc)(f"webhook {shown}: {exc}") from exc
    host_header = f"[{host}]" if ":" in host else host
    if parts.port:
        host_header += f":{parts.port}"
    request_headers = [("Host", host_header), ("Content-Length", str(len(content)))]
    request_headers += [(k, v) for k, v in headers.items() if k.lower() not in ("host", "content-length")]
    step = max(0.001, deadline_seconds)
    timeouts = {"connect": step, "read": step, "write": step, "pool": step}
    try:
        with (
            httpcore.ConnectionPool(
                ssl_context=ssl.create_default_context(),
                network_backend=_PinnedBackend(address, deadline),
                retries=0,
                max_connections=1,
            ) as pool,
            pool.stream(
                "POST", url, headers=request_headers, content=content, extensions={"timeout": timeouts}
            ) as response,
        ):
            status = int(response.status)  # the body is never read: it is not ours to repeat
    except httpcore.TimeoutException as exc:
        if time.monotonic() >= deadline:
            raise DeliveryTimeout(f"webhook {shown}: no answer within the {deadline_seconds:g} s deadline") from exc
        raise NotifyError(f"webhook {shown}: {type(exc).__name__}") from exc
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, ssl.SSLError) as exc:
        raise NotifyError(f"webhook {shown}: {type(exc).__name__}: {exc}") from exc
    if 300 <= status < 400:
        raise NotifyError(f"webhook {shown} answered HTTP {status} (redirects are not followed)")
    if not 200 <= status < 300:
        raise NotifyError(f"webhook {shown} answered HTTP {status}")
    return status
