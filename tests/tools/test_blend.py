"""The served ranker's blend of MLP, recall and the sequence signals."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from recsys_tools.world.learn.blend import (
    Blend,
    blend_scores,
    blended_onnx,
    choose_blend,
    fit_blend,
    lists_ndcg,
    ordered_blend,
    recall_scores,
)
from recsys_tools.world.learn.ranker.train import export_onnx, fit_ranker

from app.world.prerank import PrerankWeights
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


def _lists(
    seed: int, lists: int = 400, length: int = 20
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Lists whose one liked item is the first by recall + 0.4 similar, where each list's
    similar scores sit at a level of their own (as a user with many latest positives gets
    higher ones): within a list the level changes no order, across lists it blurs a fit of
    how likely each row is."""
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(lists), length)
    recall = rng.standard_normal(len(users))
    similar = rng.standard_normal(len(users)) + np.repeat(rng.normal(0, 5, lists), length)
    truth = recall + 0.4 * similar
    labels = np.zeros(len(users), dtype=np.int8)
    labels[np.arange(lists) * length + truth.reshape(lists, length).argmax(axis=1)] = 1
    recent = rng.standard_normal(len(users))
    return users, labels, recall, np.stack([similar, recent], axis=1).astype(np.float32)


def test_the_first_ten_get_the_weights_that_order_them_not_those_that_fit_likelihood() -> None:
    schema = tiny_sequence_schema()
    users, labels, recall, sequence = _lists(5)
    network = np.random.default_rng(6).random(len(users))
    nothing = np.zeros(2, dtype=bool)
    fitted = fit_blend(recall, network, labels, sequence, nothing)
    chosen = choose_blend(
        schema, PrerankWeights(), (users, labels), recall, network, sequence, nothing
    )

    def ndcg(blend: Blend) -> float:
        return lists_ndcg(users, labels, blend_scores(blend, recall, network, sequence))

    assert chosen.model == 0.0
    assert chosen.bias == 0.0
    assert chosen.sequence[1] == 0.0  # recent tells nothing here
    assert 0.3 < chosen.sequence[0] / chosen.recall < 0.5
    assert ndcg(chosen) > ndcg(fitted) + 0.05
    assert ndcg(chosen) > 0.9


def test_the_first_tens_weights_leave_out_what_the_build_leaves_out() -> None:
    schema = tiny_sequence_schema()
    users, labels, recall, sequence = _lists(7)
    assert ordered_blend(schema, users, labels, recall, sequence, np.ones(2, dtype=bool)) is None
    # Similar is what orders these lists: left out, the first ten get recent at most.
    without = ordered_blend(schema, users, labels, recall, sequence, np.array([True, False]))
    assert without is not None
    assert without.sequence[0] == 0.0
    kept = ordered_blend(schema, users, labels, recall, sequence, np.zeros(2, dtype=bool))
    assert kept is not None
    assert kept.sequence[0] > 0.0
