"""A process outside the project taking a leased port before its server binds it: the first
port `lease_ports` draws is bound at once by a socket of the test's."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
from recsys_tools.localstack import ports
from recsys_tools.localstack.ports import LOOPBACK, PortLease


@contextmanager
def squatting_first_lease(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[socket.socket]]:
    """The squatter's socket (one, once a lease is drawn) and every draw's ports."""
    held: list[socket.socket] = []
    lease = ports.lease_ports

    def squat_first(count: int = 1, *, offsets: Sequence[int] = (0,)) -> list[PortLease]:
        leases = lease(count, offsets=offsets)
        if not held:
            squatter = socket.socket()
            squatter.bind((LOOPBACK, leases[-1].port))  # a group's last port
            squatter.listen()
            held.append(squatter)
        return leases

    monkeypatch.setattr(ports, "lease_ports", squat_first)
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def squatted_port(held: list[socket.socket]) -> int:
    (squatter,) = held
    port: int = squatter.getsockname()[1]
    return port
