"""Everything a build learns from one part of the log, and the served tables made from it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.world.foldin import FoldInParams
from app.world.neighbours import Neighbours
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.evaluate import ServedModel
from recsys_tools.world.learn.derive import (
    category_codes,
    item_attributes,
    item_dense,
    popularity,
    published_at,
    user_dense,
)
from recsys_tools.world.learn.factorize import Embeddings, factorize
from recsys_tools.world.learn.item_prior import fit_item_prior, log_attributes
from recsys_tools.world.learn.neighbours import positive_neighbours
from recsys_tools.world.learn.ranker.from_log import ListRanker, train_list_ranker
from recsys_tools.world.read.items import ItemInfo
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import IntArray
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.store.files import (
    HeldOut,
    ItemTable,
    PositiveLists,
    SeenLists,
    UserTable,
)
from recsys_tools.world.store.world import WorldParts

log = logging.getLogger("recsys.build")
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Learnt:
    """Everything learnt from one part of the log, in catalog and user-vocabulary order."""

    embeddings: Embeddings
    user_dense: FloatArray
    item_dense: FloatArray
    popularity: FloatArray
    neighbours: Neighbours
    ranker: ListRanker
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


def learn(
    part: InteractionLog, schema: FeatureSchema, recipe: WorldRecipe, clock: Clock, label: str
) -> Learnt:
    positives = int(part.positive.sum())
    with clock.step(f"{label}.embeddings"):
        embeddings = factorize(part, schema.embedding_dim, recipe.seed, recipe.als_regularization)
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
        ranker = train_list_ranker(part, schema, recipe.training())
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
    return Learnt(embeddings, users, items, counts, neighbours, ranker, category_codes(part.items))


def seen_lists(part: InteractionLog) -> SeenLists:
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


def positive_lists(part: InteractionLog) -> PositiveLists:
    """Each user's positives, oldest first, repeats kept (the consumer's fold-in input)."""
    rows = np.flatnonzero(part.positive)
    rows = rows[np.lexsort((part.time[rows], part.user[rows]))]
    users, counts = np.unique(part.user[rows], return_counts=True)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return PositiveLists(part.user_ids[users], offsets, part.items.ids[part.item[rows]])


def served_tables(part: InteractionLog, learnt: Learnt) -> tuple[ItemTable, UserTable, SeenLists]:
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
    return items, users, seen_lists(part)


def world_parts(
    schema: FeatureSchema,
    tables: tuple[ItemTable, UserTable],
    catalog: ItemInfo,
    foldin: FoldInParams,
    neighbours: Neighbours,
    ranker: ListRanker,
    seed: int,
) -> WorldParts:
    """What either engine hands write_world; the one thing learnt here is the item prior (a
    new item's vector from its attributes), fitted on the served items' vectors."""
    items, users = tables
    items.check(schema)  # before the prior learns from them: a table's fault named as such
    users.check(schema)
    prior, report = fit_item_prior(log_attributes(catalog, items.dense), items.embeddings, seed)
    return WorldParts(
        items,
        users,
        item_attributes(catalog),
        foldin,
        neighbours,
        prior,
        report.as_dict(),
        ranker.prerank,
        ranker.onnx_model,
        HeldOut(
            ranker.holdout_rows,
            ranker.holdout_labels,
            ranker.holdout_users,
            ranker.holdout_items,
        ),
    )
