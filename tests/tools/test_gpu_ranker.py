"""The GPU benchmark runs the served graph node by node in PyTorch: checked here on the CPU,
where it must score as onnxruntime does, and pin the same tail precision.py pins."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from recsys_tools.model.precision import score_tail, ties_made
from recsys_tools.world.learn.blend import blended_onnx
from recsys_tools.world.learn.ranker.train import export_onnx, fit_ranker

from loadtest import gpu_ranker
from tests.tools.test_precision import REPORTED, _scores
from tests.unit.tiny_schema import tiny_sequence_schema


def test_the_graph_in_pytorch_scores_as_onnxruntime_and_keeps_the_tail_in_fp32() -> None:
    schema = tiny_sequence_schema()
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((500, schema.width)).astype(np.float32)
    rows[:, schema.blocks["user_item_product"]] *= 0.01
    rows[:, schema.blocks["sequence"]] = rng.uniform(0.085, 0.1, (500, 2)).astype(np.float32)
    net = fit_ranker(rows, (rows[:, 0] > 0).astype(np.int8), seed=1)
    model = onnx.load_from_string(blended_onnx(export_onnx(net, schema), schema, REPORTED))
    assert gpu_ranker.score_tail(model.graph) == set(score_tail(model))
    gpu_ranker._OPS.update(gpu_ranker._ops())
    full = _scores(model, rows)
    cpu = torch.device("cpu")
    scores = {
        precision: gpu_ranker.TorchGraph.of(model, precision, cpu)(torch.from_numpy(rows))[0]
        .numpy()
        .reshape(-1)
        for precision in ("fp32", "fp16_tail32", "fp16")
    }
    assert np.abs(scores["fp32"] - full).max() < 1e-4
    assert ties_made(full, scores["fp16_tail32"])[0] == 0
    assert np.abs(scores["fp16_tail32"] - full).max() < 0.05
    # Wholly in FP16 the score itself is rounded (1/64 near 30): candidates tie.
    assert gpu_ranker._ties(full, scores["fp16"]) > 20
