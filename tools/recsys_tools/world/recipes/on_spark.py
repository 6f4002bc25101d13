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
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.evaluate import HoldoutSplit, ServedModel, evaluate, split_holdout
from recsys_tools.world.learn.derive import (
    ItemFacts,
    UserFacts,
    category_codes,
    item_dense_from,
    published_from,
    user_dense_from,
)
from recsys_tools.world.learn.factorize import Embeddings
from recsys_tools.world.learn.ranker.from_log import Known, train_list_ranker
from recsys_tools.world.read.items import read_items
from recsys_tools.world.read.log import InteractionLog, require_times
from recsys_tools.world.read.tables import FLAGS, StrArray
from recsys_tools.world.recipes.build import EngineReport, Judged, build_world
from recsys_tools.world.recipes.learnt import Learnt, world_parts
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
from recsys_tools.world.store.files import ItemTable, UserTable
from recsys_tools.world.store.world import write_world

log = logging.getLogger("recsys.build")


@dataclass(frozen=True, slots=True)
class _Learnt:
    """What the cluster learnt from one part, before any ranker: factors, features, counts."""

    part: Part
    embeddings: Embeddings
    user_dense: np.ndarray
    item_dense: np.ndarray
    popularity: np.ndarray
    neighbours: Neighbours
    published: np.ndarray
    foldin: FoldInParams
    served_users: np.ndarray  # indexes of the users with positives
    positives: int

    def known_for(self, users: np.ndarray) -> Known:
        """What this part taught, as the ranker's lists see it for these users (their
        indexes in the whole log, in the sample's user order)."""
        embeddings = Embeddings(self.embeddings.users[users], self.embeddings.items)
        return Known(embeddings, self.user_dense[users], self.item_dense, self.neighbours)

    def with_ranker(
        self, sample: InteractionLog, schema: FeatureSchema, recipe: WorldRecipe, known: Known
    ) -> Learnt:
        ranker = train_list_ranker(sample, schema, recipe.training(), known)
        return Learnt(
            self.embeddings,
            self.user_dense,
            self.item_dense,
            self.popularity,
            self.neighbours,
            ranker,
            category_codes(self.part.log.items),
        )


def _learn(
    part: Part, schema: FeatureSchema, recipe: WorldRecipe, clock: Clock, label: str
) -> _Learnt:
    with clock.step(f"{label}.features"):
        items, users = item_tallies(part), user_tallies(part)
        all_totals = totals(part, users, items)
        item_dense = item_dense_from(ItemFacts(items, part.log.items, all_totals), schema)
        user_dense = user_dense_from(UserFacts(users, all_totals), schema)
    log.info("%s: tallies and dense features %s", label, clock.took(f"{label}.features"))
    with clock.step(f"{label}.embeddings"):
        counts = positive_counts(part).cache()
        weights = idf(part, counts)
        params = foldin_params(part, counts, weights, recipe.als_regularization)
        confidence = bm25_confidence(part, counts, weights, params.average_length)
        embeddings = factorize_on_spark(
            confidence,
            part.log.n_users,
            part.log.n_items,
            schema.embedding_dim,
            recipe.seed,
            recipe.als_regularization,
        )
        counts.unpersist()
    log.info(
        "%s: ALS factors (dim %d) from %s positives %s",
        label,
        schema.embedding_dim,
        f"{all_totals.total_positives:,}",
        clock.took(f"{label}.embeddings"),
    )
    with clock.step(f"{label}.neighbours"):
        neighbours = neighbours_on_spark(part)
    log.info("%s: neighbours %s", label, clock.took(f"{label}.neighbours"))
    return _Learnt(
        part=part,
        embeddings=embeddings,
        user_dense=user_dense,
        item_dense=item_dense,
        popularity=items.positives.astype(np.float32),
        neighbours=neighbours,
        published=published_from(items, part.log.items, all_totals),
        foldin=params,
        served_users=np.flatnonzero(users.positives > 0),
        positives=all_totals.total_positives,
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
        self._holdout_share = recipe.holdout_share
        self._sample_train = sample.log.subset(sample.holdout.train)
        self._heavy: _Learnt | None = None
        self._known: Known | None = None

    @property
    def judged_on(self) -> InteractionLog:
        return self._sample_train

    def _learnt_on_train(self, recipe: WorldRecipe) -> tuple[_Learnt, Known]:
        """Learnt from the train part once: each input compared trains only the ranker again."""
        if self._heavy is None or self._known is None:
            self._heavy = _learn(self._train, self._schema, recipe, self._clock, "train")
            # The ranker's lists are pooled and featured from every user's early part of the
            # train part, as the served world is from every user's rows, not from the
            # sample's alone (its counts a fraction of the log's, its factors from a
            # fraction of the users).
            train = self._train
            early_rows = with_later(train.rows, self._holdout_share).filter("not later")
            early = Part(train.log, early_rows.drop("later"))
            self._known = _learn(early, self._schema, recipe, self._clock, "early").known_for(
                self._sample.users
            )
        return self._heavy, self._known

    def learn_first(self, recipe: WorldRecipe) -> Learnt:
        heavy, known = self._learnt_on_train(recipe)
        with self._clock.step("train.ranker"):
            return heavy.with_ranker(self._sample_train, self._schema, recipe, known)

    def learn_again(self, recipe: WorldRecipe) -> Learnt:
        heavy, known = self._learnt_on_train(recipe)
        return heavy.with_ranker(self._sample_train, self._schema, recipe, known)

    def judge(self, learnt: Learnt) -> dict[str, Any]:
        served = _served_model(learnt, self._sample.users)
        holdout = self._sample.holdout
        return evaluate(
            self._sample_train, holdout, served, self._schema, self._index_factory, self._seed
        )

    def served(self, recipe: WorldRecipe, judged: Judged) -> SparkServed:
        heavy, _ = self._learnt_on_train(recipe)
        if recipe.keep_holdout:
            return SparkServed(self, heavy, judged.weighed.learnt)
        whole_log = self._whole_log
        learnt = _learn(Part(whole_log, whole_log.rows), self._schema, recipe, self._clock, "all")
        with self._clock.step("all.ranker"):
            # Each sampled user's early part of all their rows is the train part: the lists
            # are featured from what the train part taught.
            known = heavy.known_for(self._sample.users)
            whole = learnt.with_ranker(self._sample.log, self._schema, recipe, known)
        return SparkServed(self, learnt, whole)

    def write(
        self, world: Path, recipe: WorldRecipe, learnt: _Learnt, whole: Learnt
    ) -> EngineReport:
        part, items_info, ids = learnt.part, learnt.part.log.items, self._ids
        items = ItemTable(
            ids=items_info.ids,
            embeddings=learnt.embeddings.items,
            dense=learnt.item_dense,
            categories=category_codes(items_info),
            published_at=learnt.published,
            popularity=learnt.popularity,
        )
        served = learnt.served_users
        users = UserTable(ids[served], learnt.embeddings.users[served], learnt.user_dense[served])
        parts = world_parts(
            self._schema,
            (items, users),
            items_info,
            learnt.foldin,
            learnt.neighbours,
            whole.ranker,
            recipe.seed,
        )

        def lists(world: Path) -> tuple[int, int]:
            # Streamed from the cluster into their files, never whole on the driver.
            seen = write_seen(part, world / SEEN_FILE, ids)
            write_positives(part, world / POSITIVES_FILE, ids)
            return seen

        seen_users, longest = write_world(world, self._schema, parts, recipe.index_factory, lists)
        return self._reported(learnt, len(users.ids), seen_users, longest)

    def _reported(self, learnt: _Learnt, users: int, seen_users: int, longest: int) -> EngineReport:
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
            "users": users,
            "items": whole_log.n_items,
            "items_without_interactions": whole_log.items_without_interactions,
            "items_without_positives": whole_log.items_without_positives,
            "categories": len(whole_log.items.category_names),
            "served_positives": learnt.positives,
        }
        histories = {"users": seen_users, "longest": longest}
        return EngineReport(engine, whole_log.uri, counts, histories)


@dataclass(frozen=True, slots=True)
class SparkServed:
    read: SparkRead
    heavy: _Learnt  # the factors, features and lists of the rows served
    learnt: Learnt  # with the ranker the world ships

    def write(self, world: Path, recipe: WorldRecipe) -> EngineReport:
        return self.read.write(world, recipe, self.heavy, self.learnt)
