"""TCP ports for the servers the project starts, that nothing takes between choosing and binding.

A port the kernel hands out for a bind to port 0 comes from its ephemeral range, the range
every outgoing connection's local port and every other bind to port 0 on the host are drawn
from. Chosen that way, released and bound by the server a few seconds later, it can be taken
in between (seen: the API refused its port while Prometheus, started first, was connecting).

So a port here is leased: drawn outside the ephemeral range (and outside the ports an operator
reserved), free when drawn, and held by a file lock from then until the lease is released, so
that no other process leasing through this module, the tests' or the demo's, draws it too.
What remains is a process outside the project binding it on purpose: `start_on_ports` starts
the server again on other ports when it finds its port taken, rather than failing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import random
import re
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("recsys.localstack")

LOOPBACK = "127.0.0.1"
# Below this, ports are where hosts run their services (8080, 9090, 6379...).
LOWEST = 10_000
HIGHEST = 65_535
# The kernel's range where /proc does not tell it: Linux's default.
DEFAULT_EPHEMERAL = (32_768, 60_999)
# Fewer candidates than this outside the ephemeral range (a host that gave it nearly every
# port) and the ports are drawn from all of them: the locks and the retries still hold.
ENOUGH_CANDIDATES = 2_000
DRAWS = 500
# A server whose port was taken is started again on new ports this many times in all.
ATTEMPTS = 5
# How servers say that their port was taken (uvicorn through the API's own check, Triton's
# gRPC and HTTP services, redis-server, Go's and Python's servers, the JVM).
_IN_USE = re.compile(
    r"address already in use|already in use|\bis in use\b|EADDRINUSE|BindException", re.I
)

T = TypeVar("T")


def _lock_directory() -> Path:
    """One folder for every user of the host: ports are the host's, not a user's."""
    folder = Path(os.environ.get("RECSYS_PORT_LOCKS", Path(tempfile.gettempdir()) / "recsys-ports"))
    if not folder.is_dir():
        with contextlib.suppress(FileExistsError):
            folder.mkdir(parents=True)
            folder.chmod(0o1777)  # like /tmp: anyone may lock, nobody removes another's file
    return folder


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for outgoing connections and binds to port 0."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def reserved_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")) -> set[int]:
    """The ports an operator kept out of the ephemeral range for services of their own."""
    try:
        text = path.read_text().strip()
    except OSError:
        return set()
    kept: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        kept.update(range(int(first), int(last or first) + 1))
    return kept


def candidate_ports(
    ephemeral: tuple[int, int] | None = None, reserved: set[int] | None = None
) -> list[int]:
    """The ports a lease is drawn from: outside the ephemeral range and the reserved ports."""
    low, high = ephemeral or ephemeral_range()
    kept = reserved_ports() if reserved is None else reserved
    outside = [p for p in range(LOWEST, HIGHEST + 1) if not low <= p <= high and p not in kept]
    if len(outside) >= ENOUGH_CANDIDATES:
        return outside
    log.warning(
        "the ephemeral range %d-%d leaves %d ports outside it: drawing from the whole range",
        low,
        high,
        len(outside),
    )
    return [p for p in range(LOWEST, HIGHEST + 1) if p not in kept]


def port_in_use(port: int) -> bool:
    """Whether a socket on the host holds the port, as a server binding it would find.

    Servers bind with SO_REUSEADDR, which a connection of their own left in TIME_WAIT does not
    refuse; so the probe binds the same way.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


@dataclass(slots=True)
class PortLease:
    """A port held for its server: no other lease draws it until released (or this process
    ends, which releases its locks)."""

    port: int
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops its lock
            self._fd = None

    def __enter__(self) -> int:
        return self.port

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock(port: int) -> int | None:
    """The lock file of `port`, held; None while another lease holds it."""
    path = _lock_directory() / str(port)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except PermissionError:
        return None  # another user's file we may not lock: count the port as held
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _try_lease(ports: Sequence[int]) -> list[PortLease] | None:
    """Leases on every one of `ports`, or on none of them."""
    held: list[PortLease] = []
    for port in ports:
        fd = _lock(port)
        if fd is None:
            break
        held.append(PortLease(port, fd))
        if port_in_use(port):
            break
    else:
        return held
    for lease in held:
        lease.release()
    return None


def lease_ports(count: int = 1, *, offsets: Sequence[int] = (0,)) -> list[PortLease]:
    """`count` free ports, each held until released.

    With `offsets`, each draw leases a group: a port and the ports at those offsets from it,
    every one outside the ephemeral range (a Redis Cluster node's bus listens 10,000 above
    its port). The leases come in draw order, a group's together.
    """
    candidates = candidate_ports()
    allowed = set(candidates)
    bases = [p for p in candidates if all(p + offset in allowed for offset in offsets)]
    if not bases:
        raise RuntimeError(f"no port has every one of {list(offsets)} above it free to lease")
    leases: list[PortLease] = []
    try:
        for _ in range(count):
            leases += _draw(bases, offsets)
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    return leases


def _draw(bases: list[int], offsets: Sequence[int]) -> list[PortLease]:
    for _ in range(DRAWS):
        base = random.choice(bases)
        group = _try_lease([base + offset for offset in offsets])
        if group is not None:
            return group
    raise RuntimeError(f"no free port to lease after {DRAWS} draws")


@contextlib.contextmanager
def leased_port() -> Iterator[int]:
    """A port that nothing listens on while the block runs: for a server's address that must
    be refused, or one a test binds itself."""
    (lease,) = lease_ports()
    with lease as port:
        yield port


def collided(error: BaseException, ports: Sequence[int]) -> bool:
    """Whether a server's failed start was its port being taken: its log says so, or a socket
    of another process holds one of its ports now that it has stopped."""
    return bool(_IN_USE.search(str(error))) or any(port_in_use(port) for port in ports)


def start_on_ports(
    name: str,
    count: int,
    start: Callable[[list[int]], T],
    *,
    offsets: Sequence[int] = (0,),
    attempts: int = ATTEMPTS,
) -> tuple[T, list[PortLease]]:
    """`start(ports)` on `count` leased ports (groups, with `offsets`); again on new ports
    while a start fails because one of them was taken. Returns what `start` returned and the
    leases, for the caller to release once the server has stopped.

    `start` must return only once the server listens, and must have stopped it when it
    raises.
    """
    for attempt in range(1, attempts + 1):
        leases = lease_ports(count, offsets=offsets)
        ports = [lease.port for lease in leases]
        try:
            return start(ports), leases
        except Exception as exc:
            taken = collided(exc, ports)  # asked while the leases still keep others off
            for held in leases:
                held.release()
            if attempt == attempts or not taken:
                raise
            log.warning(
                "%s found one of its ports %s taken (try %d of %d): starting it on others",
                name,
                ports,
                attempt,
                attempts,
            )
    raise AssertionError("unreachable: the last attempt returns or raises")
