"""What the impression ranker learns from: each logged answer's items, chosen or skipped by
what the user did after; and the lists' ranker with the answers' network added to it."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pyarrow as pa
from onnx import TensorProto, helper, numpy_helper
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.learn.ranker.from_impressions import (
    ATTRIBUTION_S,
    added_weight,
    shown_items,
    with_answers,
)

from app.archive.rows import ANSWERS_SCHEMA, EVENTS_SCHEMA
from app.world.schema import HEADS_OUTPUT, FeatureSchema, load_schema

T0_MS = 1_764_547_200_000


def _answer(answer_id: str, user: str, items: list[str], at_ms: int, degraded: bool = False) -> Any:
    return {
        "answer_id": answer_id,
        "ts_ms": at_ms,
        "user_id": user,
        "page": "home",
        "variant": "control",
        "model_version": "1",
        "world_id": "w",
        "degraded": degraded,
        "items": items,
        "scores": [1.0] * len(items),
        "entry": "1-0",
    }


def _event(user: str, item: str, kind: str, at_ms: int, value: float | None = None,
           answer_id: str | None = None) -> Any:  # fmt: skip
    return {
        "event_id": f"{user}-{item}-{kind}-{at_ms}",
        "user_id": user,
        "item_id": item,
        "type": kind,
        "ts_ms": at_ms,
        "value": value,
        "answer_id": answer_id,
        "entry": "1-0",
    }


def _marks(answers: list[Any], events: list[Any]) -> dict[tuple[str, str], int]:
    shown = shown_items(
        pa.Table.from_pylist(answers, schema=ANSWERS_SCHEMA),
        pa.Table.from_pylist(events, schema=EVENTS_SCHEMA),
        4.0,
    )
    users, items = shown.user_ids.tolist(), shown.item_ids.tolist()
    return {(u, i): int(c) for u, i, c in zip(users, items, shown.chosen.tolist(), strict=True)}


def test_an_event_naming_the_answer_marks_that_item_chosen_and_the_rest_skipped() -> None:
    answers = [_answer("a1", "u1", ["i1", "i2", "i3"], T0_MS)]
    # The click names the answer: chosen even a day later.
    events = [_event("u1", "i2", "click", T0_MS + 86_400_000, answer_id="a1")]
    assert _marks(answers, events) == {("u1", "i1"): 0, ("u1", "i2"): 1, ("u1", "i3"): 0}


def test_an_event_naming_no_answer_counts_within_the_attribution_window_only() -> None:
    answers = [_answer("a1", "u1", ["i1", "i2", "i3", "i4"], T0_MS)]
    events = [
        _event("u1", "i1", "rating", T0_MS + 60_000, value=5.0),  # in the window
        _event("u1", "i2", "like", T0_MS + (ATTRIBUTION_S + 60) * 1000),  # too late
        _event("u1", "i3", "purchase", T0_MS - 60_000),  # before it was shown
        _event("u2", "i4", "click", T0_MS + 1000),  # somebody else
    ]
    assert _marks(answers, events) == {
        ("u1", "i1"): 1,
        ("u1", "i2"): 0,
        ("u1", "i3"): 0,
        ("u1", "i4"): 0,
    }


def test_what_is_not_a_choice_leaves_the_item_skipped() -> None:
    answers = [_answer("a1", "u1", ["i1", "i2", "i3"], T0_MS)]
    events = [
        _event("u1", "i1", "rating", T0_MS + 1000, value=2.0, answer_id="a1"),  # a low rating
        _event("u1", "i2", "dislike", T0_MS + 1000, answer_id="a1"),
        _event("u1", "i3", "impression", T0_MS + 1000, answer_id="a1"),
    ]
    assert set(_marks(answers, events).values()) == {0}


def test_degraded_answers_teach_nothing_and_positions_follow_the_order_shown() -> None:
    answers = [
        _answer("a1", "u1", ["i1", "i2"], T0_MS, degraded=True),
        _answer("a2", "u2", ["i7", "i8", "i9"], T0_MS + 5000),
    ]
    events = [_event("u2", "i9", "click", T0_MS + 6000, answer_id="a2")]
    shown = shown_items(
        pa.Table.from_pylist(answers, schema=ANSWERS_SCHEMA),
        pa.Table.from_pylist(events, schema=EVENTS_SCHEMA),
        4.0,
    )
    assert shown.item_ids.tolist() == ["i7", "i8", "i9"]
    assert shown.position.tolist() == [0, 1, 2]
    assert shown.chosen.tolist() == [0, 0, 1]
    assert shown.answers == 1
    assert shown.with_choice().answers == 1
    assert shown.before(T0_MS // 1000).answers == 0


def _linear_model(schema: FeatureSchema, weights: np.ndarray, heads: bool) -> bytes:
    """score = rows @ weights (and heads, the same, when asked), named as the schema says."""
    x, out = schema.input_name, schema.output_name
    nodes = [
        helper.make_node("MatMul", [x, "w"], ["hidden"], name="matmul"),
        helper.make_node("Identity", ["hidden"], [out], name=out),
    ]
    outputs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, [None, 1])]
    if heads:
        nodes.append(helper.make_node("Identity", ["hidden"], [HEADS_OUTPUT], name="heads"))
        outputs.append(helper.make_tensor_value_info(HEADS_OUTPUT, TensorProto.FLOAT, [None, 1]))
    weight = numpy_helper.from_array(weights.astype(np.float32).reshape(-1, 1), "w")
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, schema.width])]
    graph = helper.make_graph(nodes, "linear", inputs, outputs, [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_the_answers_network_is_added_to_the_lists_score_in_one_graph() -> None:
    schema = load_schema(interactions_schema_path())
    rng = np.random.default_rng(3)
    lists_w, net_w = rng.normal(size=schema.width), rng.normal(size=schema.width)
    combined = with_answers(
        _linear_model(schema, lists_w, heads=True), _linear_model(schema, net_w, False), schema, 0.5
    )
    rows = rng.normal(size=(7, schema.width)).astype(np.float32)
    session = ort.InferenceSession(combined, providers=["CPUExecutionProvider"])
    score, heads = session.run([schema.output_name, HEADS_OUTPUT], {schema.input_name: rows})
    np.testing.assert_allclose(
        score[:, 0], rows @ lists_w + 0.5 * (rows @ net_w), rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(heads[:, 0], rows @ lists_w, rtol=1e-4, atol=1e-4)  # the lists'


def test_the_answers_weigh_nothing_unless_they_order_better() -> None:
    answers = np.repeat(np.arange(4), 3).astype(np.int64)
    chosen = np.tile([1, 0, 0], 4).astype(np.int8)
    lists = np.tile([3.0, 2.0, 1.0], 4)  # already perfect
    network = np.tile([0.0, 5.0, 1.0], 4)  # would put a skipped item first
    weight, tried = added_weight(answers, chosen, lists, network)
    assert weight == 0.0
    assert tried["0.0"] == 1.0
