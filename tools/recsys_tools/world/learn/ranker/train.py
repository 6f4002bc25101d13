"""Train the ranking network and export it to ONNX.

It learns from a synthetic world's impressions, or from a log's candidate lists as the
service builds them (from_log.py). The network is net.py, trained by fit.py (PyTorch) and
written by export.py; serving needs neither. The training rows come from the same pack_rows (and
encode_context) the service uses, so the model sees exactly what it will be sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.pipeline.packing import encode_context, pack_rows
from app.world.schema import FeatureSchema
from app.world.tables import HeldOut
from recsys_tools.world.generate.synth import World
from recsys_tools.world.judge.measures import auc
from recsys_tools.world.learn.ranker.export import export_net
from recsys_tools.world.learn.ranker.fit import fit_best
from recsys_tools.world.learn.ranker.net import HEADS, NETWORKS, RankerNet
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.times import HOURS, WEEKDAYS, utc_hour_weekday

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


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
    held_out: HeldOut  # the test impressions' rows, which it never learnt from


# The share of a synthetic world's impressions held out to test the ranker.
TEST_SHARE = 0.2


def training_rows(world: World, schema: FeatureSchema) -> FloatArray:
    impressions = world.interactions
    user_blobs = np.concatenate([world.users.embeddings, world.users.dense], axis=1)[
        impressions.users
    ]
    item_blobs = np.concatenate([world.items.embeddings, world.items.dense], axis=1)[
        impressions.items
    ]
    return pack_rows(schema, user_blobs, item_blobs, impressions.contexts)


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
    test = rng.random(len(labels)) < TEST_SHARE
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
        auc_model=auc(labels[test], model.scores(rows[test])),
        auc_popularity=auc(labels[test], world.items.popularity[world.interactions.items[test]]),
        auc_similarity=auc(labels[test], rows[test][:, product].sum(axis=1)),
        auc_heads=head_aucs(model, rows[test], labels[test], liked[test]),
        like_rate=float(liked[labels == 1].mean()) if labels.any() else 0.0,
        network=model.shape.kind,
        flops_per_row=model.flops_per_row,
        considered=model.considered,
    )
    held_out = HeldOut(
        rows[test],
        labels[test].astype(np.int8),
        world.users.ids[world.interactions.users[test]],
        world.items.ids[world.interactions.items[test]],
    )
    return TrainedRanker(export_onnx(model, schema), report, held_out)


def export_onnx(model: RankerNet, schema: FeatureSchema) -> bytes:
    """Export with the schema's input name, the [n, 1] combined score (a log-odds) and the
    heads; a schema whose model.score says otherwise would mislead the rules."""
    if schema.score_scale != "log_odds":
        raise ConfigError(
            f"the feature schema says the model's score is a {schema.score_scale}; the ranker "
            'this build trains answers a log-odds: set "score": "log_odds" in its "model"'
        )
    return export_net(model, schema.input_name, schema.output_name, schema.width)


@dataclass(frozen=True, slots=True)
class Examples:
    """Ranker examples from a log: a user, an item, the moment, whether it was chosen."""

    users: IntArray
    items: IntArray
    times: IntArray
    labels: npt.NDArray[np.int8]
    liked: npt.NDArray[np.int8] | None = None  # rated highly (like_threshold); 0 for negatives


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
