"""The in-process fallback ranker, on a real (tiny) ONNX model run by onnxruntime."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from app.clients.local_ranker import LocalRanker, load_local_ranker
from app.clients.onnx_scorer import OnnxScorer
from app.core.errors import ConfigError, FailureKind, RankingModelError, SchemaError
from tests.unit.tiny_schema import tiny_schema


def _row_sum_model(path: Path, width: int) -> Path:
    """score = the sum of the row's features, as [n, 1]."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["features", "axes"], ["score"], keepdims=1)],
        "sum",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [None, 1])],
        initializer=[axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


async def test_scores_the_rows_in_order(tmp_path: Path) -> None:
    schema = tiny_schema()
    ranker = load_local_ranker(_row_sum_model(tmp_path / "m.onnx", schema.width), schema)
    rows = np.arange(3 * schema.width, dtype=np.float32).reshape(3, schema.width)
    try:
        scores = await ranker.score(rows, timeout_s=1.0)
    finally:
        ranker.close()
    np.testing.assert_allclose(scores, rows.sum(axis=1))


async def test_scores_only_the_rows_that_fit_in_the_time_left(tmp_path: Path) -> None:
    schema = tiny_schema()
    ranker = load_local_ranker(_row_sum_model(tmp_path / "m.onnx", schema.width), schema)
    rows = np.ones((100_000, schema.width), dtype=np.float32)
    # A pessimistic cost per row, as a slow machine would have measured: the rows that fit
    # are few, and scoring them takes far less than the time allowed on any machine.
    ranker._seconds_per_row = 1e-3
    tight = 0.5
    try:
        fitting = ranker.rows_within(tight)
        assert 0 < fitting < len(rows)
        scores = await ranker.score(rows, timeout_s=tight)
        assert len(scores) == fitting
        with pytest.raises(RankingModelError) as raised:
            await ranker.score(rows, timeout_s=0.0)
        assert raised.value.kind is FailureKind.TIMEOUT
    finally:
        ranker.close()


def test_refuses_a_model_of_another_width(tmp_path: Path) -> None:
    schema = tiny_schema()
    with pytest.raises(SchemaError, match="schema packs 15"):
        load_local_ranker(_row_sum_model(tmp_path / "m.onnx", 9), schema)


def test_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing"):
        load_local_ranker(tmp_path / "none.onnx", tiny_schema())


class _SlowSession:
    """An onnxruntime session stand-in whose runs take `per_row_s` a row (or `stall_s`)."""

    def __init__(self, per_row_s: float) -> None:
        self.per_row_s = per_row_s
        self.stall_s = 0.0

    def get_inputs(self) -> list[Any]:
        return [SimpleNamespace(name="features", shape=[None, tiny_schema().width])]

    def get_outputs(self) -> list[Any]:
        return [SimpleNamespace(name="score")]

    def run(self, outputs: list[str], feeds: dict[str, Any]) -> list[Any]:
        rows = feeds["features"]
        time.sleep(self.stall_s or self.per_row_s * len(rows))
        return [np.zeros((len(rows), 1), np.float32)]


async def test_concurrent_fallbacks_share_the_thread_within_their_deadlines() -> None:
    session = _SlowSession(per_row_s=0.00002)  # 1000 rows: 20 ms
    ranker = LocalRanker(OnnxScorer(session), tiny_schema())
    rows = np.ones((1000, tiny_schema().width), np.float32)
    timeout_s = 0.1
    try:
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(ranker.score(rows, timeout_s) for _ in range(4)), return_exceptions=True
        )
        took = time.monotonic() - started
    finally:
        ranker.close()
    scored = [len(o) for o in outcomes if not isinstance(o, BaseException)]
    assert scored[0] == 1000  # the first has the thread to itself
    assert len(scored) < 4 or sum(scored) < 4000  # the later ones fit what is left, or none
    assert took < timeout_s * 1.5  # nobody waited past the deadline for the thread


async def test_a_run_that_overstays_is_abandoned_at_the_deadline() -> None:
    session = _SlowSession(per_row_s=0.00001)
    ranker = LocalRanker(OnnxScorer(session), tiny_schema())
    session.stall_s = 1.0  # hangs, after start-up measured it as quick
    try:
        started = time.monotonic()
        with pytest.raises(RankingModelError) as raised:
            await ranker.score(np.ones((10, tiny_schema().width), np.float32), timeout_s=0.05)
        assert raised.value.kind is FailureKind.TIMEOUT
        assert time.monotonic() - started < 0.5
    finally:
        ranker.close()
