"""The per-request context that travels through every stage."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.errors import FailureKind
from app.metrics import ServiceMetrics

if TYPE_CHECKING:
    from app.artifacts import ServingArtifacts


@dataclass(slots=True)
class RequestContext:
    """Deadline, artifacts snapshot, degradations and stage timings of one request.

    The artifacts are read once when the request starts, so a hot swap never mixes an old
    index with new rules inside one answer.
    """

    request_id: str
    deadline: float
    artifacts: ServingArtifacts
    metrics: ServiceMetrics
    degraded: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def degrade(self, stage: str, kind: FailureKind) -> None:
        self.degraded.append(f"{stage}:{kind.value}")
        self.metrics.degraded.labels(stage, kind.value).inc()

    def count(self, stage: str, candidates: int) -> None:
        self.metrics.stage_count[stage].observe(candidates)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.timings_ms[name] = round(elapsed * 1000.0, 3)
            self.metrics.stage_timer[name].observe(elapsed)
