"""The served ranker's blend of MLP and recall, and the candidate lists it is fitted on."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from recsys_tools.world.blend import (
    Blend,
    blended_onnx,
    candidate_lists,
    fit_blend,
    recall_scores,
)
from recsys_tools.world.train import export_onnx, fit_ranker

from tests.unit.tiny_schema import tiny_schema


def test_the_blended_model_computes_the_blend_on_the_packed_row() -> None:
    schema = tiny_schema()
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((400, schema.width)).astype(np.float32)
    labels = (rows[:, 0] > 0).astype(np.int8)
    mlp = fit_ranker(rows, labels, seed=1)
    blend = Blend(recall=0.7, model=0.3, bias=-0.2)
    session = ort.InferenceSession(blended_onnx(export_onnx(mlp, schema), schema, blend))
    (served,) = session.run([schema.output_name], {schema.input_name: rows[:20]})
    p = np.clip(mlp.predict_proba(rows[:20])[:, 1], 1e-6, 1 - 1e-6)
    z = 0.7 * recall_scores(schema, rows[:20]) + 0.3 * np.log(p / (1 - p)) - 0.2
    assert served.shape == (20, 1)
    np.testing.assert_allclose(served[:, 0], 1 / (1 + np.exp(-z)), rtol=1e-4, atol=1e-5)


def test_a_useless_model_gets_no_weight_and_recall_keeps_its_order() -> None:
    rng = np.random.default_rng(1)
    recall = rng.standard_normal(4000)
    labels = (rng.random(4000) < 1 / (1 + np.exp(-(2 * recall - 2)))).astype(np.int8)
    noise = rng.random(4000)
    blend = fit_blend(recall, noise, labels)
    assert blend.recall > 1.5
    assert abs(blend.model) < 0.2


def test_candidate_lists_skip_what_was_seen_and_label_what_was_liked() -> None:
    users = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    items = np.array([[3, 0], [2, 0.1], [1, 0.2], [0, 3], [0, 2]], dtype=np.float32)
    n_items = len(items)
    seen = np.array([0 * n_items + 0, 1 * n_items + 3])  # user 0 saw item 0, user 1 item 3
    liked = np.array([0 * n_items + 2, 1 * n_items + 4])
    lists = candidate_lists(users, items, np.array([0, 1]), seen, liked, depth=2)
    columns = (lists.users.tolist(), lists.items.tolist(), lists.labels.tolist())
    listed = sorted(zip(*columns, strict=True))
    assert listed == [(0, 1, 0), (0, 2, 1), (1, 2, 0), (1, 4, 1)]
