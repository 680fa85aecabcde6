"""broker.finance.outbound against real local servers (HTTP and HTTPS with a test CA): the connection goes to the
address checked once (a second DNS answer cannot switch it), the original host name travels in `Host`, SNI and the
certificate check, a redirect is a failed delivery, any non-public answer among several refuses the host, and the
URL rules at creation. DNS is the one stand-in: no resolver here can be told to change its answer between two
questions, so `socket.getaddrinfo` is replaced where a test needs a name to resolve to a chosen address."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from broker.finance import outbound
from broker.finance.outbound import NotifyError, UnsafeTarget, check_url, post, redact_url
from tests.attacks.finance_parts import InternalService
from tests.local_server import QuietHTTPServer

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


def _fake_dns(monkeypatch: pytest.MonkeyPatch, answers: list[list[str]]) -> list[str]:
    """Each call to getaddrinfo gets the next list of addresses; returns the names asked."""
    asked: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        try:
            ipaddress.ip_address(host)
            return real(host, port, *args, **kwargs)  # a literal: no DNS question (the pinned connect)
        except ValueError:
            pass
        asked.append(host)
        addresses = answers[min(len(asked), len(answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]

    monkeypatch.setattr(outbound.socket, "getaddrinfo", getaddrinfo)
    return asked


def test_the_checked_address_is_the_one_connected_to_and_the_name_travels_in_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with InternalService() as receiver:
        asked = _fake_dns(monkeypatch, [["127.0.0.1"], ["10.0.0.1"]])  # a rebinding answer second
        status = post(f"http://hooks.test:{receiver.port}/in?t=1", b"{}", {}, allowed=LOOPBACK, deadline_seconds=5)
    assert status == 200 and asked == ["hooks.test"]  # asked once: nothing to rebind
    [(method, path, headers, body)] = receiver.requests
    assert (method, path, headers["Host"], body) == ("POST", "/in?t=1", f"hooks.test:{receiver.port}", b"{}")


def test_any_non_public_answer_refuses_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, [["93.184.215.14", "169.254.169.254"]])
    with pytest.raises(UnsafeTarget, match=r"169\.254\.169\.254"):
        post("http://hooks.test/x", b"", {}, deadline_seconds=5)


def test_a_redirect_is_a_failed_delivery_and_is_not_followed() -> None:
    with InternalService() as internal, InternalService(status=302) as receiver:
        receiver.body = b""
        original = receiver._server.RequestHandlerClass.send_response  # type: ignore[attr-defined]

        def redirect(handler: Any, code: int, message: str | None = None) -> None:
            original(handler, code, message)
            handler.send_header("Location", internal.url() + "/admin")

        receiver._server.RequestHandlerClass.send_response = redirect  # type: ignore[attr-defined]
        with pytest.raises(NotifyError, match="HTTP 302 \\(redirects are not followed\\)"):
            post(receiver.url() + "/hook", b"x", {}, allowed=LOOPBACK, deadline_seconds=5)
    assert len(receiver.requests) == 1 and internal.requests == []


@pytest.fixture
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, list[str | None]]]:
    """An HTTPS server on 127.0.0.1 whose certificate (from a test CA, trusted through SSL_CERT_FILE) is for
    hooks.test only; yields its port and the SNI names it was greeted with."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "overspill test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hooks.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("hooks.test")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    greeted: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    context.sni_callback = lambda _sock, name, _ctx: greeted.append(name)  # type: ignore[assignment,func-returns-value]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = QuietHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), greeted
    finally:
        server.shutdown()
        server.server_close()


def test_https_keeps_the_name_for_sni_and_the_certificate_check(
    tls: tuple[int, list[str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, greeted = tls
    _fake_dns(monkeypatch, [["127.0.0.1"]])
    assert post(f"https://hooks.test:{port}/x", b"{}", {}, allowed=LOOPBACK, deadline_seconds=5) == 204
    assert greeted == ["hooks.test"]
    _fake_dns(monkeypatch, [["127.0.0.1"]])
    with pytest.raises(NotifyError, match="ConnectError"):  # the certificate is not for this name
        post(f"https://other.test:{port}/x", b"{}", {}, allowed=LOOPBACK, deadline_seconds=5)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://hooks.example.com/x", "must be an http(s) URL"),
        ("https://user:pw@hooks.example.com/x", "user info"),
        ("https:///x", "must name a host"),
        ("https://hooks.example.com:99999/x", "not a valid URL"),
        ("https://hooks.example.com/a b", "spaces or control characters"),
        ("https://hooks.example.com/\r\nX: y", "spaces or control characters"),
        ("https://bücher.example/x", "punycode"),
        ("http://[::1]:80/", "non-public address"),
        ("http://0177.0.0.1/", "non-public address"),
        ("http://metadata.localhost/", "non-public address"),
        ("https://" + "a" * 500 + ".com/", "longer than"),
    ],
)
def test_urls_refused_at_creation(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=r"^webhook_url") as refused:
        check_url(url, "webhook_url")
    assert problem in str(refused.value)


def test_allowed_networks_open_private_literals_and_redaction_keeps_scheme_and_host() -> None:
    assert check_url("http://127.0.0.1:8080/x", "webhook_url", LOOPBACK)
    assert check_url("https://hooks.slack.com/services/T/B/X", "webhook_url")
    assert redact_url("https://hooks.slack.com/services/T000/B000/XXXX?token=1") == "https://hooks.slack.com"
    assert redact_url("http://[2001:db8::1]:8443/p?q") == "http://[2001:db8::1]:8443"
    assert redact_url("not a url") == "<invalid url>"
