"""Admission control: how much work one worker process takes on, and when it refuses more.

A worker serves requests on one event loop. Past its capacity, extra requests only make
every request slower, so two signals refuse work early and cheaply:

- in flight: at most `max_in_flight` requests are handled at once;
- queueing: the event loop's lag, how late it runs what is due. Requests that arrive while
  the loop is behind sit unread in socket buffers for about that long before the service
  even sees them; once that wait passes `max_queue_s` a new request is refused, since it
  has already spent part of its budget waiting.

The lag also dates each admitted request: its deadline counts from when it probably
arrived, not from when the handler got to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

SAMPLE_INTERVAL_S = 0.005
# Weight of the newest lag sample: one late callback (a GC pause) must not shed a burst,
# a loop that stays late must within a few samples.
SMOOTHING = 0.3


class LoopLag:
    """A smoothed measure of how late the event loop runs a callback due now."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self.lag_s = 0.0

    def observe(self, late_s: float) -> None:
        self.lag_s += SMOOTHING * (max(0.0, late_s) - self.lag_s)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        # The first wake-up also waits out the rest of start-up (binding sockets, and so on):
        # it says nothing about requests, so it is not counted.
        await asyncio.sleep(self._interval_s)
        while True:
            start = loop.time()
            await asyncio.sleep(self._interval_s)
            self.observe(loop.time() - start - self._interval_s)


class Admission:
    """Counts requests in flight and decides, per request, to take it or to refuse it."""

    def __init__(
        self,
        max_in_flight: int,
        max_queue_s: float,
        lag: LoopLag,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self._max_in_flight = max_in_flight
        self._max_queue_s = max_queue_s
        self._lag = lag
        self._on_change = on_change
        self.in_flight = 0

    @property
    def queued_s(self) -> float:
        """About how long a request arriving now waited before it was read."""
        return self._lag.lag_s

    def refusal(self) -> str | None:
        """Why a request arriving now must be refused; None when it can be taken."""
        if self.in_flight >= self._max_in_flight:
            return f"{self.in_flight} requests in flight"
        if self._lag.lag_s > self._max_queue_s:
            return f"requests wait {self._lag.lag_s * 1000:.0f} ms before they are read"
        return None

    def enter(self) -> None:
        self.in_flight += 1
        if self._on_change is not None:
            self._on_change(self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1
        if self._on_change is not None:
            self._on_change(self.in_flight)
