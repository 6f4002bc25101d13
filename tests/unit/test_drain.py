import asyncio
import os
import signal
from types import FrameType

from app.process.drain import drain_on_sigterm


async def test_sigterm_marks_draining_at_once_and_stops_the_server_after_the_delay() -> None:
    stopped: list[float] = []
    drained: list[float] = []
    loop = asyncio.get_running_loop()

    def server_handler(signum: int, frame: FrameType | None) -> None:
        stopped.append(loop.time())

    original = signal.signal(signal.SIGTERM, server_handler)
    try:
        restore = drain_on_sigterm(0.2, lambda: drained.append(loop.time()))
        sent = loop.time()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)
        assert len(drained) == 1
        assert not stopped
        await asyncio.sleep(0.3)
        assert len(stopped) == 1
        assert stopped[0] - sent >= 0.2
        restore()
        assert signal.getsignal(signal.SIGTERM) is server_handler
    finally:
        signal.signal(signal.SIGTERM, original)


async def test_a_second_sigterm_stops_at_once() -> None:
    stopped: list[int] = []

    def server_handler(signum: int, frame: FrameType | None) -> None:
        stopped.append(signum)

    original = signal.signal(signal.SIGTERM, server_handler)
    try:
        restore = drain_on_sigterm(10.0, lambda: None)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.01)
        assert stopped == [signal.SIGTERM]
        restore()
    finally:
        signal.signal(signal.SIGTERM, original)


async def test_without_a_server_handler_nothing_is_installed() -> None:
    original = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        drain_on_sigterm(1.0, lambda: None)()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, original)
