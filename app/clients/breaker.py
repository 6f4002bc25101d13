"""A circuit breaker per dependency: stop calling what keeps failing, probe until it is back.

Closed: calls go through; `failures` consecutive timeouts or unavailable answers open it. A
timeout while `excused()` holds (the service's own event loop running late, say) is not held
against the dependency: the answer may have been waiting for the loop, not for the server.
Open: calls fail at once (the stage falls back in microseconds instead of waiting out its
timeout) until `open_s` has passed. Half-open: one call goes through as the probe; success
closes the breaker, failure opens it for another `open_s`, and every other call still fails
fast while the probe is out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum

from app.core.errors import BREAKING_KINDS, DependencyError, FailureKind

log = logging.getLogger(__name__)


class BreakerState(IntEnum):
    """The gauge's values: 0 closed, 1 open, 2 half-open."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        failures: int,
        open_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerState], None] | None = None,
        excused: Callable[[], bool] = lambda: False,
    ) -> None:
        self.name = name
        self._excused = excused
        self._threshold = failures
        self._open_s = open_s
        self._clock = clock
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_out = False

    @property
    def state(self) -> BreakerState:
        return self._state

    def available(self) -> bool:
        """Whether `allow` would let a call out now (without taking the probe's turn)."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            return self._clock() - self._opened_at >= self._open_s
        return not self._probe_out

    def allow(self) -> bool:
        """Whether a call may go out now; in half-open, only the one probe may."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            if self._clock() - self._opened_at < self._open_s:
                return False
            self._set(BreakerState.HALF_OPEN)
        if self._probe_out:
            return False
        self._probe_out = True
        return True

    def succeeded(self) -> None:
        self._failures = 0
        self._probe_out = False
        if self._state is not BreakerState.CLOSED:
            self._set(BreakerState.CLOSED)

    def failed(self) -> None:
        self._failures += 1
        self._probe_out = False
        if self._state is BreakerState.HALF_OPEN or self._failures >= self._threshold:
            self._opened_at = self._clock()
            self._set(BreakerState.OPEN)

    def abandoned(self) -> None:
        """The call ended without telling whether the dependency works (cancelled, bad data)."""
        self._probe_out = False

    @contextmanager
    def guard(self, error: type[DependencyError]) -> Iterator[None]:
        """Run one call under the breaker; raise `error` at once while it is open."""
        if not self.allow():
            raise error(FailureKind.CIRCUIT_OPEN, f"{self.name} circuit breaker is open")
        try:
            yield
        except DependencyError as exc:
            if exc.kind in BREAKING_KINDS and not (
                exc.kind is FailureKind.TIMEOUT and self._excused()
            ):
                self.failed()
            else:
                self.abandoned()
            raise
        except BaseException:
            self.abandoned()
            raise
        self.succeeded()

    def _set(self, state: BreakerState) -> None:
        self._state = state
        level = logging.WARNING if state is BreakerState.OPEN else logging.INFO
        log.log(level, "%s circuit breaker %s", self.name, state.name.lower().replace("_", "-"))
        if self._on_change is not None:
            self._on_change(state)
