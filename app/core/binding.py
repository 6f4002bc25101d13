"""Whether a TCP port can be bound: the one probe of the server's start-up check and of the
local stack's port leases."""

from __future__ import annotations

import errno
import socket


def bind_error(host: str, port: int) -> OSError | None:
    """What binding `port` on `host` as a server does (SO_REUSEADDR, which a connection of
    its own left in TIME_WAIT does not refuse) raises now, or None when it would succeed."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def in_use(error: OSError | None) -> bool:
    return error is not None and error.errno == errno.EADDRINUSE
