"""The ranker as served from interactions: the MLP's opinion blended with recall's own score.

Recall ranks by the user·item product of the embeddings, which on interaction data alone is
hard to beat; an MLP trained against sampled negatives learns what tells a positive from a
random item, which is not quite what orders recall's best candidates. So the served score is

    sigmoid(w_recall * user·item + w_model * logit(mlp) + bias)

with the three weights fitted on examples the MLP did not learn from: where the MLP adds
nothing its weight falls to zero and the answer keeps recall's order, where it knows better
it moves items. The product is summed from the row's own user_item_product block, so the
served model still takes exactly the packed row and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.release.schema import FeatureSchema

FloatArray = npt.NDArray[np.float32]
# Probabilities are clipped this far from 0 and 1 before their logit is taken.
EPSILON = 1e-6


@dataclass(frozen=True, slots=True)
class Blend:
    recall: float
    model: float
    bias: float

    def as_dict(self) -> dict[str, float]:
        return {"recall": self.recall, "model": self.model, "bias": self.bias}


def recall_scores(schema: FeatureSchema, rows: FloatArray) -> npt.NDArray[np.float64]:
    """user·item for each packed row: the sum of its product block."""
    scores: npt.NDArray[np.float64] = rows[:, schema.blocks["user_item_product"]].sum(
        axis=1, dtype=np.float64
    )
    return scores


def _logit(probabilities: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    clipped = np.clip(probabilities.astype(np.float64), EPSILON, 1 - EPSILON)
    logits: npt.NDArray[np.float64] = np.log(clipped) - np.log1p(-clipped)
    return logits


def fit_blend(
    recall: npt.NDArray[np.float64],
    model_probability: npt.NDArray[np.floating],
    labels: npt.NDArray[np.int8],
) -> Blend:
    """The weights, by logistic regression on held-out examples."""
    from sklearn.linear_model import LogisticRegression

    features = np.stack([recall, _logit(model_probability)], axis=1)
    fitted = LogisticRegression(C=1.0, max_iter=1000).fit(features, labels)
    w_recall, w_model = (float(w) for w in fitted.coef_[0])
    return Blend(w_recall, w_model, float(fitted.intercept_[0]))


def blended_onnx(model_onnx: bytes, schema: FeatureSchema, blend: Blend) -> bytes:
    """The exported MLP with the blend appended; same input, same output name and shape."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(model_onnx)
    graph = model.graph
    out = schema.output_name
    inner = f"{out}_mlp"
    for node in graph.node:
        node.output[:] = [inner if name == out else name for name in node.output]
    product = schema.blocks["user_item_product"]

    def constant(name: str, value: float | list[int], dtype: type) -> None:
        graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))

    constant("blend_product_start", [product.start], np.int64)
    constant("blend_product_end", [product.stop], np.int64)
    constant("blend_axis", [1], np.int64)
    constant("blend_low", EPSILON, np.float32)
    constant("blend_high", 1 - EPSILON, np.float32)
    constant("blend_one", 1.0, np.float32)
    constant("blend_w_recall", blend.recall, np.float32)
    constant("blend_w_model", blend.model, np.float32)
    constant("blend_bias", blend.bias, np.float32)
    steps = [
        (
            "Slice",
            [schema.input_name, "blend_product_start", "blend_product_end", "blend_axis"],
            "blend_product",
        ),
        ("ReduceSum", ["blend_product", "blend_axis"], "blend_recall"),
        ("Clip", [inner, "blend_low", "blend_high"], "blend_p"),
        ("Sub", ["blend_one", "blend_p"], "blend_q"),
        ("Div", ["blend_p", "blend_q"], "blend_odds"),
        ("Log", ["blend_odds"], "blend_logit"),
        ("Mul", ["blend_recall", "blend_w_recall"], "blend_a"),
        ("Mul", ["blend_logit", "blend_w_model"], "blend_b"),
        ("Add", ["blend_a", "blend_b"], "blend_ab"),
        ("Add", ["blend_ab", "blend_bias"], "blend_z"),
        ("Sigmoid", ["blend_z"], out),
    ]
    for op, inputs, output in steps:
        graph.node.append(helper.make_node(op, inputs, [output], name=output))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [None, 1]))
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


IntArray = npt.NDArray[np.int64]
# Floats of user x item scores held at once while finding each user's best candidates.
SCORE_CHUNK = 8_000_000


@dataclass(frozen=True, slots=True)
class CandidateLists:
    """Each listed user's best-recalled unseen items, and which of them the user went on to like."""

    users: IntArray
    items: IntArray
    labels: npt.NDArray[np.int8]


def candidate_lists(
    user_vectors: FloatArray,
    item_vectors: FloatArray,
    users: IntArray,
    seen: IntArray,
    liked: IntArray,
    depth: int,
) -> CandidateLists:
    """The top `depth` items by user·item for each user, minus what they had seen.

    `seen` and `liked` are sorted user * n_items + item keys: seen before the moment the
    lists stand for, and liked after it. These are the lists the blend is fitted on: what
    the served ranker reorders, not a random item against a positive.
    """
    n_items = len(item_vectors)
    chunk = max(1, SCORE_CHUNK // max(n_items, 1))
    parts_users, parts_items = [], []
    for start in range(0, len(users), chunk):
        block = users[start : start + chunk]
        scores = user_vectors[block] @ item_vectors.T
        keys = block[:, None] * n_items + np.arange(n_items)[None, :]
        scores[np.isin(keys, seen)] = -np.inf
        keep = min(depth, n_items)
        top = np.argpartition(-scores, keep - 1, axis=1)[:, :keep]
        fine = np.isfinite(np.take_along_axis(scores, top, axis=1))
        parts_users.append(np.repeat(block, keep).reshape(len(block), keep)[fine])
        parts_items.append(top[fine])
    listed_users = np.concatenate(parts_users).astype(np.int64)
    listed_items = np.concatenate(parts_items).astype(np.int64)
    labels = np.isin(listed_users * n_items + listed_items, liked).astype(np.int8)
    return CandidateLists(listed_users, listed_items, labels)
