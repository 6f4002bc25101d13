"""The ranker as served from interactions: the network's opinion blended with recall's score.

Recall ranks by the user·item product of the embeddings, which on interaction data alone is
hard to beat; a network trained against sampled negatives learns what tells a positive from
a random item, which is not quite what orders recall's best candidates. So the served score
is the log-odds

    w_recall * user·item + w_model * net + w_seq · sequence + bias

(`net`, the network's own score, is a log-odds too). No sigmoid follows: with the weights
real logs give (a recent-item weight of hundreds), the sum reaches 30 for the best
candidates, where a float32 sigmoid is exactly 1.0 and every one of them would tie.

The weights are chosen on examples the network did not learn from: the blending users'
lists, halved. Four blends are tried on one half and judged on the other by NDCG@10:
pre-rank's own weights; recall's order alone; the logistic fit of recall, the network and the
sequence signals (fit_blend); and pre-rank's signals (the two item-to-item ones, and the
order model's where the world has one) weighed for the first ten (ordered_blend). Only the
third gives the network a say, so where the MLP adds nothing its weight is 0 and the answer
keeps an order of the signals alone; where it knows better it moves items. The product is
summed from the row's own user_item_product block, and the sequence signals (a schema that
declares them) are the row's sequence block, so the served model still takes exactly the
packed row and nothing else. With them the blend can always
reproduce pre-rank's own order (a weighted sum of the same signals).

Why a fourth: pre-rank's weights are chosen to keep the held-out items among the hundreds it
hands on, and the logistic fit to call each row's odds across all lists, while the answer is
judged on each list's first ten. On MovieLens 100k the fourth was the one chosen for two
served worlds of eight and lifted their recall@10 by 4.2% and 1.6%; it changed no other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.world.prerank import PrerankWeights
from app.world.schema import FeatureSchema
from recsys_tools.world.learn.prerank import GRID, weight_grid

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Blend:
    recall: float
    model: float
    bias: float
    sequence: tuple[float, ...] = ()  # one weight per signal of the schema's sequence block

    def as_dict(self) -> dict[str, float | list[float]]:
        return {
            "recall": self.recall,
            "model": self.model,
            "bias": self.bias,
            "sequence": list(self.sequence),
        }


def recall_scores(schema: FeatureSchema, rows: FloatArray) -> npt.NDArray[np.float64]:
    """user·item for each packed row: the sum of its product block."""
    scores: npt.NDArray[np.float64] = rows[:, schema.blocks["user_item_product"]].sum(
        axis=1, dtype=np.float64
    )
    return scores


def fit_blend(
    recall: npt.NDArray[np.float64],
    model_score: npt.NDArray[np.floating],
    labels: npt.NDArray[np.int8],
    sequence: FloatArray | None = None,
    ignored: npt.NDArray[np.bool_] | None = None,
) -> Blend:
    """The weights, by logistic regression on held-out examples (each input scaled by its
    spread for the fit, the weights scaled back); `ignored` sequence signals weigh 0."""
    from sklearn.linear_model import LogisticRegression

    columns = [recall, model_score.astype(np.float64)]
    if sequence is not None:
        columns.extend(sequence.astype(np.float64).T)
    features = np.stack(columns, axis=1)
    spread = features.std(axis=0)
    spread[spread == 0] = 1.0
    # Being more like what the user just chose never counts against an item: a sequence
    # signal whose fitted weight comes out negative (the MLP, which sees it too, may have
    # over-counted it) is dropped and the rest fitted again. Measured: a blend that gave the
    # neighbour signal -14 halved what real time bought on a drifting log (replay hit@10
    # 0.15 -> 0.10), as the items near a user's new taste were pushed down.
    used = np.ones(features.shape[1], dtype=bool)
    if ignored is not None and sequence is not None:
        used[2:][ignored] = False
    while True:
        fitted = LogisticRegression(C=1.0, max_iter=1000).fit(
            features[:, used] / spread[used], labels
        )
        weights = np.zeros(features.shape[1])
        weights[used] = fitted.coef_[0] / spread[used]
        negative = np.flatnonzero(weights[2:] < 0) + 2
        if not len(negative):
            break
        used[negative] = False
    return Blend(
        float(weights[0]),
        float(weights[1]),
        float(fitted.intercept_[0]),
        tuple(float(w) for w in weights[2:]),
    )


def blended_onnx(model_onnx: bytes, schema: FeatureSchema, blend: Blend) -> bytes:
    """The exported network with the blend appended; same input, same output name and shape
    (the score, now the blend's log-odds); the heads stay as the network answers them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(model_onnx)
    graph = model.graph
    out = schema.output_name
    inner = f"{out}_net"
    for node in graph.node:
        node.output[:] = [inner if name == out else name for name in node.output]
    product = schema.blocks["user_item_product"]

    def constant(name: str, value: float | list[int], dtype: type) -> None:
        graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))

    constant("blend_product_start", [product.start], np.int64)
    constant("blend_product_end", [product.stop], np.int64)
    constant("blend_axis", [1], np.int64)
    constant("blend_w_recall", blend.recall, np.float32)
    constant("blend_w_model", blend.model, np.float32)
    constant("blend_bias", blend.bias, np.float32)
    sequence_steps: list[tuple[str, list[str], str]] = []
    if blend.sequence:
        block = schema.blocks["sequence"]
        constant("blend_sequence_start", [block.start], np.int64)
        constant("blend_sequence_end", [block.stop], np.int64)
        graph.initializer.append(
            numpy_helper.from_array(
                np.array(blend.sequence, dtype=np.float32).reshape(-1, 1), "blend_w_sequence"
            )
        )
        sequence_steps = [
            (
                "Slice",
                [schema.input_name, "blend_sequence_start", "blend_sequence_end", "blend_axis"],
                "blend_sequence",
            ),
            ("MatMul", ["blend_sequence", "blend_w_sequence"], "blend_c"),
            ("Add", ["blend_abc_in", "blend_c"], "blend_abc"),
        ]
    steps = [
        (
            "Slice",
            [schema.input_name, "blend_product_start", "blend_product_end", "blend_axis"],
            "blend_product",
        ),
        ("ReduceSum", ["blend_product", "blend_axis"], "blend_recall"),
        ("Mul", ["blend_recall", "blend_w_recall"], "blend_a"),
        ("Mul", [inner, "blend_w_model"], "blend_b"),
        ("Add", ["blend_a", "blend_b"], "blend_abc_in" if sequence_steps else "blend_abc"),
        *sequence_steps,
        ("Add", ["blend_abc", "blend_bias"], out),
    ]
    for op, inputs, output in steps:
        graph.node.append(helper.make_node(op, inputs, [output], name=output))
    # The score's output now comes from the blend; any other (the heads) stays as it was.
    others = [output for output in graph.output if output.name != out]
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [None, 1]))
    graph.output.extend(others)
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def blend_scores(
    blend: Blend,
    recall: npt.NDArray[np.float64],
    model_score: npt.NDArray[np.floating],
    sequence: FloatArray | None = None,
) -> npt.NDArray[np.float64]:
    """The blend's log-odds for each row, as the exported graph computes it."""
    z = blend.recall * recall + blend.model * model_score.astype(np.float64) + blend.bias
    if blend.sequence and sequence is not None:
        z = z + sequence.astype(np.float64) @ np.asarray(blend.sequence, dtype=np.float64)
    scores: npt.NDArray[np.float64] = z
    return scores


def lists_ndcg(
    owners: npt.NDArray[np.int64],
    labels: npt.NDArray[np.int8],
    scores: npt.NDArray[np.float64],
    k: int = 10,
) -> float:
    """Binary NDCG@k of each owner's rows ordered by score, averaged over the owners."""
    order = np.lexsort((-scores, owners))
    owners, labels = owners[order], labels[order]
    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    values = []
    for start, end in zip(starts, np.r_[starts[1:], len(owners)], strict=True):
        hits = labels[start : min(end, start + k)].astype(np.float64)
        ideal = discounts[: min(k, int(labels[start:end].sum()))].sum()
        if ideal:
            values.append(float((hits * discounts[: len(hits)]).sum() / ideal))
    return float(np.mean(values)) if values else 0.0


def prerank_blend(recall: float, sequence: tuple[float, ...]) -> Blend:
    """The blend that orders as pre-rank does: its weights, and none on the MLP."""
    return Blend(recall=recall, model=0.0, bias=0.0, sequence=sequence)


def prerank_order(schema: FeatureSchema, weights: PrerankWeights) -> Blend:
    """The blend that orders as these pre-rank weights do: the user's vector's weight on
    recall's score, each weighed signal's on its column of the sequence block (the block's
    other signals get none)."""
    return prerank_blend(
        weights.user, tuple(getattr(weights, name, 0.0) for name in schema.sequence)
    )


def ordered_blend(
    schema: FeatureSchema,
    users: IntArray,
    labels: npt.NDArray[np.int8],
    recall: npt.NDArray[np.float64],
    sequence: FloatArray,
    ignored: BoolArray,
) -> Blend | None:
    """Pre-rank's signals (the two item-to-item ones, and the order model's where the schema
    declares it) weighed for the first ten, not for the KEEP pre-rank hands on: of the grid
    pre-rank searches (each signal scaled by its spread against the user's vector's 1), the
    weights whose order puts the most liked items first in these lists (NDCG@10). None where
    the schema's sequence block lacks all of them or the build leaves them all out."""
    names = list(schema.sequence)

    def weighed(name: str) -> bool:
        return name in names and not ignored[names.index(name)]

    if not (weighed("similar") or weighed("recent") or weighed("order")):
        return None
    spread = sequence.astype(np.float64).std(axis=0)
    spread[spread == 0] = 1.0

    def spread_of(name: str) -> float:
        return float(spread[names.index(name)]) if weighed(name) else 1.0

    def steps(name: str) -> tuple[float, ...]:
        # A signal not weighed tries 0 alone: 6 choices where 36 would differ, 36 where 216
        # would (the order model's too), each a sort of every row.
        return GRID if weighed(name) else (0.0,)

    grid = weight_grid(
        float(recall.std()) or 1.0,
        spread_of("similar"),
        spread_of("recent"),
        similar_steps=steps("similar"),
        recent_steps=steps("recent"),
        order=spread_of("order"),
        order_steps=steps("order"),
    )
    choices = [prerank_order(schema, weights) for weights in grid]
    zeros = np.zeros(len(recall))
    return max(
        choices,
        key=lambda blend: lists_ndcg(users, labels, blend_scores(blend, recall, zeros, sequence)),
    )


def choose_blend(
    schema: FeatureSchema,
    prerank: PrerankWeights,
    listed: tuple[IntArray, npt.NDArray[np.int8]],
    recall: npt.NDArray[np.float64],
    network: npt.NDArray[np.floating],
    sequence: FloatArray | None,
    ignored: BoolArray,
) -> Blend:
    """Of the blend fitted on half the listed users, pre-rank's signals weighed for the first
    ten on the same half (ordered_blend), pre-rank's own weights and recall's order (the MLP
    left out of all but the first), the one that orders the other half's lists best: the MLP
    earns its place only where it helps on users the blend did not see. `ignored` sequence
    signals get no weight (the inputs left out of this build)."""
    users, labels = listed
    plain = prerank_order(schema, prerank)
    fitting = users % 2 == 0
    if not labels[fitting].any() or labels[fitting].all() or not labels[~fitting].any():
        return plain

    def part(rows: BoolArray) -> FloatArray | None:
        return None if sequence is None else sequence[rows]

    fitted = fit_blend(recall[fitting], network[fitting], labels[fitting], part(fitting), ignored)
    checking = ~fitting

    def quality(blend: Blend) -> float:
        scores = blend_scores(blend, recall[checking], network[checking], part(checking))
        return lists_ndcg(users[checking], labels[checking], scores)

    # Recall's own order is a choice too: pre-rank's weights were fitted to keep held-out
    # items among hundreds, which is not the same as putting them in the first ten.
    recall_only = prerank_blend(1.0, tuple(0.0 for _ in schema.sequence))
    choices = [plain, recall_only, fitted]
    if sequence is not None:
        ordered = ordered_blend(
            schema, users[fitting], labels[fitting], recall[fitting], sequence[fitting], ignored
        )
        if ordered is not None:
            choices.append(ordered)
    # max keeps the first of equals: on a tie the earlier in the list, pre-rank's own first.
    return max(choices, key=quality)
