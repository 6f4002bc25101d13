"""The ranking model run in process with onnxruntime, for when Triton cannot answer.

It scores the same ONNX file Triton serves, on the CPU, in a thread of its own so the event
loop keeps answering. It is a fallback, so it must fit what is left of the request's budget:
it learns its cost per row as it runs and scores only as many rows (the first ones, in
recall order) as the time left allows, after the work already queued for its one thread
(while Triton is away every request falls back at once). A run that still overstays is
abandoned at the request's deadline.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.clients.onnx_scorer import MissingOnnxRuntimeError, OnnxScorer, onnx_scorer
from app.core.errors import ConfigError, FailureKind, RankingModelError, SchemaError
from app.world.schema import FeatureSchema

WARMUP_ROWS = 1024
# Estimates are taken on an idle process; under load a run takes longer than it did then.
SAFETY_FACTOR = 2.0
SMOOTHING = 0.2


def _scorer(path: Path) -> OnnxScorer:
    if not path.is_file():
        raise ConfigError(f"fallback model {path} is missing (RECSYS_FALLBACK_MODEL)")
    try:
        # One thread: the fallback must not take every core from the event loop and Redis.
        return onnx_scorer(path, threads=1)
    except MissingOnnxRuntimeError:
        raise ConfigError(
            "the fallback ranker needs onnxruntime: install the `fallback` extra, "
            "or set RECSYS_FALLBACK_RANKER=false to fall back to recall order"
        ) from None


class LocalRanker:
    def __init__(self, scorer: OnnxScorer, schema: FeatureSchema) -> None:
        self._scorer = scorer
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="local-ranker")
        self._seconds_per_row = self._measure(schema.width)
        self._busy_until = 0.0  # when the runs already handed to the thread should end

    def _measure(self, width: int) -> float:
        rows = np.zeros((WARMUP_ROWS, width), dtype=np.float32)
        self._scorer.score(rows)  # the first run allocates; time the second
        start = time.perf_counter()
        self._scorer.score(rows)
        return (time.perf_counter() - start) / WARMUP_ROWS

    def rows_within(self, seconds: float) -> int:
        """How many rows can be scored in `seconds`, with a margin."""
        return max(0, int(seconds / (self._seconds_per_row * SAFETY_FACTOR)))

    async def score(
        self, rows: npt.NDArray[np.float32], timeout_s: float
    ) -> npt.NDArray[np.float32]:
        """Scores of the first rows that fit in `timeout_s` (possibly none of them)."""
        now = time.monotonic()
        starts = max(now, self._busy_until)
        fitting = min(rows.shape[0], self.rows_within(timeout_s - (starts - now)))
        if fitting == 0:
            raise RankingModelError(FailureKind.TIMEOUT, "no time left to rank in process")
        self._busy_until = starts + fitting * self._seconds_per_row * SAFETY_FACTOR
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._executor, self._timed, rows[:fitting])
        try:
            async with asyncio.timeout(timeout_s):
                return await work
        except TimeoutError:
            raise RankingModelError(
                FailureKind.TIMEOUT, f"ranking in process took over {timeout_s * 1000:.0f} ms"
            ) from None

    def _timed(self, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """One run, its cost per row learnt in the thread (so a run abandoned late counts)."""
        start = time.perf_counter()
        scores = self._scorer.score(rows)
        per_row = (time.perf_counter() - start) / len(rows)
        self._seconds_per_row += SMOOTHING * (per_row - self._seconds_per_row)
        return scores

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def load_local_ranker(path: Path, schema: FeatureSchema) -> LocalRanker:
    """Load the ONNX file and refuse one that does not take the schema's row."""
    scorer = _scorer(path)
    shape = scorer.input_shape
    if not shape or shape[-1] != schema.width:
        raise SchemaError(
            f"fallback model {path} takes rows of shape {shape}, schema packs {schema.width}"
        )
    return LocalRanker(scorer, schema)
