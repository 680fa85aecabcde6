"""The listening socket of `overspill serve`, bound before anything else happens.

`listen(host, port)` returns a TCP socket bound and listening (IPv6 when `host` holds a colon), with SO_REUSEADDR
as uvicorn sets it (a port left in TIME_WAIT by the last run is reusable; one another process listens on is not).
Any failure raises `PortUnavailable` with one line naming the address and the reason (`127.0.0.1:8000 is already
in use`), so the command can refuse before it prints its banner or the development key.
"""

from __future__ import annotations

import errno
import socket


class PortUnavailable(Exception):
    """The address cannot be listened on; `str()` is one line naming it and why."""


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A socket listening on `host:port` (see the module docstring)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortUnavailable(f"{where} is already in use") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise PortUnavailable(f"{where}: permission denied (ports below 1024 need privileges)") from None
        reason = exc.strerror or str(exc)
        raise PortUnavailable(f"cannot listen on {where}: {reason}") from None
    except OverflowError:
        sock.close()
        raise PortUnavailable(f"cannot listen on {where}: a port is 0-65535") from None
    sock.set_inheritable(True)
    return sock
