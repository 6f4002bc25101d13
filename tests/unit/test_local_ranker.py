"""The in-process fallback ranker, on a real (tiny) ONNX model run by onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from app.errors import ConfigError, FailureKind, RankingModelError, SchemaError
from app.local_ranker import load_local_ranker
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
    tight = 0.0005
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
