"""The per-request context that travels through every stage."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.core.errors import FailureKind
from app.core.metrics import ServiceMetrics
from app.core.throttled_log import ThrottledLog
from app.core.vocabulary import Stage

if TYPE_CHECKING:
    from app.pipeline.trace import Trace
    from app.release.artifacts import ServingArtifacts

degradations = ThrottledLog(logging.getLogger("recsys.degraded"))

# Set while a request runs on a budget its caller shortened (X-Request-Timeout-Ms). Its
# timeouts say how short the caller asked it to be, not how the dependency is: the circuit
# breakers, shared by every request, excuse them. A context variable, so the tasks a request
# starts (chunks sent concurrently) carry it too.
caller_shortened: ContextVar[bool] = ContextVar("caller_shortened", default=False)


@dataclass(slots=True)
class RequestContext:
    """Deadline, artifacts snapshot, degradations and stage timings of one request.

    The artifacts are read once when the request starts, so a hot swap never mixes an old
    index with new rules inside one answer. `deadline` is on the `time.monotonic` clock;
    `reserve_s` of it is kept back from every dependency call so that the fallback of the
    last stage to fail, and the answer itself, still fit in the budget.
    """

    request_id: str
    deadline: float
    reserve_s: float
    artifacts: ServingArtifacts
    metrics: ServiceMetrics
    user_id: str = ""
    degraded: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    # Set for a traced request only (app/pipeline/trace.py); stages record into it.
    trace: Trace | None = None

    @classmethod
    def on_budget(
        cls,
        request_id: str,
        *,
        arrived: float,
        budget_s: float,
        reserve_s: float,
        artifacts: ServingArtifacts,
        metrics: ServiceMetrics,
        user_id: str,
        trace: Trace | None = None,
    ) -> RequestContext:
        """A request's context: `budget_s` from when it `arrived` (time.monotonic), the
        artifacts snapshot it reads throughout. The route and the explain run make theirs
        here, so both run the pipeline on the same terms."""
        return cls(
            request_id=request_id,
            deadline=arrived + budget_s,
            reserve_s=reserve_s,
            artifacts=artifacts,
            metrics=metrics,
            user_id=user_id,
            trace=trace,
        )

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def time_for(self, cap_s: float | None = None) -> float:
        """What a dependency call may take now: the time left less the reserve, capped."""
        available = max(0.0, self.deadline - self.reserve_s - time.monotonic())
        return available if cap_s is None else min(available, cap_s)

    def degrade(self, stage: Stage, kind: FailureKind, cause: BaseException | str) -> None:
        """Flag the answer, count it, and log the cause (at most one line per interval)."""
        flag = f"{stage}:{kind}"
        if flag in self.degraded:
            return
        self.degraded.append(flag)
        self.metrics.degraded_count[stage, kind].inc()
        if self.trace is not None:
            self.trace.fell_back(flag, str(cause))
        degradations.warning(
            (stage, kind), "%s fell back (%s): %s [request %s]", stage, kind, cause, self.request_id
        )

    def count(self, stage: Stage, candidates: int) -> None:
        self.metrics.stage_count[stage].observe(candidates)
        if self.trace is not None:
            self.trace.counted(stage, candidates)

    @contextmanager
    def stage(self, name: Stage) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.timings_ms[name] = round(elapsed * 1000.0, 3)
            self.metrics.stage_timer[name].observe(elapsed)
            if self.trace is not None:
                self.trace.span(name, start, elapsed)
