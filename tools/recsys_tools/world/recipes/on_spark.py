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
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from app.core.errors import ConfigError
from app.world.foldin import FoldInParams
from app.world.layout import POSITIVES_FILE, SEEN_FILE
from app.world.neighbours import Neighbours
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.evaluate import Holdout, ServedModel, evaluate, split_holdout
from recsys_tools.world.learn.derive import (
    ItemFacts,
    UserFacts,
    category_codes,
    check_derivable,
    item_dense_from,
    published_from,
    user_dense_from,
)
from recsys_tools.world.learn.factorize import Embeddings
from recsys_tools.world.learn.ranker.from_log import Known, train_list_ranker
from recsys_tools.world.learn.regularization import Choice
from recsys_tools.world.read.items import read_items
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import FLAGS, StrArray
from recsys_tools.world.recipes.from_log import (
    Judged,
    finish,
    judge_inputs,
    ranker_report,
    regularize,
)
from recsys_tools.world.recipes.learnt import Learnt, world_parts
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.spark.factors import factorize_on_spark
from recsys_tools.world.spark.neighbours import neighbours_on_spark
from recsys_tools.world.spark.read import SparkLog, read_spark_log, user_ids
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
        params = foldin_params(part, counts, weights, recipe.shrink)
        confidence = bm25_confidence(part, counts, weights, params.average_length)
        embeddings = factorize_on_spark(
            confidence,
            part.log.n_users,
            part.log.n_items,
            schema.embedding_dim,
            recipe.seed,
            recipe.shrink,
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
    holdout: Holdout


def _sample(whole: SparkLog, recipe: WorldRecipe, settings: SparkSettings, clock: Clock) -> _Sample:
    with clock.step("sample"):
        chosen = sampled_users(whole, settings.sample_rows, recipe.seed)
        gathered, indexes = gather(whole, whole.rows, chosen)
        holdout = split_holdout(gathered, recipe.holdout_share)
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


def _write(
    world: Path,
    schema: FeatureSchema,
    recipe: WorldRecipe,
    learnt: _Learnt,
    whole: Learnt,
    ids: StrArray,
) -> dict[str, int]:
    part, items_info = learnt.part, learnt.part.log.items
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
        schema,
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

    seen_users, longest = write_world(world, schema, parts, recipe.index_factory, lists)
    return {"users": len(users.ids), "seen_users": seen_users, "longest": longest}


@dataclass(frozen=True, slots=True)
class _Judged:
    heavy: _Learnt  # learnt from the train part
    outcome: Judged  # with the ranker the comparison kept


def _judge(
    train: Part, sample: _Sample, schema: FeatureSchema, recipe: WorldRecipe, clock: Clock
) -> _Judged:
    """Learnt from the train part and judged on the sampled users' held-out items, as
    build_world_from_log judges; each input compared trains only the ranker again."""
    sample_train = sample.log.subset(sample.holdout.train)
    heavy = _learn(train, schema, recipe, clock, "train")
    # The ranker's lists are pooled and featured from every user's early part of the train
    # part, as the served world is from every user's rows, not from the sample's alone
    # (its counts a fraction of the log's, its factors from a fraction of the users).
    early_rows = with_later(train.rows, recipe.holdout_share).filter("not later").drop("later")
    known = _learn(Part(train.log, early_rows), schema, recipe, clock, "early").known_for(
        sample.users
    )

    def first(chosen: WorldRecipe) -> Learnt:
        with clock.step("train.ranker"):
            return heavy.with_ranker(sample_train, schema, chosen, known)

    def judge(learnt: Learnt) -> dict[str, Any]:
        served = _served_model(learnt, sample.users)
        return evaluate(
            sample_train, sample.holdout, served, schema, recipe.index_factory, recipe.seed
        )

    return _Judged(
        heavy,
        judge_inputs(
            sample_train,
            recipe,
            clock,
            first,
            lambda chosen: heavy.with_ranker(sample_train, schema, chosen, known),
            judge,
        ),
    )


def _report(
    recipe: WorldRecipe,
    settings: SparkSettings,
    whole_log: SparkLog,
    sample: _Sample,
    judged: _Judged,
    learnt: _Learnt,
    ranker: Learnt,
    choice: Choice | None,
    written: dict[str, int],
) -> dict[str, Any]:
    counted = whole_log.counts
    return {
        "engine": {
            "name": "spark",
            "master": settings.master,
            "sample_rows": settings.sample_rows,
            "sampled_users": sample.log.n_users,
            "sampled_rows": len(sample.log.user),
        },
        "source": {
            "interactions": whole_log.uri,
            "items": None if recipe.items is None else str(recipe.items),
        },
        "served": "train part" if recipe.keep_holdout else "all interactions",
        "counts": {
            "rows_read": counted.rows_read,
            "interactions": whole_log.rows_count,
            "positives": whole_log.positives,
            "below_min_weight": counted.below_min_weight,
            "dropped": dict(counted.dropped),
            "users": written["users"],
            "items": whole_log.n_items,
            "items_without_interactions": whole_log.items_without_interactions,
            "items_without_positives": whole_log.items_without_positives,
            "categories": len(whole_log.items.category_names),
            "served_positives": learnt.positives,
        },
        "evaluation": judged.outcome.weighed.evaluation,
        "inputs": judged.outcome.weighed.report,
        "histories": {"users": written["seen_users"], "longest": written["longest"]},
        "als": {
            "regularization": recipe.shrink,
            "chosen_on": None if choice is None else choice.recall,
        },
        "ranker": ranker_report(ranker.ranker),
    }


def build_world_on_spark(
    recipe: WorldRecipe, log_uri: str, world: Path, schema: FeatureSchema, settings: SparkSettings
) -> dict[str, Any]:
    """Build, evaluate and write the world; returns the report also written to report.json.

    `log_uri` is any path Spark reads (a file or a folder of parts; file:, hdfs:, s3a:);
    the item table is read by the driver, from its own disk."""
    check_derivable(schema)
    clock = Clock()
    started = time.perf_counter()
    catalog = None if recipe.items is None else read_items(recipe.items, recipe.item_columns)
    with spark_session(settings) as spark:
        with clock.step("read"):
            whole_log = read_spark_log(spark, log_uri, recipe.columns, catalog)
            ids = user_ids(whole_log)
        log.info(
            "read %s interactions from %s: %s users, %s items %s",
            f"{whole_log.counts.rows_read:,}",
            whole_log.source,
            f"{whole_log.n_users:,}",
            f"{whole_log.n_items:,}",
            clock.took("read"),
        )
        sample = _sample(whole_log, recipe, settings, clock)
        with clock.step("holdout"):
            marked = with_later(whole_log.rows, recipe.holdout_share)
            train = Part(whole_log, marked.filter("not later").drop("later").cache())
        recipe, choice = regularize(sample.log.subset(sample.holdout.train), schema, recipe, clock)
        judged = _judge(train, sample, schema, recipe, clock)
        recipe = judged.outcome.recipe
        if recipe.keep_holdout:
            learnt, whole = judged.heavy, judged.outcome.weighed.learnt
        else:
            learnt = _learn(Part(whole_log, whole_log.rows), schema, recipe, clock, "all")
            with clock.step("all.ranker"):
                # Each sampled user's early part of all their rows is the train part.
                known = judged.heavy.known_for(sample.users)
                whole = learnt.with_ranker(sample.log, schema, recipe, known)
        with clock.step("write"):
            written = _write(world, schema, recipe, learnt, whole, ids)
        log.info("wrote the world to %s %s", world, clock.took("write"))
        report = _report(
            recipe, settings, whole_log, sample, judged, learnt, whole, choice, written
        )
    report["seconds"] = {**clock.seconds, "total": round(time.perf_counter() - started, 2)}
    finish(world, schema, recipe, report)
    return report
