"""How late the event loop runs what is due: the time requests wait unread before they start.

A worker serves requests on one event loop. While the loop is busy, new requests sit in
socket buffers, unseen; the loop's lag is about how long. Two readings of it:

- `lag_s`, smoothed: what dates an admitted request back to when it probably arrived;
- `standing_s`, the least lag over the last STANDING_SAMPLES samples (about 0.1 s): high only
  while the loop stays behind. A one-off stall (a garbage collection, a reload, start-up's
  last steps) leaves it low, so it sheds nothing; a loop that cannot keep up raises it within
  a tenth of a second. (CoDel's reading of a queue: its minimum over an interval.)
"""

from __future__ import annotations

import asyncio
from collections import deque

SAMPLE_INTERVAL_S = 0.005
STANDING_SAMPLES = 20
# Weight of the newest sample in the smoothed lag.
SMOOTHING = 0.3


class LoopLag:
    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self.lag_s = 0.0
        self._recent: deque[float] = deque(maxlen=STANDING_SAMPLES)

    @property
    def standing_s(self) -> float:
        """The least lag of the recent samples: how far behind the loop stays."""
        return min(self._recent) if len(self._recent) == self._recent.maxlen else 0.0

    def observe(self, late_s: float) -> None:
        late = max(0.0, late_s)
        self.lag_s += SMOOTHING * (late - self.lag_s)
        self._recent.append(late)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        # The first wake-up also waits out the rest of start-up (binding sockets, and so on):
        # it says nothing about requests, so it is not counted.
        await asyncio.sleep(self._interval_s)
        while True:
            start = loop.time()
            await asyncio.sleep(self._interval_s)
            self.observe(loop.time() - start - self._interval_s)
