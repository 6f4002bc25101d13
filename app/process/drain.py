"""SIGTERM drains before it stops: readiness fails at once, requests keep being served.

A load balancer polls readiness every few seconds; an instance that stopped listening the
moment it got SIGTERM would refuse the requests sent before the balancer noticed. So the
first SIGTERM only marks the service as draining, and `drain_s` later hands the signal to
the server's own handler, which stops accepting, lets in-flight requests finish (up to its
graceful-shutdown timeout) and runs the lifespan shutdown. A second SIGTERM stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)


def drain_on_sigterm(drain_s: float, on_drain: Callable[[], None]) -> Callable[[], None]:
    """Install the handler in front of the server's; return what puts the server's back.

    Does nothing when no server handler is installed (the app run by a test, say).
    """
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):
        return lambda: None
    loop = asyncio.get_running_loop()
    draining = False

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal draining
        if draining:
            previous(signum, frame)
            return
        draining = True
        on_drain()
        log.info("SIGTERM: not ready; stopping in %.1f s", drain_s)
        loop.call_soon_threadsafe(loop.call_later, drain_s, previous, signum, frame)

    signal.signal(signal.SIGTERM, handle)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


def cancel_on_stop_signals(task: asyncio.Task[object]) -> Callable[[], None]:
    """While `task` (the start-up) runs, SIGINT and SIGTERM cancel it, then reach the server.

    The server's own handlers only set a flag it reads once start-up is over: without this, a
    Ctrl-C during a long start-up (waiting for Redis or Triton) is ignored until a second one.
    Returns what puts the previous handlers back.
    """
    loop = asyncio.get_running_loop()
    restored: dict[int, Callable[[int, FrameType | None], object]] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue
        restored[sig] = previous

        def handle(signum: int, frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(task.cancel)
            restored[signum](signum, frame)

        signal.signal(sig, handle)

    def restore() -> None:
        for sig, previous in restored.items():
            signal.signal(sig, previous)

    return restore
