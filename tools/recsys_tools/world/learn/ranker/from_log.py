"""The ranker learnt from a log: on candidate lists as the service builds them, then blended.

The part is split in time as the world will be judged (split_holdout): factors, features and
neighbours are learnt from each user's past, and what the user went on to like is the label.
For each user the service's pool is rebuilt from that past and cut by pre-rank to the rows
the model would score; the network learns to tell the liked items among them (the negatives
are the user's own candidates, the hard ones it must order), from columns that carry to the
served world's factors (factor_free). Learnt against random items instead, it learnt what
tells a positive from anything, and on both public movie-ratings sets the blend gave it no
weight.

Half of the users (bounded) are kept from the network: pre-rank is fitted on their pools and
the blend on their lists (blend.py), so the network moves recall's order only where it orders
users it never saw better.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.pipeline.signals import sequence_columns
from app.world.neighbours import Neighbours
from app.world.order import OrderModel
from app.world.prerank import PrerankWeights
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.ablation import ignored_columns, ignored_signals
from recsys_tools.world.judge.holdout import HoldoutSplit, split_holdout
from recsys_tools.world.judge.served_view import latest_positives
from recsys_tools.world.judge.service_stages import ServiceStages
from recsys_tools.world.learn.blend import Blend, blended_onnx, choose_blend, recall_scores
from recsys_tools.world.learn.derive import category_codes
from recsys_tools.world.learn.factorize import Embeddings
from recsys_tools.world.learn.prerank import (
    Pools,
    RankedLists,
    fit_prerank,
    ranked_lists,
    user_pools,
)
from recsys_tools.world.learn.ranker.net import RankerNet
from recsys_tools.world.learn.ranker.train import (
    Examples,
    example_rows,
    export_onnx,
    fit_ranker,
    head_aucs,
    like_threshold,
)
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import BoolArray, IntArray

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
class ListTraining:
    """What a build asks of the ranker's training."""

    holdout_share: float
    seed: int
    network: str  # a key of net.NETWORKS
    without: frozenset[str]  # the inputs this build leaves out (judge/ablation.py)


@dataclass(frozen=True, slots=True)
class ListRanker:
    onnx_model: bytes
    rows: int
    positives: int
    blend: Blend
    prerank: PrerankWeights
    # The blending users' examples: the MLP never learns from them.
    holdout_rows: FloatArray
    holdout_labels: npt.NDArray[np.int8]
    # Whose rows they are: each row's user id and item id.
    holdout_users: npt.NDArray[np.str_]
    holdout_items: npt.NDArray[np.str_]
    # The network's shape, cost and each head's AUC on the blending users' examples.
    network: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Known:
    """What the service knows of the catalog and of each of the part's users at the moment
    of their targets, learnt from the early part of every history (each user's first
    1 - holdout_share): the factors and dense features (rows by the part's users), the
    neighbours and each item's positives (the popular source's order). A build that trains
    on a sample of users learns them from every user's early part, so the lists are pooled
    and featured as the served world's will be."""

    embeddings: Embeddings
    user_dense: FloatArray
    item_dense: FloatArray
    neighbours: Neighbours
    popularity: FloatArray
    order: OrderModel | None = None


@dataclass(frozen=True, slots=True)
class _Lists:
    """The two halves' candidate lists, and their packed rows."""

    listed: RankedLists  # the blending users': pre-rank and the blend learn on these
    taught: RankedLists  # the learning users': the network learns on these
    listed_rows: FloatArray
    taught_rows: FloatArray
    prerank: PrerankWeights
    liked: BoolArray  # the part's rows the network is taught to find


def early_part(part: InteractionLog, training: ListTraining) -> InteractionLog:
    """Each history's early rows, as the ranker's lists split the part: what `known` must be
    learnt from (learnt from more, it would have seen the targets)."""
    return part.subset(_split(part, training).train)


def _split(part: InteractionLog, training: ListTraining) -> HoldoutSplit:
    return split_holdout(part, training.holdout_share, seed=training.seed)


def _candidate_lists(
    part: InteractionLog, schema: FeatureSchema, training: ListTraining, known: Known
) -> _Lists:
    """Each user's pool rebuilt from their past, cut by pre-rank to the rows the model scores."""
    if known.user_dense.shape[0] != part.n_users or known.item_dense.shape[0] != part.n_items:
        raise ValueError(
            f"what the lists know covers {known.user_dense.shape[0]} users and "
            f"{known.item_dense.shape[0]} items, the part {part.n_users} and {part.n_items}"
        )
    split = _split(part, training)
    early = part.subset(split.train)
    embeddings = known.embeddings
    user_blobs = np.concatenate([embeddings.users, known.user_dense], axis=1)
    item_blobs = np.concatenate([embeddings.items, known.item_dense], axis=1)
    # Items the user already had before are filtered as seen when serving: not targets.
    before = np.unique(early.user * part.n_items + early.item)
    targets = ~split.train & ~np.isin(part.user * part.n_items + part.item, before)
    liked = targets & part.positive
    liked_keys = np.unique(part.user[liked] * part.n_items + part.item[liked])
    rng = np.random.default_rng(training.seed)
    blending, learning = _user_halves(part, liked, rng)
    # What the service knows of each user at the moment of their targets: their latest
    # positives before it, and the neighbours learnt from the early part.
    neighbours, recent = known.neighbours, latest_positives(early)
    categories = category_codes(part.items)
    first_target = np.full(part.n_users, part.time.max(), dtype=np.int64)
    np.minimum.at(first_target, part.user[targets], part.time[targets])

    # The service's candidate stages over the world learnt from the early part: its
    # popular items are the early part's (pre-rank's weights do not shape the pools).
    early_popular = np.argsort(-known.popularity, kind="stable").astype(np.int64)
    stages = ServiceStages(
        schema,
        None,
        embeddings.items.astype(np.float32),
        early_popular,
        categories,
        neighbours,
        PrerankWeights(),
    )

    def pools_of(users: IntArray) -> Pools:
        return user_pools(
            users,
            embeddings.users,
            embeddings.items,
            stages,
            neighbours,
            recent,
            before,
            liked_keys,
            categories,
            known.order,
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
    return _Lists(listed, taught, rows_of(listed), rows_of(taught), prerank, liked)


def train_list_ranker(
    part: InteractionLog, schema: FeatureSchema, training: ListTraining, known: Known
) -> ListRanker:
    """The network learnt on the learning users' lists, blended on the blending users'; the
    lists are pooled and featured from `known`, what the early rows of every history taught
    (the part's own split: split_holdout with the training's share and seed)."""
    lists = _candidate_lists(part, schema, training, known)
    listed = lists.listed
    model = fit_ranker(
        lists.taught_rows,
        lists.taught.labels,
        training.seed,
        _liked(part, lists.liked, lists.taught),
        training.network,
        check=(lists.listed_rows, listed.labels),
        ignored=factor_free(schema, ignored_columns(schema, training.without, part)),
    )
    listed_sequence = sequence_columns(schema, listed.signals) if schema.sequence else None
    recall, network = recall_scores(schema, lists.listed_rows), model.scores(lists.listed_rows)
    blend = choose_blend(
        schema,
        lists.prerank,
        (listed.users, listed.labels),
        recall,
        network,
        listed_sequence,
        ignored_signals(schema, training.without, part),
    )
    return ListRanker(
        blended_onnx(export_onnx(model, schema), schema, blend),
        len(lists.taught.labels),
        int(lists.taught.labels.sum()),
        blend,
        lists.prerank,
        holdout_rows=lists.listed_rows,
        holdout_labels=listed.labels,
        holdout_users=part.user_ids[listed.users].astype(np.str_),
        holdout_items=part.items.ids[listed.items].astype(np.str_),
        network=_network_report(model, lists, _liked(part, lists.liked, listed)),
    )


def _network_report(
    model: RankerNet, lists: _Lists, rated: npt.NDArray[np.int8] | None
) -> dict[str, Any]:
    return {
        "kind": model.shape.kind,
        "cross_layers": model.shape.cross_layers,
        "deep": list(model.shape.deep),
        "like_weight": model.shape.like_weight,
        "flops_per_row": model.flops_per_row,
        "epochs": model.epochs_run,
        "learnt_on": "candidate lists as served",
        "list_depth": RANK_DEPTH,
        # Each shape's AUC on the blending users' lists (none learnt from them), where two
        # were trained: the kept one is the best.
        "considered": model.considered,
        "auc_heads": head_aucs(model, lists.listed_rows, lists.listed.labels, rated),
    }


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


def factor_free(
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
