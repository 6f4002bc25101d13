"""How many requests one worker handles at once, adapted to the latency they get.

Past capacity, another request in flight only queues for the CPU: every answer slows down
until deadlines pass and answers degrade. A fixed limit is either too low for a fast
machine or too high for a slow or busy one; this one follows what the machine gives now.
It is AIMD whose decrease is scaled by how far latency overshoots, as gradient limits do
(Netflix's concurrency-limits, Envoy's adaptive concurrency):

- every window (WINDOW_S, at least MIN_SAMPLES answers) the median service time of its
  answers is compared with a target: `tolerance` times the baseline, the least window median
  of the last BASELINE_S (latency without queueing), and never more than `max_latency_s`.
  The tolerance is wide (3) because on a shared host latency also grows with load through
  the processes beside the worker (Triton, Redis), not only through its own queue;
- over the target in two windows running while demand reached the limit, it shrinks by
  target / median (at most halved at once): one noisy window is not overload, and latency
  that rose while slots stood free (a slow dependency, a busier machine) is not caused by
  admitting too much, nor cured by admitting less;
- within it, and when demand reached the limit during the window, it grows by one.

The baseline remembers BASELINE_S: long enough that an overload burst cannot talk it up,
short enough that a machine that became slower (another process took a core) raises it
within seconds, instead of the limit sinking to its floor for latency no concurrency of
ours causes. However long an overload lasts, `max_latency_s` bounds the target.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 0.25
MIN_SAMPLES = 20
BASELINE_S = 5.0
TOLERANCE = 3.0
MAX_DECREASE = 0.5


class AdaptiveLimit:
    def __init__(
        self,
        initial: int,
        floor: int,
        ceiling: int,
        max_latency_s: float,
        tolerance: float = TOLERANCE,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor ({floor}) <= ceiling ({ceiling})")
        self._floor = floor
        self._ceiling = ceiling
        self._max_latency_s = max_latency_s
        self._tolerance = tolerance
        self._clock = clock
        self._on_change = on_change
        self.current = min(max(initial, floor), ceiling)
        self._samples: list[float] = []
        self._window_start = clock()
        self._demand = False
        self._over_last = False  # whether the last closed window's median was over target
        self._arrivals = 0
        self._turned_away = 0
        # Whether most arrivals of either of the last two closed windows found every slot
        # taken: the worker is past capacity, not in a burst (two, so that one window's
        # lull inside an overload does not let requests queue in vain).
        self.saturated = False
        self._saturated_last = False
        self._medians: deque[tuple[float, float]] = deque()  # (when, window median)

    @property
    def latency_s(self) -> float | None:
        """The last window's median service time; None before the first window closes."""
        return self._medians[-1][1] if self._medians else None

    @property
    def baseline_s(self) -> float | None:
        """Latency without queueing, as far as the last BASELINE_S tell; None before any."""
        return min(median for _, median in self._medians) if self._medians else None

    def target_s(self) -> float:
        baseline = self.baseline_s
        if baseline is None:
            return self._max_latency_s
        return min(self._tolerance * baseline, self._max_latency_s)

    def note_arrival(self, full: bool) -> None:
        """A request arrived; `full`: it found every slot taken."""
        self._arrivals += 1
        if full:
            self._turned_away += 1
            self._demand = True

    def observe(self, latency_s: float) -> None:
        """One answered request's service time (from its slot to its answer)."""
        self._samples.append(latency_s)
        now = self._clock()
        if now - self._window_start >= WINDOW_S and len(self._samples) >= MIN_SAMPLES:
            self._close_window(now)

    def _close_window(self, now: float) -> None:
        ordered = sorted(self._samples)
        median = ordered[len(ordered) // 2]
        self._medians.append((now, median))
        while self._medians and now - self._medians[0][0] > BASELINE_S:
            self._medians.popleft()
        target = self.target_s()
        over = median > target
        if over and self._over_last and self._demand:
            factor = max(MAX_DECREASE, target / median)
            self._set(max(self._floor, math.floor(self.current * factor + 1e-9)))
        elif not over and self._demand:
            self._set(min(self._ceiling, self.current + 1))
        self._over_last = over
        self._samples = []
        saturated_now = self._turned_away * 2 > self._arrivals
        self.saturated = saturated_now or self._saturated_last
        self._saturated_last = saturated_now
        self._demand = False
        self._arrivals = self._turned_away = 0
        self._window_start = now

    def _set(self, limit: int) -> None:
        if limit != self.current:
            self.current = limit
            if self._on_change is not None:
                self._on_change(limit)
