"""A log line per kind of event at most every few seconds, with the count it stands for.

A dependency that fails under load fails for every request; one line per request would
bury the log and cost CPU, while one line per interval still carries the underlying error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable


class ThrottledLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def warning(self, key: Hashable, message: str, *args: object) -> bool:
        """Log unless `key` was logged within the interval; True when a line was written."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            message += " (and %d more like it since the last line)"
            args = (*args, suppressed)
        self._logger.warning(message, *args)
        return True
