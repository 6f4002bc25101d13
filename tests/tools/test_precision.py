"""FP16 copies keep the score's tail in FP32: scores far past a sigmoid's range never tie."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from recsys_tools.model.precision import fp16_copy, score_tail, ties_made
from recsys_tools.world.learn.blend import Blend, blended_onnx
from recsys_tools.world.learn.ranker.train import export_onnx, fit_ranker

from tests.unit.tiny_schema import tiny_sequence_schema

# The weights the public movie-ratings sets gave the blend: scores reach the twenties.
REPORTED = Blend(recall=10.0, model=0.5, bias=0.0, sequence=(17.0, 295.0))


def _scores(model: onnx.ModelProto, rows: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (scores,) = session.run(["score"], {"features": rows})
    flat: np.ndarray = scores.reshape(-1)
    return flat


def test_fp16_rounds_the_tower_and_never_the_score() -> None:
    schema = tiny_sequence_schema()
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((600, schema.width)).astype(np.float32)
    # Candidates as close as a user's best are: scores between 25 and 31, 600 of them.
    rows[:, schema.blocks["user_item_product"]] *= 0.01
    rows[:, schema.blocks["sequence"]] = rng.uniform(0.085, 0.1, (600, 2)).astype(np.float32)
    net = fit_ranker(rows, (rows[:, 0] > 0).astype(np.int8), seed=1)
    model = onnx.load_from_string(blended_onnx(export_onnx(net, schema), schema, REPORTED))
    full = _scores(model, rows)
    assert full.max() > 17  # where a float32 sigmoid is 1.0
    tail = score_tail(model)
    assert tail[0] == "net_heads_m"
    assert tail[-1] == "score"
    assert all(name in tail for name in ("blend_product", "blend_sequence", "blend_c"))
    half = fp16_copy(model)
    # The tower computes in FP16 (its weights are halved), the tail in FP32.
    halved = {i.name for i in half.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16}
    assert "net_deep0_w" in halved
    assert "net_heads_w" not in halved
    assert "blend_w_sequence" not in halved
    reduced = _scores(half, rows)
    assert ties_made(full, reduced) == (0, 0.0)
    assert np.abs(reduced - full).max() < 0.05
    # The tail reads the FP32 row itself and the tower's output cast back to FP32.
    tower_out = {node.output[0] for node in half.graph.node if node.op_type == "Cast"}
    for node in half.graph.node:
        if node.name in tail:
            assert all(
                name == "features" or name in tower_out or not name.endswith("_fp16")
                for name in node.input
            ), node.name
    # A score held in FP16 (a graph converted whole) steps by 1/64 near 30: distinct
    # candidates tie.
    assert ties_made(full, full.astype(np.float16).astype(np.float32))[0] > 50


def test_ties_made_counts_only_what_fp32_told_apart() -> None:
    full = np.array([1.0, 1.0, 2.0, 2.5, 3.0], np.float32)
    reduced = np.array([1.0, 1.0, 2.0, 2.0, 3.0], np.float32)
    assert ties_made(full, reduced) == (1, 0.5)
    assert ties_made(full, full) == (0, 0.0)
