"""The processes beside the API (the ingest consumer, the archive) stop the same way: SIGTERM
or SIGINT sets an event, and the work finishes what it holds before it returns."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable


async def until_signalled(work: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await work(stop)
