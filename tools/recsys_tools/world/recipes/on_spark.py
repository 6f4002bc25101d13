"""build-world --engine spark: the same world as build_world_from_log, its heavy steps as
Spark jobs.

What grows with the log runs on the cluster: reading, the split in time, the tallies the dense
features come from, the seen lists and positives (streamed to their files), the neighbours
and the ALS factors. What the driver holds grows with the catalog and the users, not the
interactions: the vocabularies, the factors and features, and one sample of users, all of
whose rows it gathers to train the ranker and the blend and to judge the world on. The files
are the local engine's, written by the same functions and stamped the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from app.core.errors import ConfigError
from app.world.foldin import FoldInParams
from app.world.layout import POSITIVES_FILE, SEEN_FILE
from app.world.neighbours import Neighbours
from app.world.order import OrderModel
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.evaluate import ServedModel, evaluate
from recsys_tools.world.judge.holdout import HoldoutSplit, split_holdout
from recsys_tools.world.learn.derive import ItemTallies, Totals, UserTallies
from recsys_tools.world.learn.factorize import Embeddings
from recsys_tools.world.learn.neighbours import NeighbourModel
from recsys_tools.world.learn.order import OrderReport
from recsys_tools.world.read.items import ItemInfo, read_items
from recsys_tools.world.read.log import InteractionLog, require_times
from recsys_tools.world.read.tables import FLAGS, StrArray
from recsys_tools.world.recipes.build import EngineFacts, Judged, build_world
from recsys_tools.world.recipes.learnt import (
    Learnt,
    Taught,
    TrainLessons,
    known_of,
    learn_part,
    learn_ranker,
    lessons_key,
    world_parts,
)
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.spark.factors import factorize_on_spark
from recsys_tools.world.spark.neighbours import neighbours_on_spark
from recsys_tools.world.spark.read import TIMED_ONLY, SparkLog, read_spark_log, user_ids
from recsys_tools.world.spark.sample import gather, sampled_users
from recsys_tools.world.spark.session import SparkSettings, spark_session
from recsys_tools.world.spark.tables import (
    Part,
    bm25_confidence,
    foldin_params,
    idf,
    item_tallies,
    positive_counts,
    totals,
    user_tallies,
    with_later,
    write_positives,
    write_seen,
)
from recsys_tools.world.store.world import write_world

log = logging.getLogger("recsys.build")


class SparkOps:
    """Learning's heavy steps as Spark jobs over a part of the log on the cluster."""

    def catalog(self, part: Part) -> ItemInfo:
        return part.log.items

    def tallies(self, part: Part) -> tuple[UserTallies, ItemTallies, Totals]:
        items, users = item_tallies(part), user_tallies(part)
        return users, items, totals(part, users, items)

    def factors(
        self, part: Part, dim: int, seed: int, regularization: float
    ) -> tuple[Embeddings, FoldInParams]:
        counts = positive_counts(part).cache()
        weights = idf(part, counts)
        params = foldin_params(part, counts, weights, regularization)
        confidence = bm25_confidence(part, counts, weights, params.average_length)
        embeddings = factorize_on_spark(
            confidence, part.log.n_users, part.log.n_items, dim, seed, regularization
        )
        counts.unpersist()
        return embeddings, params

    def neighbours(self, part: Part, model: NeighbourModel) -> Neighbours:
        return neighbours_on_spark(part, model=model)

    def order(self, part: Part, seed: int) -> tuple[OrderModel, OrderReport]:
        raise ConfigError(
            "the order model is learnt on the local engine only (--engine local), or build "
            "with a schema that leaves out the order signal"
        )


def _served_model(learnt: Learnt, sample_users: np.ndarray) -> ServedModel:
    """What the service would hold for the sampled users: the evaluation asks only of them."""
    served = learnt.served()
    return replace(served, user_blobs=served.user_blobs[sample_users])


@dataclass(frozen=True, slots=True)
class _Sample:
    log: InteractionLog  # every row of the sampled users
    users: np.ndarray  # their indexes in the whole log
    holdout: HoldoutSplit


def _sample(whole: SparkLog, recipe: WorldRecipe, settings: SparkSettings, clock: Clock) -> _Sample:
    with clock.step("sample"):
        chosen = sampled_users(whole, settings.sample_rows, recipe.seed)
        gathered, indexes = gather(whole, whole.rows, chosen)
        holdout = split_holdout(gathered, recipe.holdout_share, seed=recipe.seed)
    log.info(
        "gathered %s rows of %s users on the driver (--spark-sample-rows %s) %s",
        f"{len(gathered.user):,}",
        f"{gathered.n_users:,}",
        f"{settings.sample_rows:,}",
        clock.took("sample"),
    )
    if len(holdout.users) == 0:
        raise ConfigError(
            f"{whole.source}: no sampled user has two positives (on different items), so nothing "
            f"can be held out or learnt to rank; lower {FLAGS['min_weight']}, bring a longer "
            "log or raise --spark-sample-rows"
        )
    return _Sample(gathered, indexes, holdout)


def build_world_on_spark(
    recipe: WorldRecipe, log_uri: str, world: Path, schema: FeatureSchema, settings: SparkSettings
) -> dict[str, Any]:
    """build_world on Spark; returns the report also written to report.json.

    `log_uri` is any path Spark reads (a file or a folder of parts; file:, hdfs:, s3a:);
    the item table is read by the driver, from its own disk."""
    return build_world(recipe, world, schema, SparkEngine(log_uri, settings))


class SparkEngine:
    """Reads and learns from the log as Spark jobs; the ranker and the judging on a sample
    of users gathered on the driver."""

    def __init__(self, log_uri: str, settings: SparkSettings) -> None:
        self._uri, self._settings = log_uri, settings

    @contextmanager
    def opened(
        self, recipe: WorldRecipe, schema: FeatureSchema, clock: Clock
    ) -> Iterator[SparkRead]:
        require_times(recipe.columns.time is not None, self._uri, TIMED_ONLY)
        catalog = None if recipe.items is None else read_items(recipe.items, recipe.item_columns)
        with spark_session(self._settings) as spark:
            with clock.step("read"):
                whole_log = read_spark_log(spark, self._uri, recipe.columns, catalog)
                ids = user_ids(whole_log)
            log.info(
                "read %s interactions from %s: %s users, %s items %s",
                f"{whole_log.counts.rows_read:,}",
                whole_log.source,
                f"{whole_log.n_users:,}",
                f"{whole_log.n_items:,}",
                clock.took("read"),
            )
            sample = _sample(whole_log, recipe, self._settings, clock)
            with clock.step("holdout"):
                marked = with_later(whole_log.rows, recipe.holdout_share)
                train = Part(whole_log, marked.filter("not later").drop("later").cache())
            yield SparkRead(whole_log, ids, sample, train, schema, recipe, clock, self._settings)


class SparkRead:
    """The log on the cluster, its train part, and the sample judged on the driver."""

    def __init__(
        self,
        whole_log: SparkLog,
        ids: StrArray,
        sample: _Sample,
        train: Part,
        schema: FeatureSchema,
        recipe: WorldRecipe,
        clock: Clock,
        settings: SparkSettings,
    ) -> None:
        self._whole_log, self._ids, self._sample, self._train = whole_log, ids, sample, train
        self._schema, self._clock, self._settings = schema, clock, settings
        # What the evaluation needs of the recipe, the same through the build.
        self._index_factory, self._seed = recipe.index_factory, recipe.seed
        self._sample_train = sample.log.subset(sample.holdout.train)
        self._lessons: TrainLessons | None = None

    @property
    def judged_on(self) -> InteractionLog:
        return self._sample_train

    def _learnt_on_train(self, recipe: WorldRecipe) -> TrainLessons:
        """Learnt from the train part once: each input compared trains only the ranker again."""
        if self._lessons is None:
            train, schema, clock = self._train, self._schema, self._clock
            taught = learn_part(
                SparkOps(), train, schema, recipe, clock, "train", serves=recipe.keep_holdout
            )
            # The ranker's lists are pooled and featured from every user's early part of the
            # train part, as the served world is from every user's rows, not from the
            # sample's alone (its counts a fraction of the log's, its factors from a
            # fraction of the users). Only the sampled users' rows are kept of it: the
            # lists are the sample's, and the driver holds them.
            early_rows = with_later(train.rows, recipe.holdout_share).filter("not later")
            early = Part(train.log, early_rows.drop("later"))
            early_taught = learn_part(
                SparkOps(), early, schema, recipe, clock, "early", serves=False
            )
            known = known_of(early_taught, self._sample.users)
            self._lessons = TrainLessons(lessons_key(recipe), taught, known)
        return self._lessons.asked_by(recipe)

    def learn_first(self, recipe: WorldRecipe) -> Learnt:
        return self._with_ranker(recipe, "train")

    def learn_again(self, recipe: WorldRecipe) -> Learnt:
        return self._with_ranker(recipe, "compare")

    def _with_ranker(self, recipe: WorldRecipe, label: str) -> Learnt:
        lessons = self._learnt_on_train(recipe)
        sample = self._sample_train
        ranker = learn_ranker(sample, self._schema, recipe, self._clock, label, lessons.known)
        return Learnt(lessons.taught, ranker)

    def judge(self, learnt: Learnt) -> dict[str, Any]:
        served = _served_model(learnt, self._sample.users)
        holdout = self._sample.holdout
        return evaluate(
            self._sample_train, holdout, served, self._schema, self._index_factory, self._seed
        )

    def served(self, recipe: WorldRecipe, judged: Judged) -> SparkServed:
        if recipe.keep_holdout:
            return SparkServed(self, self._train, judged.weighed.learnt)
        whole_log = self._whole_log
        part = Part(whole_log, whole_log.rows)
        taught_all = learn_part(
            SparkOps(), part, self._schema, recipe, self._clock, "all", serves=True
        )
        # Each sampled user's early part of all their rows is the train part: the lists are
        # featured from what the train part taught.
        taught_train = self._learnt_on_train(recipe).taught
        known = known_of(taught_train, self._sample.users)
        ranker = learn_ranker(self._sample.log, self._schema, recipe, self._clock, "all", known)
        return SparkServed(self, part, Learnt(taught_all, ranker))

    def write(self, world: Path, recipe: WorldRecipe, part: Part, learnt: Learnt) -> EngineFacts:
        ids = self._ids
        parts = world_parts(self._schema, learnt, part.log.items, ids, recipe.seed)

        def lists(world: Path) -> tuple[int, int]:
            # Streamed from the cluster into their files, never whole on the driver.
            seen = write_seen(part, world / SEEN_FILE, ids)
            write_positives(part, world / POSITIVES_FILE, ids)
            return seen

        written = write_world(world, self._schema, parts, recipe.index_factory, lists)
        seen_users, longest = written.listed
        return self._reported(learnt.taught, seen_users, longest, written.manifest)

    def _reported(
        self, taught: Taught, seen_users: int, longest: int, manifest: dict[str, Any]
    ) -> EngineFacts:
        whole_log, sample, settings = self._whole_log, self._sample, self._settings
        counted = whole_log.counts
        engine = {
            "name": "spark",
            "master": settings.master,
            "sample_rows": settings.sample_rows,
            "sampled_users": sample.log.n_users,
            "sampled_rows": len(sample.log.user),
        }
        counts = {
            "rows_read": counted.rows_read,
            "interactions": whole_log.rows_count,
            "positives": whole_log.positives,
            "below_min_weight": counted.below_min_weight,
            "dropped": dict(counted.dropped),
            "users": len(taught.served_users),
            "items": whole_log.n_items,
            "items_without_interactions": whole_log.items_without_interactions,
            "items_without_positives": whole_log.items_without_positives,
            "categories": len(whole_log.items.category_names),
            "served_positives": taught.positives,
        }
        histories = {"users": seen_users, "longest": longest}
        return EngineFacts(engine, whole_log.uri, counts, histories, manifest)


@dataclass(frozen=True, slots=True)
class SparkServed:
    read: SparkRead
    part: Part  # the rows served, on the cluster
    learnt: Learnt  # from them, with the ranker the world ships

    def write(self, world: Path, recipe: WorldRecipe) -> EngineFacts:
        return self.read.write(world, recipe, self.part, self.learnt)
