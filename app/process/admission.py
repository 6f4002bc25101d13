"""Admission control: how much work one worker process takes on, and when it refuses more.

A request is taken at once while fewer than the limit (app.process.concurrency_limit, adapted to
latency) are in flight. Beyond it, it waits in line for a slot, first come first served,
for at most what is left of `max_queue_s` once the time it waited unread is counted; a
full line, or a wait that runs out, refuses it. So a burst far below capacity (the
requests a one-off stall left unread, say) is served a few milliseconds late instead of
refused. When most requests of the limit's last window found
every slot taken, the worker is past capacity, not in a burst: a request that finds them
taken is refused at once, so refusals under sustained overload cost no wait, and nobody
waits in vain for a slot that will not come in time.

The loop's standing lag (app.process.loop_lag) refuses too: when the loop stays behind, requests
have already waited unread for longer than `max_queue_s` before the service sees them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from app.core.outcomes import Refusal
from app.process.concurrency_limit import AdaptiveLimit
from app.process.loop_lag import LoopLag


class OverloadedError(Exception):
    """The request is refused before any work; the message says why."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Admission:
    def __init__(
        self,
        limit: AdaptiveLimit,
        lag: LoopLag,
        max_queue_s: float,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self.limit = limit
        self._lag = lag
        self._max_queue_s = max_queue_s
        self._on_change = on_change
        self._waiting: deque[asyncio.Future[None]] = deque()
        self.in_flight = 0

    @property
    def queued_s(self) -> float:
        """About how long a request arriving now waited before it was read."""
        return self._lag.lag_s

    async def enter(self) -> None:
        """Take a slot, waiting in line if need be; OverloadedError when none comes in time."""
        standing = self._lag.standing_s
        if standing > self._max_queue_s:
            message = f"requests wait {standing * 1000:.0f} ms before they are read"
            raise OverloadedError(Refusal.LOOP_BEHIND, message)
        full = self.in_flight >= self.limit.current or bool(self._waiting)
        self.limit.note_arrival(full)
        if not full:
            self._count(+1)
            return
        waiting = len(self._waiting)
        if self.limit.saturated or waiting >= self._line_length():
            message = f"{self.in_flight} requests in flight and {waiting} waiting"
            raise OverloadedError(Refusal.FULL, message)
        # The line's wait and the time unread share one allowance: a request the loop read
        # late has less left to spend in line.
        allowance_s = self._max_queue_s - self._lag.lag_s
        if allowance_s <= 0:
            message = f"requests wait {self._lag.lag_s * 1000:.0f} ms before they are read"
            raise OverloadedError(Refusal.NO_SLOT, message)
        await self._wait_for_slot(allowance_s)

    def _line_length(self) -> int:
        """How many can wait: as many as slots are likely to come free in `max_queue_s` (a
        slot frees every latency / limit), so that few who wait wait in vain."""
        limit, latency_s = self.limit.current, self.limit.latency_s
        if latency_s is None or latency_s <= 0:
            return limit
        return max(1, min(limit, int(self._max_queue_s * limit / latency_s)))

    async def _wait_for_slot(self, allowance_s: float) -> None:
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            async with asyncio.timeout(allowance_s):
                await turn
        except TimeoutError:
            if turn.done() and not turn.cancelled():
                return  # handed a slot just as the time ran out: it is this request's
            message = f"no slot came free within {allowance_s * 1000:.0f} ms"
            raise OverloadedError(Refusal.NO_SLOT, message) from None
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.leave()  # handed a slot, then cancelled (the client went away)
            raise
        finally:
            if turn in self._waiting:
                self._waiting.remove(turn)
            turn.cancel()

    def leave(self, service_s: float | None = None) -> None:
        """Give the slot back (to the next in line, if the limit still has room for it).

        `service_s`, the time from the slot to the answer, teaches the limit; None for an
        answer that says nothing about capacity (refused by validation, say).
        """
        if service_s is not None:
            self.limit.observe(service_s)
        while self._waiting and self.in_flight <= self.limit.current:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot passes on: in_flight stays as it is
                return
        self._count(-1)

    def _count(self, change: int) -> None:
        self.in_flight += change
        if self._on_change is not None:
            self._on_change(self.in_flight)
