"""The served ranker's blend of MLP, recall and the sequence signals."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from recsys_tools.world.learn.blend import (
    Blend,
    blended_onnx,
    fit_blend,
    recall_scores,
)
from recsys_tools.world.learn.ranker.train import export_onnx, fit_ranker

from tests.unit.tiny_schema import tiny_schema, tiny_sequence_schema


def test_the_blended_model_computes_the_blend_on_the_packed_row() -> None:
    schema = tiny_schema()
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((400, schema.width)).astype(np.float32)
    labels = (rows[:, 0] > 0).astype(np.int8)
    mlp = fit_ranker(rows, labels, seed=1)
    blend = Blend(recall=0.7, model=0.3, bias=-0.2)
    session = ort.InferenceSession(blended_onnx(export_onnx(mlp, schema), schema, blend))
    (served,) = session.run([schema.output_name], {schema.input_name: rows[:20]})
    z = 0.7 * recall_scores(schema, rows[:20]) + 0.3 * mlp.scores(rows[:20]) - 0.2
    assert served.shape == (20, 1)
    # The score is the blend's log-odds itself: no sigmoid to saturate.
    np.testing.assert_allclose(served[:, 0], z, rtol=1e-4, atol=1e-4)
    # The heads pass through the blend untouched, for rerank's objectives.
    assert [out.name for out in session.get_outputs()] == [schema.output_name, "heads"]
    (heads,) = session.run(["heads"], {schema.input_name: rows[:20]})
    np.testing.assert_allclose(heads, mlp.head_probabilities(rows[:20]), rtol=1e-4, atol=1e-6)


def test_a_useless_model_gets_no_weight_and_recall_keeps_its_order() -> None:
    rng = np.random.default_rng(1)
    recall = rng.standard_normal(4000)
    labels = (rng.random(4000) < 1 / (1 + np.exp(-(2 * recall - 2)))).astype(np.int8)
    noise = rng.random(4000)
    blend = fit_blend(recall, noise, labels)
    assert blend.recall > 1.5
    assert abs(blend.model) < 0.2


def test_the_sequence_signals_enter_the_blend_from_their_block() -> None:
    schema = tiny_sequence_schema()
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((300, schema.width)).astype(np.float32)
    labels = (rows[:, 0] > 0).astype(np.int8)
    mlp = fit_ranker(rows, labels, seed=1)
    blend = Blend(recall=0.5, model=0.25, bias=0.1, sequence=(2.0, -1.0))
    session = ort.InferenceSession(blended_onnx(export_onnx(mlp, schema), schema, blend))
    (served,) = session.run([schema.output_name], {schema.input_name: rows[:20]})
    sequence = rows[:20, schema.blocks["sequence"]]
    z = (
        0.5 * recall_scores(schema, rows[:20])
        + 0.25 * mlp.scores(rows[:20])
        + sequence @ np.array([2.0, -1.0])
        + 0.1
    )
    np.testing.assert_allclose(served[:, 0], z, rtol=1e-4, atol=1e-4)


def test_the_blend_learns_a_sequence_signal_that_tells_the_positives() -> None:
    rng = np.random.default_rng(3)
    recall = rng.standard_normal(4000)
    similar = rng.standard_normal(4000)
    labels = (rng.random(4000) < 1 / (1 + np.exp(-(3 * similar - 2)))).astype(np.int8)
    blend = fit_blend(recall, rng.random(4000), labels, np.stack([similar], axis=1))
    assert blend.sequence[0] > 2.0
    assert abs(blend.recall) < 0.3


def test_a_sequence_signal_never_counts_against_an_item() -> None:
    rng = np.random.default_rng(4)
    recall = rng.standard_normal(4000)
    similar = rng.standard_normal(4000)
    recent = rng.standard_normal(4000)
    z = 2 * recall - 1.5 * similar + 1.0 * recent - 2
    labels = (rng.random(4000) < 1 / (1 + np.exp(-z))).astype(np.int8)
    blend = fit_blend(recall, rng.random(4000), labels, np.stack([similar, recent], axis=1))
    assert blend.sequence[0] == 0.0
    assert blend.sequence[1] > 0.5
    assert blend.recall > 1.5
