"""TCP ports for the servers the project starts, that nothing takes between choosing and binding.

A port the kernel hands out for a bind to port 0 comes from its ephemeral range, the range
every outgoing connection's local port and every other bind to port 0 on the host are drawn
from. Chosen that way, released and bound by the server a few seconds later, it can be taken
in between (seen: the API refused its port while Prometheus, started first, was connecting).

So a port here is leased: drawn outside the ephemeral range (and outside the ports an operator
reserved), free when drawn, and held by a file lock from then until the lease is released, so
that no other process leasing through this module, the tests' or the demo's, draws it too.
What remains is a process outside the project binding it on purpose: `start_on_ports` starts
the server again on other ports when it finds its port taken, rather than failing. (A server
that can bind port 0 itself and say which it got, as Spark's processes do, needs no lease.)

The locks are files, one a port, in /tmp/recsys-ports (RECSYS_PORT_LOCKS elsewhere, as the
tests do): never deleted, since unlinking a file another process holds locked would let a
third lock a new one of the same name.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import random
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from app.core.binding import bind_error, in_use

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
# How servers say that their port was taken ("Address already in use": Triton, redis-server,
# Go's and Python's servers; "is in use": the API's own check, app.cli).
_IN_USE = re.compile(r"already in use|\bis in use\b", re.I)

T = TypeVar("T")


def _lock_directory() -> Path:
    """One folder for every user of the host (ports are the host's, not a user's), like
    /tmp: anyone may lock in it, nobody removes another's file. A folder there that is not
    that (a link, another user's own) is not trusted: this user's own folder instead."""
    shared = Path(os.environ.get("RECSYS_PORT_LOCKS", "/tmp/recsys-ports"))
    with contextlib.suppress(FileExistsError):
        shared.mkdir(mode=0o1777, parents=True)
        shared.chmod(0o1777)  # mkdir's mode is masked by the umask
    if _trusted(shared):
        return shared
    own = shared.with_name(f"{shared.name}-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        own.mkdir(mode=0o700, parents=True)
    if not _trusted(own):
        raise RuntimeError(f"neither {shared} nor {own} is a folder to keep port locks in")
    return own


def _trusted(folder: Path) -> bool:
    """A real folder (no link), this user's or root's, that no other user can empty."""
    try:
        status = folder.lstat()
    except OSError:
        return False
    mode = status.st_mode
    others_may_write = bool(mode & (stat.S_IWGRP | stat.S_IWOTH))
    return (
        stat.S_ISDIR(mode)
        and status.st_uid in (0, os.getuid())
        and (not others_may_write or bool(mode & stat.S_ISVTX))
        and os.access(folder, os.W_OK)
    )


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for outgoing connections and binds to port 0."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def reserved_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")) -> set[int]:
    """The ports an operator kept out of the ephemeral range for services of their own."""
    kept: set[int] = set()
    try:
        for part in filter(None, path.read_text().strip().split(",")):
            first, _, last = part.partition("-")
            kept.update(range(int(first), int(last or first) + 1))
    except (OSError, ValueError):
        return kept
    return kept


def candidate_ports(
    ephemeral: tuple[int, int] | None = None, reserved: set[int] | None = None
) -> list[int]:
    """The ports a lease is drawn from: outside the ephemeral range and the reserved ports;
    all but the reserved ones where the range leaves too few outside it."""
    low, high = ephemeral or ephemeral_range()
    kept = reserved_ports() if reserved is None else reserved
    outside = [p for p in range(LOWEST, HIGHEST + 1) if not low <= p <= high and p not in kept]
    if len(outside) >= ENOUGH_CANDIDATES:
        return outside
    _warn_once(low, high, len(outside))
    return [p for p in range(LOWEST, HIGHEST + 1) if p not in kept]


@functools.cache
def _warn_once(low: int, high: int, outside: int) -> None:
    log.warning(
        "the ephemeral range %d-%d leaves %d ports outside it: drawing from all of them",
        low,
        high,
        outside,
    )


def port_in_use(port: int) -> bool:
    """Whether a socket on the host holds the port, as a server binding it would find."""
    return in_use(bind_error(LOOPBACK, port))


@dataclass(slots=True)
class PortLease:
    """A port held for its server: no other lease draws it until released (or this process
    ends, which releases its locks)."""

    port: int
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._fd is not None:
            # Unlocked before closed: a child forked meanwhile shares the file, and its
            # copy would otherwise keep the lock until it exits.
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> int:
        return self.port

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock(folder: Path, port: int) -> int | None:
    """The lock file of `port`, held; None while another lease holds it. The file is read
    only (a lock needs no more), made readable by all, and never followed through a link."""
    path = folder / str(port)
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            os.fchmod(fd, 0o644)
    except OSError:
        return None  # a link, another lease's file just made, or one we may not read
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _try_lease(folder: Path, ports: Sequence[int]) -> list[PortLease] | None:
    """Leases on every one of `ports`, or on none of them."""
    held: list[PortLease] = []
    for port in ports:
        fd = _lock(folder, port)
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
    if len(bases) < ENOUGH_CANDIDATES and offsets != (0,):
        # The range leaves few such groups outside it: any group, locked and probed.
        everywhere = range(LOWEST, HIGHEST + 1 - max(offsets))
        bases = [p for p in everywhere if all(p + offset >= LOWEST for offset in offsets)]
    if not bases:
        raise RuntimeError(f"no ports at offsets {list(offsets)} from one another to lease")
    folder = _lock_directory()
    leases: list[PortLease] = []
    try:
        for _ in range(count):
            leases += _draw(folder, bases, offsets)
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    return leases


def _draw(folder: Path, bases: list[int], offsets: Sequence[int]) -> list[PortLease]:
    for _ in range(DRAWS):
        base = random.choice(bases)
        group = _try_lease(folder, [base + offset for offset in offsets])
        if group is not None:
            return group
    raise RuntimeError(f"no free port to lease after {DRAWS} draws (locks in {folder})")


@contextlib.contextmanager
def leased_port() -> Iterator[int]:
    """A port that nothing listens on while the block runs: for a server's address that must
    be refused, or one a test binds itself."""
    (lease,) = lease_ports()
    with lease as port:
        yield port


def collided(error: BaseException, ports: Sequence[int]) -> bool:
    """Whether a server's failed start was one of its ports being taken: a line of what it
    said names the port as in use, or a socket of another process holds the port now that
    the server has stopped."""
    named = [re.compile(rf"\b{port}\b") for port in ports]
    for line in str(error).splitlines():
        if _IN_USE.search(line) and any(port.search(line) for port in named):
            return True
    return any(port_in_use(port) for port in ports)


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
        except BaseException as exc:
            # Asked while the leases still keep others off; an interrupt is never retried.
            taken = isinstance(exc, Exception) and collided(exc, ports)
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
