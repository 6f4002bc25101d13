"""Shadow scoring: a candidate version scores answered requests' rows, never changing them.

The answer has already been decided when the shadow call starts: it runs as a task of its
own after the rank stage, with the rows the served model scored, and only its agreement with
the served ranking is kept (`recsys_shadow_agreement`). At most `max_in_flight` shadow calls
run at once; beyond that a request is skipped rather than queued, so a slow shadow version
costs Triton capacity but never latency or memory of the served path.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import numpy.typing as npt

from app.core.errors import RankingModelError
from app.core.metrics import ServiceMetrics
from app.core.outcomes import ShadowOutcome
from app.core.throttled_log import ThrottledLog
from app.core.vocabulary import Scores
from app.pipeline.stages.rank import RemoteModel
from app.release.plan import Routed

# The head of the ranking that matters to the answer; what `recsys model compare` reports.
TOP_N = 20

failures = ThrottledLog(logging.getLogger("recsys.shadow"))


def top_agreement(served: Scores, shadow: Scores, top_n: int = TOP_N) -> float:
    """The share of the served top N that the shadow's top N holds too (1.0: the same set)."""
    n = min(top_n, len(served), len(shadow))
    if n == 0:
        return 1.0
    served_top = np.argpartition(-served, n - 1)[:n]
    shadow_top = np.argpartition(-shadow, n - 1)[:n]
    return len(np.intersect1d(served_top, shadow_top)) / n


class ShadowCalls:
    def __init__(
        self, model: RemoteModel, metrics: ServiceMetrics, timeout_s: float, max_in_flight: int
    ) -> None:
        self._model = model
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._max_in_flight = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()

    def compare(
        self, rows: npt.NDArray[np.float32], served: Scores, shadow: Routed, request_id: str
    ) -> None:
        if len(self._tasks) >= self._max_in_flight:
            self._metrics.shadow_count[ShadowOutcome.SKIPPED].inc()
            return
        task = asyncio.create_task(self._compare(rows, served, shadow, request_id))
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def _compare(
        self, rows: npt.NDArray[np.float32], served: Scores, shadow: Routed, request_id: str
    ) -> None:
        try:
            answer = await self._model.score(
                rows, shadow, self._timeout_s, request_id, guarded=False
            )
        except RankingModelError as exc:
            self._metrics.shadow_count[ShadowOutcome.FAILED].inc()
            failures.warning(exc.kind, "shadow version %s failed: %s", shadow.version, exc)
            return
        self._metrics.shadow_count[ShadowOutcome.SCORED].inc()
        self._metrics.shadow_agreement.observe(top_agreement(served, answer.scores))

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
