"""Train the ranking MLP and export it to ONNX.

It learns from a synthetic world's impressions, or from a log's positives against sampled
negatives. scikit-learn trains, skl2onnx exports; neither is needed to serve. The training
rows come from the same pack_rows (and encode_context) the service uses, so the model sees
exactly what it will be sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from app.pipeline.packing import encode_context, pack_rows
from app.release.schema import FeatureSchema
from recsys_tools.world.logs import InteractionLog
from recsys_tools.world.synth import World

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
HOURS, WEEKDAYS = 24, 7
# 1970-01-01 was a Thursday: Python's weekday 3.
EPOCH_WEEKDAY = 3
# Collisions with a user's own positives are redrawn this often, then dropped.
RESAMPLE_ROUNDS = 8
# The share of training rows the MLP keeps back to decide when to stop.
VALIDATION = 0.1


@dataclass(frozen=True, slots=True)
class TrainingReport:
    train_rows: int
    test_rows: int
    click_rate: float
    auc_model: float
    auc_popularity: float
    auc_similarity: float

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class TrainedRanker:
    onnx_model: bytes
    report: TrainingReport


def training_rows(world: World, schema: FeatureSchema) -> FloatArray:
    impressions = world.interactions
    user_blobs = np.concatenate([world.users.embeddings, world.users.dense], axis=1)[
        impressions.users
    ]
    item_blobs = np.concatenate([world.items.embeddings, world.items.dense], axis=1)[
        impressions.items
    ]
    return pack_rows(schema, user_blobs, item_blobs, impressions.contexts)


def auc(labels: npt.NDArray[np.int8], scores: npt.NDArray[np.floating]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


class Classifier(Protocol):
    """What the ranker needs of a fitted model: click probabilities per row."""

    def predict_proba(self, rows: FloatArray) -> npt.NDArray[np.float64]: ...


def fit_ranker(rows: FloatArray, labels: npt.NDArray[np.int8], seed: int = 7) -> Classifier:
    """Fit the ranking MLP (standardised inputs) on packed rows; export it with export_onnx."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    pipeline = make_pipeline(
        StandardScaler(),
        MLPClassifier(
            hidden_layer_sizes=(64, 32),
            # Early stopping keeps 10% back; a batch beyond the rest is clipped, with a warning.
            batch_size=min(512, len(rows) - math.ceil(VALIDATION * len(rows))),
            learning_rate_init=2e-3,
            max_iter=40,
            early_stopping=True,
            validation_fraction=VALIDATION,
            n_iter_no_change=4,
            random_state=seed,
        ),
    )
    pipeline.fit(rows, labels)
    fitted: Classifier = pipeline
    return fitted


def train_ranker(world: World, schema: FeatureSchema, seed: int = 7) -> TrainedRanker:
    rows = training_rows(world, schema)
    labels = world.interactions.clicked
    rng = np.random.default_rng(seed)
    test = rng.random(len(labels)) < 0.2
    model = fit_ranker(rows[~test], labels[~test], seed)
    product = schema.blocks["user_item_product"]
    report = TrainingReport(
        train_rows=int((~test).sum()),
        test_rows=int(test.sum()),
        click_rate=float(labels.mean()),
        auc_model=auc(labels[test], model.predict_proba(rows[test])[:, 1]),
        auc_popularity=auc(labels[test], world.items.popularity[world.interactions.items[test]]),
        auc_similarity=auc(labels[test], rows[test][:, product].sum(axis=1)),
    )
    return TrainedRanker(export_onnx(model, schema), report)


def export_onnx(model: object, schema: FeatureSchema) -> bytes:
    """Export with the schema's input name and a single [n, 1] click-probability output."""
    import onnx
    from onnx import helper, numpy_helper
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    converted = to_onnx(
        model,
        initial_types=[(schema.input_name, FloatTensorType([None, schema.width]))],
        options={"zipmap": False},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    graph = converted.graph
    probabilities = next(out.name for out in graph.output if out.name != "label")
    # Column 1 of the class probabilities is P(click); slice it out as [n, 1].
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([1], dtype=np.int64), "score_start"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "score_end"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "score_axis"),
        ]
    )
    graph.node.append(
        helper.make_node(
            "Slice",
            [probabilities, "score_start", "score_end", "score_axis"],
            [schema.output_name],
            name="click_probability",
        )
    )
    graph.output.append(
        helper.make_tensor_value_info(schema.output_name, onnx.TensorProto.FLOAT, [None, 1])
    )
    pruned = onnx.utils.Extractor(converted).extract_model(
        [schema.input_name], [schema.output_name]
    )
    pruned.ir_version = min(pruned.ir_version, 8)  # loadable by older GPU Triton releases
    onnx.checker.check_model(pruned)
    return bytes(pruned.SerializeToString())


@dataclass(frozen=True, slots=True)
class Examples:
    """Ranker examples from a log: each positive, then its sampled negatives."""

    users: IntArray
    items: IntArray
    times: IntArray
    labels: npt.NDArray[np.int8]


def _among(owned: IntArray, keys: IntArray) -> npt.NDArray[np.bool_]:
    """Which keys are in the sorted array `owned`."""
    if len(owned) == 0:
        return np.zeros(len(keys), dtype=bool)
    hit: npt.NDArray[np.bool_] = (
        owned[np.minimum(np.searchsorted(owned, keys), len(owned) - 1)] == keys
    )
    return hit


def _draw(
    rng: np.random.Generator, n: int, n_items: int, weights: npt.NDArray[np.float64] | None
) -> IntArray:
    if weights is None:
        return rng.integers(0, n_items, size=n)
    drawn: IntArray = rng.choice(n_items, size=n, p=weights)
    return drawn


def sample_examples(
    log: InteractionLog,
    popularity: FloatArray,
    negatives: int,
    rng: np.random.Generator,
    targets: npt.NDArray[np.bool_] | None = None,
) -> Examples:
    """Every positive (among `targets` rows) against `negatives` items at the same moment.

    Half the negatives are drawn by popularity, so popular is not a sure sign of positive;
    half uniformly, so the whole catalog is seen. None is one of the user's own positives.
    """
    chosen = log.positive if targets is None else log.positive & targets
    users, items, times = log.user[chosen], log.item[chosen], log.time[chosen]
    owned = np.unique(log.user[log.positive] * log.n_items + log.item[log.positive])
    # In float64 before dividing: float32 shares need not sum to 1 closely enough for choice.
    by_popularity = popularity.astype(np.float64)
    by_popularity /= by_popularity.sum()
    parts_users, parts_items, parts_times = [users], [items], [times]
    for k in range(negatives):
        weights = by_popularity if k < negatives // 2 else None
        drawn = _draw(rng, len(users), log.n_items, weights)
        for _ in range(RESAMPLE_ROUNDS):
            clash = np.flatnonzero(_among(owned, users * log.n_items + drawn))
            if len(clash) == 0:
                break
            drawn[clash] = _draw(rng, len(clash), log.n_items, weights)
        fine = ~_among(owned, users * log.n_items + drawn)
        parts_users.append(users[fine])
        parts_items.append(drawn[fine])
        parts_times.append(times[fine])
    labels = np.zeros(sum(len(part) for part in parts_users), dtype=np.int8)
    labels[: len(users)] = 1
    return Examples(
        np.concatenate(parts_users),
        np.concatenate(parts_items),
        np.concatenate(parts_times),
        labels,
    )


def utc_hour_weekday(times: IntArray) -> tuple[IntArray, IntArray]:
    """The UTC hour and weekday (Monday 0) of unix seconds, as the service reads its clock."""
    return (times // 3600) % HOURS, (times // 86_400 + EPOCH_WEEKDAY) % WEEKDAYS


def context_rows(schema: FeatureSchema, times: IntArray, rng: np.random.Generator) -> FloatArray:
    """Device, page and locale drawn at random, so the model learns they say nothing here;
    hour and weekday from the moment (UTC).

    Every combination is encoded once by the service's own encode_context, then looked up:
    the same encoding, without a Python call per row.
    """
    devices, pages, locales = schema.devices, schema.pages, schema.locales
    shape = (len(devices), len(pages), len(locales), HOURS, WEEKDAYS)
    table = np.stack(
        [
            encode_context(schema, devices[d], pages[p], locales[loc], hour, weekday)
            for d, p, loc, hour, weekday in np.ndindex(shape)
        ]
    )
    drawn = [rng.integers(0, size, size=len(times)) for size in shape[:3]]
    hours, weekdays = utc_hour_weekday(times)
    rows: FloatArray = table[np.ravel_multi_index((*drawn, hours, weekdays), shape)]
    return rows


def example_rows(
    schema: FeatureSchema,
    user_blobs: FloatArray,
    item_blobs: FloatArray,
    examples: Examples,
    rng: np.random.Generator,
    sequence: FloatArray | None = None,
) -> FloatArray:
    """The packed model input for each example, as the service would pack it; `sequence`,
    one row per example, where the schema declares sequence signals."""
    return pack_rows(
        schema,
        user_blobs[examples.users],
        item_blobs[examples.items],
        context_rows(schema, examples.times, rng),
        sequence=sequence,
    )
