"""Train the ranking network and export it to ONNX.

It learns from a synthetic world's impressions, or from a log's positives against sampled
negatives. The network and its export are ranker_net.py (PyTorch trains; serving needs
neither). The training rows come from the same pack_rows (and encode_context) the service
uses, so the model sees exactly what it will be sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.pipeline.packing import encode_context, pack_rows
from app.release.schema import FeatureSchema
from recsys_tools.world.logs import InteractionLog
from recsys_tools.world.ranker_net import HEADS, NETWORKS, RankerNet, export_net, fit_best
from recsys_tools.world.synth import World

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
HOURS, WEEKDAYS = 24, 7
# 1970-01-01 was a Thursday: Python's weekday 3.
EPOCH_WEEKDAY = 3
# Collisions with a user's own positives are redrawn this often, then dropped.
RESAMPLE_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class TrainingReport:
    train_rows: int
    test_rows: int
    click_rate: float
    auc_model: float
    auc_popularity: float
    auc_similarity: float
    auc_heads: dict[str, float | None]
    like_rate: float
    network: str  # the shape kept: "mlp" or "dcn"
    flops_per_row: int
    considered: dict[str, float]  # each shape's AUC on users none learnt from

    def as_dict(self) -> dict[str, object]:
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


def fit_ranker(
    rows: FloatArray,
    labels: npt.NDArray[np.int8],
    seed: int = 7,
    liked: npt.NDArray[np.int8] | None = None,
    network: str = "auto",
    check: tuple[FloatArray, npt.NDArray[np.int8]] | None = None,
    ignored: npt.NDArray[np.bool_] | None = None,
) -> RankerNet:
    """Fit the ranking network (a key of NETWORKS) on packed rows, choosing on `check` where
    there is a choice (fit_best), never looking at `ignored` columns; export it with
    export_onnx."""
    return fit_best(rows, labels, liked, NETWORKS[network], seed, check, ignored)


def head_aucs(
    net: RankerNet,
    rows: FloatArray,
    labels: npt.NDArray[np.int8],
    liked: npt.NDArray[np.int8] | None,
) -> dict[str, float | None]:
    """Each head's AUC on its own label: interact on every row, like among the positives
    (None where a label has one class only)."""
    heads = net.head_probabilities(rows)
    answer: dict[str, float | None] = {name: None for name in HEADS}
    if 0 < labels.sum() < len(labels):
        answer["interact"] = round(auc(labels, heads[:, 0]), 4)
    if liked is not None:
        positive = labels == 1
        if 0 < liked[positive].sum() < positive.sum():
            answer["like"] = round(auc(liked[positive], heads[positive, 1]), 4)
    return answer


def train_ranker(world: World, schema: FeatureSchema, seed: int = 7) -> TrainedRanker:
    rows = training_rows(world, schema)
    labels, liked = world.interactions.clicked, world.interactions.liked
    rng = np.random.default_rng(seed)
    test = rng.random(len(labels)) < 0.2
    # A tenth of the users are kept from the networks to choose between them (fit_best).
    apart = ~test & (world.interactions.users % 10 == 0)
    learn = ~test & ~apart
    model = fit_ranker(
        rows[learn], labels[learn], seed, liked[learn], check=(rows[apart], labels[apart])
    )
    product = schema.blocks["user_item_product"]
    report = TrainingReport(
        train_rows=int((~test).sum()),  # learnt from, or kept apart to choose the network
        test_rows=int(test.sum()),
        click_rate=float(labels.mean()),
        auc_model=auc(labels[test], model.predict_proba(rows[test])[:, 1]),
        auc_popularity=auc(labels[test], world.items.popularity[world.interactions.items[test]]),
        auc_similarity=auc(labels[test], rows[test][:, product].sum(axis=1)),
        auc_heads=head_aucs(model, rows[test], labels[test], liked[test]),
        like_rate=float(liked[labels == 1].mean()) if labels.any() else 0.0,
        network=model.shape.kind,
        flops_per_row=model.flops_per_row,
        considered=model.considered,
    )
    return TrainedRanker(export_onnx(model, schema), report)


def export_onnx(model: RankerNet, schema: FeatureSchema) -> bytes:
    """Export with the schema's input name and a single [n, 1] combined-score output."""
    return export_net(model, schema.input_name, schema.output_name, schema.width)


@dataclass(frozen=True, slots=True)
class Examples:
    """Ranker examples from a log: each positive, then its sampled negatives."""

    users: IntArray
    items: IntArray
    times: IntArray
    labels: npt.NDArray[np.int8]
    # Which positives the user rated highly (like_threshold); 0 for negatives; None for a
    # log whose weights cannot tell.
    liked: npt.NDArray[np.int8] | None = None


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
    liked = None
    threshold = like_threshold(log)
    if threshold is not None and log.weight is not None:
        liked = np.zeros_like(labels)
        liked[: len(users)] = log.weight[chosen] >= threshold
    return Examples(
        np.concatenate(parts_users),
        np.concatenate(parts_items),
        np.concatenate(parts_times),
        labels,
        liked,
    )


def like_threshold(log: InteractionLog) -> float | None:
    """The weight from which a positive counts as liked: the positives' median, or just
    above their lowest weight where the median is it; None where all positives weigh the
    same (a log of clicks), which leaves the like head out."""
    if log.weight is None or not log.positive.any():
        return None
    weights = log.weight[log.positive]
    lowest, median = float(weights.min()), float(np.median(weights))
    if median > lowest:
        return median
    above = weights[weights > lowest]
    return float(above.min()) if len(above) else None


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
