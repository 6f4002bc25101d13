"""The local engine: the whole log in this process's memory.

Everything is learnt first without each user's latest positives and evaluated on them; then,
unless the holdout is kept out, learnt again on every interaction for the world that serves.
The step order is recipes/build.py's; the steps' local forms are here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.core.errors import ConfigError
from app.world.foldin import FoldInParams
from app.world.neighbours import Neighbours
from app.world.order import OrderModel
from app.world.schema import FeatureSchema
from app.world.tables import PositiveLists, SeenLists, save_table
from recsys_tools.world.judge.evaluate import evaluate
from recsys_tools.world.judge.holdout import HoldoutSplit, split_holdout
from recsys_tools.world.learn import derive
from recsys_tools.world.learn.derive import ItemTallies, Totals, UserTallies
from recsys_tools.world.learn.factorize import Embeddings, factorize, foldin_params
from recsys_tools.world.learn.neighbours import (
    NeighbourModel,
    check_ease_memory,
    positive_neighbours,
)
from recsys_tools.world.learn.order import OrderReport, fit_order
from recsys_tools.world.learn.ranker.from_log import early_part
from recsys_tools.world.read.items import ItemInfo, read_items
from recsys_tools.world.read.log import InteractionLog, read_log
from recsys_tools.world.read.tables import FLAGS
from recsys_tools.world.recipes.build import EngineFacts, Judged, build_world
from recsys_tools.world.recipes.capacity import memory_limit
from recsys_tools.world.recipes.learnt import (
    Learnt,
    TrainLessons,
    known_of,
    learn_part,
    learn_ranker,
    lessons_key,
    world_parts,
)
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.recipes.report import counts, histories
from recsys_tools.world.store.world import write_world

log = logging.getLogger("recsys.build")


def build_world_from_log(recipe: WorldRecipe, world: Path, schema: FeatureSchema) -> dict[str, Any]:
    """build_world on the local engine; returns the report also written to report.json."""
    return build_world(recipe, world, schema, LocalEngine())


class LocalOps:
    """Learning's heavy steps over a log held in this process's memory."""

    def catalog(self, part: InteractionLog) -> ItemInfo:
        return part.items

    def tallies(self, part: InteractionLog) -> tuple[UserTallies, ItemTallies, Totals]:
        return derive.user_tallies(part), derive.item_tallies(part), derive.totals(part)

    def factors(
        self, part: InteractionLog, dim: int, seed: int, regularization: float
    ) -> tuple[Embeddings, FoldInParams]:
        return factorize(part, dim, seed, regularization), foldin_params(part, regularization)

    def neighbours(self, part: InteractionLog, model: NeighbourModel) -> Neighbours:
        return positive_neighbours(part, model)

    def order(self, part: InteractionLog, seed: int) -> tuple[OrderModel, OrderReport]:
        return fit_order(part, seed)


class LocalEngine:
    """Reads the whole log into memory and learns from it in this process."""

    @contextmanager
    def opened(
        self, recipe: WorldRecipe, schema: FeatureSchema, clock: Clock
    ) -> Iterator[LocalLog]:
        whole = _read(recipe, clock)
        if recipe.neighbours.kind == "ease":
            # Refused before any learning: every part's items with positives are the log's
            # at most.
            items = len(np.unique(whole.item[whole.positive]))
            check_ease_memory(items, recipe.neighbours, memory_limit())
        yield LocalLog(whole, _hold_out(whole, recipe, clock), schema, recipe, clock)


class LocalLog:
    """The log held out in time: the train part is learnt and judged on."""

    def __init__(
        self,
        whole: InteractionLog,
        holdout: HoldoutSplit,
        schema: FeatureSchema,
        recipe: WorldRecipe,
        clock: Clock,
    ) -> None:
        self._whole, self._holdout = whole, holdout
        self._schema, self._clock = schema, clock
        # What the evaluation needs of the recipe, the same through the build.
        self._index_factory, self._seed = recipe.index_factory, recipe.seed
        self._train = whole.subset(holdout.train)
        self._lessons: TrainLessons | None = None

    @property
    def judged_on(self) -> InteractionLog:
        return self._train

    def learn_first(self, recipe: WorldRecipe) -> Learnt:
        return self._with_ranker(recipe, "train")

    def learn_again(self, recipe: WorldRecipe) -> Learnt:
        return self._with_ranker(recipe, "compare")

    def _with_ranker(self, recipe: WorldRecipe, label: str) -> Learnt:
        lessons = self._learnt_on_train(recipe)
        ranker = learn_ranker(self._train, self._schema, recipe, self._clock, label, lessons.known)
        return Learnt(lessons.taught, ranker)

    def _learnt_on_train(self, recipe: WorldRecipe) -> TrainLessons:
        """Learnt from the train part once: each input compared trains only the ranker again."""
        if self._lessons is None:
            train, schema, clock = self._train, self._schema, self._clock
            taught = learn_part(
                LocalOps(), train, schema, recipe, clock, "train", serves=recipe.keep_holdout
            )
            early = early_part(train, recipe.training())
            early_taught = learn_part(
                LocalOps(), early, schema, recipe, clock, "early", serves=False
            )
            self._lessons = TrainLessons(lessons_key(recipe), taught, known_of(early_taught))
        return self._lessons.asked_by(recipe)

    def judge(self, learnt: Learnt) -> dict[str, Any]:
        served = learnt.served()
        return evaluate(
            self._train, self._holdout, served, self._schema, self._index_factory, self._seed
        )

    def served(self, recipe: WorldRecipe, judged: Judged) -> LocalServed:
        if recipe.keep_holdout:
            return LocalServed(self._whole, self._train, judged.weighed.learnt, self._schema)
        whole, schema, clock = self._whole, self._schema, self._clock
        taught = learn_part(LocalOps(), whole, schema, recipe, clock, "all", serves=True)
        # The whole log's early part, by the same split, is the train part: the lists are
        # pooled and featured from what it taught.
        train_taught = self._learnt_on_train(recipe).taught
        ranker = learn_ranker(whole, schema, recipe, clock, "all", known_of(train_taught))
        return LocalServed(whole, whole, Learnt(taught, ranker), schema)


@dataclass(frozen=True, slots=True)
class LocalServed:
    whole: InteractionLog
    part: InteractionLog  # the rows the served world was learnt from
    learnt: Learnt
    schema: FeatureSchema

    def write(self, world: Path, recipe: WorldRecipe) -> EngineFacts:
        """The world's files, from the served part's tables."""
        part = self.part
        parts = world_parts(self.schema, self.learnt, part.items, part.user_ids, recipe.seed)
        seen = seen_lists(part)

        def lists(world: Path) -> None:
            save_table(world, seen)
            save_table(world, positive_lists(part))

        written = write_world(world, self.schema, parts, recipe.index_factory, lists)
        return EngineFacts(
            {"name": "local"},
            str(recipe.interactions),
            counts(self.whole, part, len(self.learnt.taught.served_users)),
            histories(seen),
            written.manifest,
        )


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


def _read(recipe: WorldRecipe, clock: Clock) -> InteractionLog:
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


def _hold_out(whole: InteractionLog, recipe: WorldRecipe, clock: Clock) -> HoldoutSplit:
    with clock.step("holdout"):
        holdout = split_holdout(whole, recipe.holdout_share, seed=recipe.seed)
    if len(holdout.users) == 0:
        raise ConfigError(
            f"{whole.source}: no user has two positives (on different items), so nothing can "
            f"be held out or learnt to rank; lower {FLAGS['min_weight']} or bring a longer log"
        )
    log.info(
        "held out %s %d%% of %s users' positives %s",
        "the latest" if whole.timed else f"a random (seed {recipe.seed})",
        round(100 * recipe.holdout_share),
        f"{len(holdout.users):,}",
        clock.took("holdout"),
    )
    return holdout
