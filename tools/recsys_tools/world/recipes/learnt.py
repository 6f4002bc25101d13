"""Everything a build learns from one part of the log, the steps written once for both
engines (each runs them through its PartOps), and the served tables made from it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from app.world.foldin import FoldInParams
from app.world.neighbours import Neighbours
from app.world.order import OrderModel
from app.world.schema import FeatureSchema
from app.world.tables import HeldOut, ItemTable, UserTable
from recsys_tools.world.judge.evaluate import ServedModel
from recsys_tools.world.learn.derive import (
    ItemFacts,
    ItemTallies,
    Totals,
    UserFacts,
    UserTallies,
    category_codes,
    item_attributes,
    item_dense_from,
    published_from,
    user_dense_from,
)
from recsys_tools.world.learn.factorize import Embeddings
from recsys_tools.world.learn.item_prior import fit_item_prior, log_attributes
from recsys_tools.world.learn.neighbours import COSINE, NeighbourModel
from recsys_tools.world.learn.order import OrderReport
from recsys_tools.world.learn.ranker.from_log import Known, ListRanker, train_list_ranker
from recsys_tools.world.read.items import ItemInfo
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import IntArray, StrArray
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.store.world import WorldParts

log = logging.getLogger("recsys.build")
FloatArray = npt.NDArray[np.float32]
P = TypeVar("P", contravariant=True)


class PartOps(Protocol[P]):
    """The steps of learning that grow with the log, run where the engine runs them: in this
    process (recipes/from_log.py) or as Spark jobs (recipes/on_spark.py). `P` is the
    engine's part of the log."""

    def catalog(self, part: P) -> ItemInfo:
        """The items the part's positions index."""
        ...

    def tallies(self, part: P) -> tuple[UserTallies, ItemTallies, Totals]:
        """Per user and per item counts and times, and the part's totals."""
        ...

    def factors(
        self, part: P, dim: int, seed: int, regularization: float
    ) -> tuple[Embeddings, FoldInParams]:
        """ALS's factors on BM25 confidences, and what the service folds a user in with."""
        ...

    def neighbours(self, part: P, model: NeighbourModel) -> Neighbours:
        """Each item's neighbours by the users who liked both, scored by `model`."""
        ...

    def order(self, part: P, seed: int) -> tuple[OrderModel, OrderReport]:
        """The order model learnt from the part's positives in time order (learn/order.py),
        and how its training went."""
        ...


@dataclass(frozen=True, slots=True)
class Taught:
    """What one part of the log teaches before any ranker, in catalog and user-vocabulary
    order: the factors and the fold-in's parameters, the dense features, each item's
    positives, publication time and category, the neighbours, and which users are served.
    `page_neighbours` is the item page's own list (cosine's, where the recipe scores the
    feed's by EASE, in a part that may be served); None: the page reads `neighbours`."""

    embeddings: Embeddings
    user_dense: FloatArray
    item_dense: FloatArray
    popularity: FloatArray
    neighbours: Neighbours
    published: IntArray
    foldin: FoldInParams
    categories: IntArray  # each item's category code, as the catalog holds it
    served_users: IntArray  # the users with a positive: the served world's users
    positives: int
    page_neighbours: Neighbours | None = None
    order: OrderModel | None = None  # where the schema declares the order signal
    order_fit: OrderReport | None = None  # how its training went

    def tables(self, catalog: ItemInfo, user_ids: StrArray) -> tuple[ItemTable, UserTable]:
        """The served world's item and user tables (`user_ids` by the part's user index)."""
        items = ItemTable(
            ids=catalog.ids,
            embeddings=self.embeddings.items,
            dense=self.item_dense,
            categories=self.categories,
            published_at=self.published,
            popularity=self.popularity,
        )
        served = self.served_users
        users = UserTable(user_ids[served], self.embeddings.users[served], self.user_dense[served])
        return items, users


def learn_part(
    ops: PartOps[P],
    part: P,
    schema: FeatureSchema,
    recipe: WorldRecipe,
    clock: Clock,
    label: str,
    *,
    serves: bool,
) -> Taught:
    """Everything but the ranker, learnt from `part` by either engine: the steps once.
    `serves`: the world may be made of this part, so its item pages need their list."""
    with clock.step(f"{label}.features"):
        users, items, all_totals = ops.tallies(part)
        catalog = ops.catalog(part)
        item_dense = item_dense_from(ItemFacts(items, catalog, all_totals), schema)
        user_dense = user_dense_from(UserFacts(users, all_totals), schema)
    log.info("%s: tallies and dense features %s", label, clock.took(f"{label}.features"))
    with clock.step(f"{label}.embeddings"):
        embeddings, foldin = ops.factors(
            part, schema.embedding_dim, recipe.seed, recipe.als_regularization
        )
    log.info(
        "%s: embeddings (dim %d) from %s positives %s",
        label,
        schema.embedding_dim,
        f"{all_totals.total_positives:,}",
        clock.took(f"{label}.embeddings"),
    )
    with clock.step(f"{label}.neighbours"):
        neighbours = ops.neighbours(part, recipe.neighbours)
    log.info(
        "%s: %d neighbours of %s items %s",
        label,
        neighbours.k,
        f"{int((neighbours.positions[:, 0] >= 0).sum()):,}",
        clock.took(f"{label}.neighbours"),
    )
    page_neighbours = None
    if serves and recipe.neighbours.kind != COSINE.kind:
        # EASE's lists served the feed better and the item page worse than cosine's
        # (docs/benchmarks.md, item pages): a world keeps each model where it served best.
        with clock.step(f"{label}.page_neighbours"):
            page_neighbours = ops.neighbours(part, COSINE)
        log.info(
            "%s: the item page's cosine neighbours %s",
            label,
            clock.took(f"{label}.page_neighbours"),
        )
    order, order_fit = None, None
    if "order" in schema.sequence:
        with clock.step(f"{label}.order"):
            order, order_fit = ops.order(part, recipe.seed)
        log.info(
            "%s: the order model %s: %s", label, clock.took(f"{label}.order"), order_fit.as_dict()
        )
    return Taught(
        embeddings=embeddings,
        user_dense=user_dense,
        item_dense=item_dense,
        popularity=items.positives.astype(np.float32),
        neighbours=neighbours,
        published=published_from(items, catalog, all_totals),
        foldin=foldin,
        categories=category_codes(catalog),
        served_users=np.flatnonzero(users.positives > 0).astype(np.int64),
        positives=all_totals.total_positives,
        page_neighbours=page_neighbours,
        order=order,
        order_fit=order_fit,
    )


def known_of(early: Taught, users: IntArray | None = None) -> Known:
    """What a part's early rows taught, as the ranker's lists see it: rows of `users` (their
    indexes in the part taught, in the lists' user order), every user where None."""
    embeddings, user_dense = early.embeddings, early.user_dense
    if users is not None:
        embeddings = Embeddings(embeddings.users[users], embeddings.items)
        user_dense = user_dense[users]
    return Known(
        embeddings,
        user_dense,
        early.item_dense,
        early.neighbours,
        early.popularity,
        early.order,
    )


@dataclass(frozen=True, slots=True)
class TrainLessons:
    """What the train part taught, and what the ranker's lists know (its early part's
    lessons), learnt once a build: regularize fixes the regularisation before the first
    learning, and an input compared changes only what the ranker reads. `learnt_for` is
    what of the recipe they were learnt with."""

    learnt_for: tuple[int, float, float, NeighbourModel, bool]
    taught: Taught
    known: Known

    def asked_by(self, recipe: WorldRecipe) -> TrainLessons:
        """These lessons, for a recipe that would learn the same ones."""
        if lessons_key(recipe) != self.learnt_for:
            raise ValueError(
                f"the train part was learnt with (seed, regularisation, holdout share, "
                "neighbours, keep holdout) "
                f"{self.learnt_for}, asked again with {lessons_key(recipe)}"
            )
        return self


def lessons_key(recipe: WorldRecipe) -> tuple[int, float, float, NeighbourModel, bool]:
    """What learn_part and the early split read of a recipe (keep_holdout: whether the train
    part is served, and so needs the page's list)."""
    return (
        recipe.seed,
        recipe.als_regularization,
        recipe.holdout_share,
        recipe.neighbours,
        recipe.keep_holdout,
    )


@dataclass(frozen=True, slots=True)
class Learnt:
    """Everything learnt from one part of the log: what it taught, and the ranker."""

    taught: Taught
    ranker: ListRanker

    def blobs(self) -> tuple[FloatArray, FloatArray]:
        taught = self.taught
        users = np.concatenate([taught.embeddings.users, taught.user_dense], axis=1)
        items = np.concatenate([taught.embeddings.items, taught.item_dense], axis=1)
        return users.astype(np.float32), items.astype(np.float32)

    def served(self) -> ServedModel:
        users, items = self.blobs()
        taught = self.taught
        return ServedModel(
            users,
            items,
            taught.popularity,
            self.ranker.onnx_model,
            taught.neighbours,
            self.ranker.prerank,
            taught.categories,
            taught.order,
        )


def learn_ranker(
    sample: InteractionLog,
    schema: FeatureSchema,
    recipe: WorldRecipe,
    clock: Clock,
    label: str,
    known: Known,
) -> ListRanker:
    """The ranker learnt on `sample`'s lists, pooled and featured from `known` (known_of
    the early rows of every history)."""
    with clock.step(f"{label}.ranker"):
        ranker = train_list_ranker(sample, schema, recipe.training(), known)
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
    return ranker


def world_parts(
    schema: FeatureSchema, learnt: Learnt, catalog: ItemInfo, user_ids: StrArray, seed: int
) -> WorldParts:
    """What either engine hands write_world; the one thing learnt here is the item prior (a
    new item's vector from its attributes), fitted on the served items' vectors."""
    items, users = learnt.taught.tables(catalog, user_ids)
    items.check(schema)  # before the prior learns from them: a table's fault named as such
    users.check(schema)
    prior, report = fit_item_prior(log_attributes(catalog, items.dense), items.embeddings, seed)
    ranker = learnt.ranker
    return WorldParts(
        items,
        users,
        item_attributes(catalog),
        learnt.taught.foldin,
        learnt.taught.neighbours,
        learnt.taught.page_neighbours,
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
        learnt.taught.order,
    )
