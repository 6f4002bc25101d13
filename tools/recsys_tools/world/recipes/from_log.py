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

from app.core.errors import ConfigError
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.evaluate import HoldoutSplit, evaluate, split_holdout
from recsys_tools.world.learn.factorize import foldin_params
from recsys_tools.world.read.items import read_items
from recsys_tools.world.read.log import InteractionLog, read_log
from recsys_tools.world.read.tables import FLAGS
from recsys_tools.world.recipes.build import EngineReport, Judged, build_world
from recsys_tools.world.recipes.learnt import (
    Learnt,
    learn,
    positive_lists,
    served_tables,
    world_parts,
)
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.recipes.report import counts, histories
from recsys_tools.world.store.files import save_table
from recsys_tools.world.store.world import write_world

log = logging.getLogger("recsys.build")


def build_world_from_log(recipe: WorldRecipe, world: Path, schema: FeatureSchema) -> dict[str, Any]:
    """build_world on the local engine; returns the report also written to report.json."""
    return build_world(recipe, world, schema, LocalEngine())


class LocalEngine:
    """Reads the whole log into memory and learns from it in this process."""

    @contextmanager
    def opened(
        self, recipe: WorldRecipe, schema: FeatureSchema, clock: Clock
    ) -> Iterator[LocalLog]:
        whole = _read(recipe, clock)
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

    @property
    def judged_on(self) -> InteractionLog:
        return self._train

    def learn_first(self, recipe: WorldRecipe) -> Learnt:
        return learn(self._train, self._schema, recipe, self._clock, "train")

    def learn_again(self, recipe: WorldRecipe) -> Learnt:
        return learn(self._train, self._schema, recipe, self._clock, "compare")

    def judge(self, learnt: Learnt) -> dict[str, Any]:
        served = learnt.served()
        return evaluate(
            self._train, self._holdout, served, self._schema, self._index_factory, self._seed
        )

    def served(self, recipe: WorldRecipe, judged: Judged) -> LocalServed:
        if recipe.keep_holdout:
            return LocalServed(self._whole, self._train, judged.weighed.learnt, self._schema)
        learnt = learn(self._whole, self._schema, recipe, self._clock, "all")
        return LocalServed(self._whole, self._whole, learnt, self._schema)


@dataclass(frozen=True, slots=True)
class LocalServed:
    whole: InteractionLog
    part: InteractionLog  # the rows the served world was learnt from
    learnt: Learnt
    schema: FeatureSchema

    def write(self, world: Path, recipe: WorldRecipe) -> EngineReport:
        """The world's files, from the served part's tables."""
        items, users, seen = served_tables(self.part, self.learnt)
        parts = world_parts(
            self.schema,
            (items, users),
            self.part.items,
            foldin_params(self.part, recipe.als_regularization),
            self.learnt.neighbours,
            self.learnt.ranker,
            recipe.seed,
        )
        part = self.part

        def lists(world: Path) -> None:
            save_table(world, seen)
            save_table(world, positive_lists(part))

        write_world(world, self.schema, parts, recipe.index_factory, lists)
        return EngineReport(
            {"name": "local"},
            str(recipe.interactions),
            counts(self.whole, self.part, len(users.ids)),
            histories(seen),
        )


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
