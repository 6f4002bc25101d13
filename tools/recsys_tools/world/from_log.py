"""A servable world from an interaction log: read, hold out, learn, evaluate, learn again, write.

Everything is learnt first without each user's latest positives and evaluated on them; then,
unless the holdout is kept out, learnt again on every interaction for the world that serves.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.pipeline.signals import sequence_columns
from app.release.attributes import save_attributes
from app.release.catalog import MODEL_FILE
from app.release.foldin import save_foldin
from app.release.neighbours import Neighbours, save_neighbours
from app.release.prerank import PrerankWeights, save_prerank
from app.release.schema import FeatureSchema
from recsys_tools.world.ablation import (
    ITEM_TABLE,
    ignored_columns,
    ignored_signals,
    weigh_inputs,
)
from recsys_tools.world.blend import (
    Blend,
    blend_scores,
    blended_onnx,
    fit_blend,
    lists_ndcg,
    prerank_blend,
    recall_scores,
)
from recsys_tools.world.build import REPORT_FILE, write_catalog
from recsys_tools.world.derive import (
    category_codes,
    check_derivable,
    item_attributes,
    item_dense,
    popularity,
    published_at,
    user_dense,
)
from recsys_tools.world.evaluate import ServedModel, evaluate, split_holdout
from recsys_tools.world.factorize import REGULARIZATION, Embeddings, factorize, foldin_params
from recsys_tools.world.files import (
    ItemTable,
    PositiveLists,
    SeenLists,
    UserTable,
    save_holdout,
    save_table,
    write_manifest,
)
from recsys_tools.world.logs import (
    FLAGS,
    BoolArray,
    IntArray,
    InteractionLog,
    ItemColumns,
    LogColumns,
    read_items,
    read_log,
)
from recsys_tools.world.neighbours import item_neighbours
from recsys_tools.world.prerank_fit import (
    Pools,
    RankedLists,
    fit_prerank,
    latest_positives,
    ranked_lists,
    user_pools,
)
from recsys_tools.world.regularization import choose_regularization
from recsys_tools.world.train import (
    Examples,
    example_rows,
    export_onnx,
    fit_ranker,
    head_aucs,
    like_threshold,
)

log = logging.getLogger("recsys.build")
FloatArray = npt.NDArray[np.float32]
# The network's time grows with its rows; past this many (lists of RANK_DEPTH rows) more
# users change it little, so a large log is sampled.
MAX_RANKER_ROWS = 600_000
# The users whose candidate lists fit pre-rank and the blend: a share, at most so many. Each
# list is the top RANK_DEPTH of pre-rank's order, where the ranker's choices matter.
BLEND_SHARE = 0.5
MAX_BLEND_USERS = 2_000
RANK_DEPTH = 200


@dataclass(frozen=True, slots=True)
class WorldRecipe:
    interactions: Path
    columns: LogColumns = field(default_factory=LogColumns)
    items: Path | None = None
    item_columns: ItemColumns = field(default_factory=ItemColumns)
    keep_holdout: bool = False
    holdout_share: float = 0.2
    seed: int = 7
    index_factory: str = "auto"
    network: str = "auto"  # a key of ranker_net.NETWORKS
    # Whether the item table's categories and publish times feed the features: auto keeps
    # them where the evaluation says they do not lower the ranked list's NDCG@10.
    item_features: str = "auto"
    # Also evaluate without each of FEATURE_GROUPS: one more training apiece.
    compare_inputs: bool = False
    # What this build leaves out: FEATURE_GROUPS the ranker never sees, and ITEM_TABLE.
    without: frozenset[str] = frozenset()
    # ALS's regularisation; None: chosen on the log's own split (regularization.py).
    regularization: float | None = None

    @property
    def shrink(self) -> float:
        return REGULARIZATION if self.regularization is None else self.regularization


@dataclass(slots=True)
class _Clock:
    """Seconds per step, for the report and the progress log."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - started, 2)

    def took(self, name: str) -> str:
        return f"({self.seconds[name]:.1f} s)"


@dataclass(frozen=True, slots=True)
class _Ranker:
    onnx_model: bytes
    rows: int
    positives: int
    blend: Blend
    prerank: PrerankWeights
    # The blending users' examples: the MLP never learns from them.
    holdout_rows: FloatArray
    holdout_labels: npt.NDArray[np.int8]
    # The network's shape, cost and each head's AUC on the blending users' examples.
    network: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Learnt:
    """Everything learnt from one part of the log, in catalog and user-vocabulary order."""

    embeddings: Embeddings
    user_dense: FloatArray
    item_dense: FloatArray
    popularity: FloatArray
    neighbours: Neighbours
    ranker: _Ranker
    categories: IntArray  # each item's category code, as the catalog holds it

    def blobs(self) -> tuple[FloatArray, FloatArray]:
        users = np.concatenate([self.embeddings.users, self.user_dense], axis=1)
        items = np.concatenate([self.embeddings.items, self.item_dense], axis=1)
        return users.astype(np.float32), items.astype(np.float32)

    def served(self) -> ServedModel:
        users, items = self.blobs()
        return ServedModel(
            users,
            items,
            self.popularity,
            self.ranker.onnx_model,
            self.neighbours,
            self.ranker.prerank,
            self.categories,
        )


def _train_ranker(part: InteractionLog, schema: FeatureSchema, recipe: WorldRecipe) -> _Ranker:
    """The network learnt on candidate lists as the service builds them, then blended.

    The part is split in time as the world will be judged (split_holdout): factors,
    features and neighbours are learnt from each user's past, and what the user went on to
    like is the label. For each user the service's pool is rebuilt from that past and cut by
    pre-rank to the rows the model would score; the network learns to tell the liked items
    among them (the negatives are the user's own candidates, the hard ones it must order),
    from columns that carry to the served world's factors (_factor_free). Learnt against
    random items instead, it learnt what tells a positive from anything, and on both public
    movie-ratings sets the blend gave it no weight.

    Half of the users (bounded) are kept from the network: pre-rank is fitted on their pools
    and the blend on their lists (blend.py), so the network moves recall's order only where
    it orders users it never saw better.
    """
    split = split_holdout(part, recipe.holdout_share)
    early = part.subset(split.train)
    embeddings = factorize(early, schema.embedding_dim, recipe.seed, recipe.shrink)
    user_blobs = np.concatenate([embeddings.users, user_dense(early, schema)], axis=1)
    item_blobs = np.concatenate([embeddings.items, item_dense(early, schema)], axis=1)
    # Items the user already had before are filtered as seen when serving: not targets.
    before = np.unique(early.user * part.n_items + early.item)
    targets = ~split.train & ~np.isin(part.user * part.n_items + part.item, before)
    liked = targets & part.positive
    liked_keys = np.unique(part.user[liked] * part.n_items + part.item[liked])
    rng = np.random.default_rng(recipe.seed)
    blending, learning = _user_halves(part, liked, rng)
    # What the service knows of each user at the moment of their targets: their latest
    # positives before it, and the neighbours learnt from the early part.
    neighbours, recent = positive_neighbours(early), latest_positives(early)
    categories = category_codes(part.items)
    first_target = np.full(part.n_users, part.time.max(), dtype=np.int64)
    np.minimum.at(first_target, part.user[targets], part.time[targets])

    def pools_of(users: IntArray) -> Pools:
        return user_pools(
            users,
            embeddings.users,
            embeddings.items,
            neighbours,
            recent,
            before,
            liked_keys,
            categories,
        )

    def rows_of(lists: RankedLists) -> FloatArray:
        moments = Examples(lists.users, lists.items, first_target[lists.users], lists.labels)
        sequence = sequence_columns(schema, lists.signals) if schema.sequence else None
        return example_rows(schema, user_blobs, item_blobs, moments, rng, sequence)

    # Pre-rank and the blend learn on the blending users' pools.
    blending_pools = pools_of(blending)
    prerank = fit_prerank(blending_pools)
    listed = ranked_lists(blending_pools, prerank, RANK_DEPTH)
    taught = ranked_lists(pools_of(learning), prerank, RANK_DEPTH)
    listed_rows, taught_rows = rows_of(listed), rows_of(taught)
    rated = _liked(part, liked, taught)
    model = fit_ranker(
        taught_rows,
        taught.labels,
        recipe.seed,
        rated,
        recipe.network,
        check=(listed_rows, listed.labels),
        ignored=_factor_free(schema, ignored_columns(schema, recipe.without, part)),
    )
    listed_sequence = sequence_columns(schema, listed.signals) if schema.sequence else None
    recall, network = recall_scores(schema, listed_rows), model.scores(listed_rows)
    blend = _choose_blend(
        schema,
        prerank,
        (listed.users, listed.labels),
        recall,
        network,
        listed_sequence,
        ignored_signals(schema, recipe.without, part),
    )
    onnx_model = blended_onnx(export_onnx(model, schema), schema, blend)
    return _Ranker(
        onnx_model,
        len(taught.labels),
        int(taught.labels.sum()),
        blend,
        prerank,
        holdout_rows=listed_rows,
        holdout_labels=listed.labels,
        network={
            "kind": model.shape.kind,
            "cross_layers": model.shape.cross_layers,
            "deep": list(model.shape.deep),
            "like_weight": model.shape.like_weight,
            "flops_per_row": model.flops_per_row,
            "epochs": model.epochs_run,
            "learnt_on": "candidate lists as served",
            "list_depth": RANK_DEPTH,
            # Each shape's AUC on the blending users' lists (none learnt from them), where
            # two were trained: the kept one is the best.
            "considered": model.considered,
            "auc_heads": head_aucs(model, listed_rows, listed.labels, _liked(part, liked, listed)),
        },
    )


def _liked(
    part: InteractionLog, liked: BoolArray, lists: RankedLists
) -> npt.NDArray[np.int8] | None:
    """Which listed positives the user rated highly (train.like_threshold); None for a log
    whose weights cannot tell."""
    threshold = like_threshold(part)
    if threshold is None or part.weight is None:
        return None
    high = liked & (part.weight >= threshold)
    keys = np.unique(part.user[high] * part.n_items + part.item[high])
    rated: npt.NDArray[np.int8] = (
        np.isin(lists.users * part.n_items + lists.items, keys) & (lists.labels == 1)
    ).astype(np.int8)
    return rated


# The row's blocks whose columns are coordinates of this factorisation's vectors.
FACTOR_BLOCKS = ("user_embedding", "item_embedding", "user_item_product")


def _factor_free(
    schema: FeatureSchema, ignored: npt.NDArray[np.bool_] | None
) -> npt.NDArray[np.bool_]:
    """`ignored`, and every column that is a coordinate of the factors.

    The network learns on factors from part of the log; the world serves factors learnt
    again on all of it, whose coordinates mean something else (ALS's factors are defined up
    to a rotation). Only what carries across factorisations is learnt from: the dense
    features, the context and the sequence signals (similarities, the same in any basis);
    the user·item product itself enters through the blend, beside the network.
    """
    kept = np.zeros(schema.width, dtype=bool) if ignored is None else ignored.copy()
    for block in FACTOR_BLOCKS:
        kept[schema.blocks[block]] = True
    return kept


def _choose_blend(
    schema: FeatureSchema,
    prerank: PrerankWeights,
    listed: tuple[IntArray, npt.NDArray[np.int8]],
    recall: npt.NDArray[np.float64],
    network: npt.NDArray[np.floating],
    sequence: FloatArray | None,
    ignored: BoolArray,
) -> Blend:
    """Of the blend fitted on half the listed users, pre-rank's own weights and recall's
    order (the MLP left out of both), the one that orders the other half's lists best: the
    MLP earns its place only where it helps on users the blend did not see. `ignored`
    sequence signals get no weight (the inputs left out of this build)."""
    users, labels = listed
    # Pre-rank weighs three signals; the sequence block's others get no weight of its own.
    weighed = tuple(getattr(prerank, name, 0.0) for name in schema.sequence)
    plain = prerank_blend(prerank.user, weighed)
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
    return max((plain, recall_only, fitted), key=quality)


def positive_neighbours(part: InteractionLog) -> Neighbours:
    """The item-to-item neighbours of the part's positives."""
    return item_neighbours(
        part.user[part.positive], part.item[part.positive], part.n_users, part.n_items
    )


def _user_halves(
    part: InteractionLog, liked: BoolArray, rng: np.random.Generator
) -> tuple[IntArray, IntArray]:
    """The users with something liked to learn from, in two: those whose lists fit pre-rank
    and the blend (BLEND_SHARE, at most MAX_BLEND_USERS), and those the network learns
    from (at most as many as MAX_RANKER_ROWS of lists hold)."""
    users = np.unique(part.user[liked])
    shuffled = rng.permutation(users)
    count = min(MAX_BLEND_USERS, max(1, round(BLEND_SHARE * len(users))))
    blending = np.sort(shuffled[:count])
    learning = np.sort(shuffled[count : count + max(1, MAX_RANKER_ROWS // RANK_DEPTH)])
    return blending.astype(np.int64), learning.astype(np.int64)


def _learn(
    part: InteractionLog, schema: FeatureSchema, recipe: WorldRecipe, clock: _Clock, label: str
) -> _Learnt:
    positives = int(part.positive.sum())
    with clock.step(f"{label}.embeddings"):
        embeddings = factorize(part, schema.embedding_dim, recipe.seed, recipe.shrink)
    log.info(
        "%s: embeddings (dim %d) from %s positives %s",
        label,
        schema.embedding_dim,
        f"{positives:,}",
        clock.took(f"{label}.embeddings"),
    )
    with clock.step(f"{label}.features"):
        users, items = user_dense(part, schema), item_dense(part, schema)
        counts = popularity(part)
    log.info("%s: dense features %s", label, clock.took(f"{label}.features"))
    with clock.step(f"{label}.neighbours"):
        neighbours = positive_neighbours(part)
    log.info(
        "%s: %d neighbours of %s items %s",
        label,
        neighbours.k,
        f"{int((neighbours.positions[:, 0] >= 0).sum()):,}",
        clock.took(f"{label}.neighbours"),
    )
    with clock.step(f"{label}.ranker"):
        ranker = _train_ranker(part, schema, recipe)
    log.info(
        "%s: ranker trained on %s rows (%s positives) %s; %s",
        label,
        f"{ranker.rows:,}",
        f"{ranker.positives:,}",
        clock.took(f"{label}.ranker"),
        f"the blend weighs it {ranker.blend.model:.3g}"
        if ranker.blend.model
        else "it orders users it never saw no better than pre-rank's weights: the score "
        "leaves it out (blend model weight 0)",
    )
    return _Learnt(embeddings, users, items, counts, neighbours, ranker, category_codes(part.items))


def _seen_lists(part: InteractionLog) -> SeenLists:
    """Each user's every distinct item, newest first: the service filters them as seen.

    Every interaction, not only the positives: an item the user rated low has been seen too.
    """
    users = np.flatnonzero(np.bincount(part.user, minlength=part.n_users))
    rows = np.arange(len(part.user))[::-1]  # by user descending, then newest first
    rows = rows[np.argsort(part.user[rows], kind="stable")]
    _, first = np.unique(part.user[rows] * part.n_items + part.item[rows], return_index=True)
    rows = rows[np.sort(first)]  # the newest occurrence of each (user, item)
    position = np.full(part.n_users, -1, dtype=np.int64)
    position[users] = np.arange(len(users))
    counts = np.bincount(position[part.user[rows]], minlength=len(users))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return SeenLists(part.user_ids[users], offsets, part.items.ids[part.item[rows]])


def _positive_lists(part: InteractionLog) -> PositiveLists:
    """Each user's positives, oldest first, repeats kept (the consumer's fold-in input)."""
    rows = np.flatnonzero(part.positive)
    rows = rows[np.lexsort((part.time[rows], part.user[rows]))]
    users, counts = np.unique(part.user[rows], return_counts=True)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return PositiveLists(part.user_ids[users], offsets, part.items.ids[part.item[rows]])


def _tables(part: InteractionLog, learnt: _Learnt) -> tuple[ItemTable, UserTable, SeenLists]:
    served = np.flatnonzero(np.bincount(part.user[part.positive], minlength=part.n_users))
    items = ItemTable(
        ids=part.items.ids,
        embeddings=learnt.embeddings.items,
        dense=learnt.item_dense,
        categories=category_codes(part.items),
        published_at=published_at(part),
        popularity=learnt.popularity,
    )
    users = UserTable(
        ids=part.user_ids[served],
        embeddings=learnt.embeddings.users[served],
        dense=learnt.user_dense[served],
    )
    return items, users, _seen_lists(part)


def _counts(whole: InteractionLog, served: InteractionLog, users: int) -> dict[str, Any]:
    rows_per_item = np.bincount(whole.item, minlength=whole.n_items)
    positives_per_item = np.bincount(whole.item[whole.positive], minlength=whole.n_items)
    return {
        "rows_read": whole.counts.rows_read,
        "interactions": len(whole.user),
        "positives": int(whole.positive.sum()),
        "below_min_weight": whole.counts.below_min_weight,
        "dropped": dict(whole.counts.dropped),
        "users": users,
        "items": whole.n_items,
        "items_without_interactions": int((rows_per_item == 0).sum()),
        "items_without_positives": int((positives_per_item == 0).sum()),
        "categories": len(whole.items.category_names),
        "served_positives": int(served.positive.sum()),
    }


def _histories(seen: SeenLists) -> dict[str, int]:
    """How many histories there are and the longest: the service filters each one whole."""
    lengths = np.diff(seen.offsets)
    return {"users": len(lengths), "longest": int(lengths.max()) if len(lengths) else 0}


def _read(recipe: WorldRecipe, clock: _Clock) -> InteractionLog:
    with clock.step("read"):
        items = None
        if recipe.items is not None:
            items = read_items(recipe.items, recipe.item_columns)
        whole = read_log(recipe.interactions, recipe.columns, items)
    dropped = sum(whole.counts.dropped.values())
    log.info(
        "read %s interactions from %s (%s dropped; %s positives, %s users, %s items) %s",
        f"{whole.counts.rows_read:,}",
        whole.source,
        f"{dropped:,}",
        f"{int(whole.positive.sum()):,}",
        f"{whole.n_users:,}",
        f"{whole.n_items:,}",
        clock.took("read"),
    )
    return whole


def _write(
    world: Path,
    schema: FeatureSchema,
    recipe: WorldRecipe,
    part: InteractionLog,
    learnt: _Learnt,
    attributes: dict[str, npt.NDArray[np.str_]],
) -> tuple[int, SeenLists]:
    """Write the world's files; returns how many users have features, and the seen lists."""
    items, users, seen = _tables(part, learnt)
    write_catalog(world, schema, items, users, recipe.index_factory)
    save_attributes(world, attributes)
    save_table(world, seen)
    save_table(world, _positive_lists(part))
    save_foldin(world, foldin_params(part, recipe.shrink))
    save_neighbours(world, learnt.neighbours)
    save_prerank(world, learnt.ranker.prerank)
    (world / MODEL_FILE).write_bytes(learnt.ranker.onnx_model)
    save_holdout(world, learnt.ranker.holdout_rows, learnt.ranker.holdout_labels)
    return len(users.ids), seen


def build_world_from_log(recipe: WorldRecipe, world: Path, schema: FeatureSchema) -> dict[str, Any]:
    """Build, evaluate and write the world; returns the report also written to report.json."""
    check_derivable(schema)
    clock = _Clock()
    started = time.perf_counter()
    whole = _read(recipe, clock)
    with clock.step("holdout"):
        holdout = split_holdout(whole, recipe.holdout_share)
        train = whole.subset(holdout.train)
    if len(holdout.users) == 0:
        raise ConfigError(
            f"{whole.source}: no user has two positives (on different items), so nothing can "
            f"be held out or learnt to rank; lower {FLAGS['min_weight']} or bring a longer log"
        )
    log.info(
        "held out the latest %d%% of %s users' positives %s",
        round(100 * recipe.holdout_share),
        f"{len(holdout.users):,}",
        clock.took("holdout"),
    )
    with clock.step("regularization"):
        choice = None
        if recipe.regularization is None:
            choice = choose_regularization(
                train, schema.embedding_dim, recipe.seed, recipe.holdout_share
            )
            recipe = replace(recipe, regularization=choice.regularization)
    log.info(
        "ALS regularisation %g %s%s",
        recipe.shrink,
        clock.took("regularization"),
        "" if choice is None else f" (recall@10 on the train part's own split: {choice.recall})",
    )
    first_recipe = recipe
    if recipe.item_features == "off":
        first_recipe = replace(recipe, without=recipe.without | {ITEM_TABLE})
    learnt = _learn(train, schema, first_recipe, clock, "train")
    with clock.step("evaluate"):
        evaluation = evaluate(
            train, holdout, learnt.served(), schema, recipe.index_factory, recipe.seed
        )
    log.info(
        "evaluated %s users %s: %s",
        f"{evaluation['users_evaluated']:,}",
        clock.took("evaluate"),
        json.dumps(evaluation["methods"]),
    )
    # Each comparison trains the shape the first training kept: the inputs differ, not it.
    kept = replace(recipe, network=learnt.ranker.network["kind"])

    def learn_again(without: frozenset[str]) -> tuple[_Learnt, Any]:
        again = _learn(train, schema, replace(kept, without=without), clock, "compare")
        served = again.served()
        return again, evaluate(train, holdout, served, schema, recipe.index_factory, recipe.seed)

    with clock.step("inputs"):
        weighed = weigh_inputs(
            train, (learnt, evaluation), learn_again, recipe.item_features, recipe.compare_inputs
        )
    learnt, evaluation = weighed.learnt, weighed.evaluation
    recipe = replace(recipe, without=weighed.without)
    served = train
    if not recipe.keep_holdout:
        served = whole
        learnt = _learn(whole, schema, recipe, clock, "all")
    with clock.step("write"):
        users, seen = _write(world, schema, recipe, served, learnt, item_attributes(whole.items))
    log.info("wrote the world to %s %s", world, clock.took("write"))
    report: dict[str, Any] = {
        "source": {
            "interactions": str(recipe.interactions),
            "items": None if recipe.items is None else str(recipe.items),
        },
        "served": "train part" if recipe.keep_holdout else "all interactions",
        "counts": _counts(whole, served, users),
        "evaluation": evaluation,
        "inputs": weighed.report,
        "histories": _histories(seen),
        "als": {
            "regularization": recipe.shrink,
            "chosen_on": None if choice is None else choice.recall,
        },
        "ranker": {
            "rows": learnt.ranker.rows,
            "positives": learnt.ranker.positives,
            "network": learnt.ranker.network,
            "blend": learnt.ranker.blend.as_dict(),
            # Whether the network has any say in the served score (the blend's choice).
            "network_in_score": learnt.ranker.blend.model != 0,
            "prerank": dataclasses.asdict(learnt.ranker.prerank),
        },
        "seconds": {**clock.seconds, "total": round(time.perf_counter() - started, 2)},
    }
    (world / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    write_manifest(
        world,
        source="interactions",
        interactions=recipe.interactions.name,
        item_table=None if recipe.items is None else recipe.items.name,
        seed=recipe.seed,
        served=report["served"],
        counts=report["counts"],
        evaluation=evaluation["methods"],
        build_seconds=report["seconds"]["total"],
    )
    from recsys_tools.world.identity import stamp_world

    stamp_world(world, schema)
    return report
