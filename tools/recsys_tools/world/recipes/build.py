"""A world from an interaction log, on either engine: the build's steps, written once.

read and hold out (the engine's) -> ALS's regularisation chosen on the train part's own
split -> learnt on the train part and judged on the held-out positives, each input compared
-> learnt again on every interaction for the world that serves (unless the holdout is kept)
-> written -> the report, the manifest and the stamp.

An engine is where the heavy steps run: this process (recipes/from_log.py) or Spark jobs
(recipes/on_spark.py). Both judge, choose and report through the functions here, so the
parity their tests check is the shape of the code.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from app.core.errors import ConfigError
from app.world.layout import REPORT_FILE
from app.world.order import OrderModel
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.ablation import ITEM_TABLE, Weighed, time_features, weigh_inputs
from recsys_tools.world.learn.derive import check_derivable
from recsys_tools.world.learn.order import OrderReport, with_order
from recsys_tools.world.learn.ranker.from_log import ListRanker
from recsys_tools.world.learn.regularization import Choice, choose_regularization
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.recipes.learnt import Learnt
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.recipes.report import neighbours_report
from recsys_tools.world.store.identity import stamp_world

log = logging.getLogger("recsys.build")


@dataclass(frozen=True, slots=True)
class Judged:
    """What was learnt on the train part and how it did, with the inputs chosen."""

    weighed: Weighed[Learnt]
    recipe: WorldRecipe  # with the inputs left out


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """The report's parts only the engine knows: itself, what it read, what it wrote."""

    engine: dict[str, Any]
    interactions: str  # where the log was read from
    counts: dict[str, Any]
    histories: dict[str, int]
    manifest: dict[str, Any]  # what the manifest says of the files written (store/world.py)


class Served(Protocol):
    """What the world that serves was learnt from, ready to be written."""

    @property
    def learnt(self) -> Learnt: ...

    def write(self, world: Path, recipe: WorldRecipe) -> EngineFacts: ...


class Opened(Protocol):
    """A log read and held out by an engine."""

    @property
    def judged_on(self) -> InteractionLog:
        """The train part's rows the world is judged, and its regularisation chosen, on."""
        ...

    def learn_first(self, recipe: WorldRecipe) -> Learnt:
        """Everything learnt from the train part, as the recipe says."""
        ...

    def learn_again(self, recipe: WorldRecipe) -> Learnt:
        """Learnt again for an input compared: the ranker only, on what the train part
        taught (both engines learn it once)."""
        ...

    def judge(self, learnt: Learnt) -> dict[str, Any]:
        """The evaluation of what was learnt, on the held-out positives."""
        ...

    def served(self, recipe: WorldRecipe, judged: Judged) -> Served:
        """What the world serves: learnt again on every row, or the train part's."""
        ...


class Engine(Protocol):
    def opened(
        self, recipe: WorldRecipe, schema: FeatureSchema, clock: Clock
    ) -> AbstractContextManager[Opened]:
        """The log read and held out; whatever the engine holds open is closed after."""
        ...


def build_world(
    recipe: WorldRecipe, world: Path, schema: FeatureSchema, engine: Engine
) -> dict[str, Any]:
    """Build, evaluate and write the world; returns the report also written to report.json."""
    check_derivable(schema)
    schema = with_order(schema) if recipe.order_model else schema
    if "order" in schema.sequence and recipe.columns.time is None:
        raise ConfigError(
            "the order model reads each history in time order: a log without times has none "
            "(build without --order-model, with a schema that leaves out the order signal)"
        )
    clock = Clock()
    started = time.perf_counter()
    with engine.opened(recipe, schema, clock) as read:
        recipe, choice = regularize(read.judged_on, schema, recipe, clock)
        judged = judge_inputs(
            read.judged_on, recipe, clock, read.learn_first, read.learn_again, read.judge
        )
        recipe = judged.recipe
        served = read.served(recipe, judged)
        with clock.step("write"):
            written = served.write(world, recipe)
        log.info("wrote the world to %s %s", world, clock.took("write"))
        report = _report(recipe, judged, served.learnt, choice, written, schema)
    report["seconds"] = {**clock.seconds, "total": round(time.perf_counter() - started, 2)}
    _finish(world, schema, recipe, report, written.manifest)
    return report


def regularize(
    train: InteractionLog, schema: FeatureSchema, recipe: WorldRecipe, clock: Clock
) -> tuple[WorldRecipe, Choice | None]:
    """The recipe with ALS's regularisation chosen on the train part's own split, if unset."""
    with clock.step("regularization"):
        choice = None
        if recipe.regularization is None:
            choice = choose_regularization(
                train, schema.embedding_dim, recipe.seed, recipe.holdout_share
            )
            recipe = replace(recipe, regularization=choice.regularization)
    log.info(
        "ALS regularisation %g %s%s",
        recipe.als_regularization,
        clock.took("regularization"),
        "" if choice is None else f" (recall@10 on the train part's own split: {choice.recall})",
    )
    return recipe, choice


def judge_inputs(
    train: InteractionLog,
    recipe: WorldRecipe,
    clock: Clock,
    learn_first: Callable[[WorldRecipe], Learnt],
    learn_again: Callable[[WorldRecipe], Learnt],
    judge: Callable[[Learnt], dict[str, Any]],
) -> Judged:
    """Learnt as the recipe says (without the item table's features when off) and judged,
    then learnt again without each input compared; both engines keep what this keeps."""
    first = recipe
    if recipe.item_features == "off":
        first = replace(recipe, without=recipe.without | {ITEM_TABLE})
    learnt = learn_first(first)
    with clock.step("evaluate"):
        evaluation = judge(learnt)
    log.info(
        "evaluated %s users %s: %s",
        f"{evaluation['users_evaluated']:,}",
        clock.took("evaluate"),
        json.dumps(evaluation["methods"]),
    )
    # Each comparison trains the shape the first training kept: the inputs differ, not it.
    kept = replace(recipe, network=learnt.ranker.network["kind"])

    def again(without: frozenset[str]) -> tuple[Learnt, Any]:
        other = learn_again(replace(kept, without=without))
        return other, judge(other)

    with clock.step("inputs"):
        weighed = weigh_inputs(
            train, (learnt, evaluation), again, recipe.item_features, recipe.compare_inputs
        )
    return Judged(weighed, replace(recipe, without=weighed.without))


def _report(
    recipe: WorldRecipe,
    judged: Judged,
    learnt: Learnt,
    choice: Choice | None,
    written: EngineFacts,
    schema: FeatureSchema,
) -> dict[str, Any]:
    return {
        "engine": written.engine,
        "source": {
            "interactions": written.interactions,
            "items": None if recipe.items is None else str(recipe.items),
        },
        "times": _times(recipe, schema),
        "served": "train part" if recipe.keep_holdout else "all interactions",
        "counts": written.counts,
        "evaluation": judged.weighed.evaluation,
        "inputs": judged.weighed.report,
        "histories": written.histories,
        "als": {
            "regularization": recipe.als_regularization,
            "chosen_on": None if choice is None else choice.recall,
        },
        "neighbours": neighbours_report(
            recipe.neighbours, learnt.taught.neighbours, learnt.taught.page_neighbours
        ),
        "ranker": ranker_report(learnt.ranker),
        "order_model": _order_report(learnt.taught.order, learnt.taught.order_fit),
    }


def _order_report(
    order: OrderModel | None, fit: OrderReport | None
) -> dict[str, float | int] | None:
    """The served order model's size and how its training went (None: the world has none)."""
    if order is None:
        return None
    trained = {} if fit is None else fit.as_dict()
    return {"items": order.items, "hidden": order.hidden, "window": order.window, **trained}


def _times(recipe: WorldRecipe, schema: FeatureSchema) -> dict[str, Any]:
    """How the log's times were used: the holdout by time, or, without times, drawn at
    random with the build's seed and the features that read times left out."""
    share = f"{recipe.holdout_share:.0%}"
    if recipe.columns.time is not None:
        return {"column": recipe.columns.time, "held_out": f"each user's latest {share}"}
    return {
        "column": None,
        "held_out": f"{share} of each user's rows, drawn at random with seed {recipe.seed}",
        "left_out": time_features(schema),
        # What reads a history's order (the latest positives and their decay, the neighbours
        # of the latest) reads this one: neither time nor the file's sort.
        "history_order": "each user's rows by a hash of the user's and the item's ids",
    }


def ranker_report(ranker: ListRanker) -> dict[str, Any]:
    return {
        "rows": ranker.rows,
        "positives": ranker.positives,
        "network": ranker.network,
        "blend": ranker.blend.as_dict(),
        # Whether the network has any say in the served score (the blend's choice).
        "network_in_score": ranker.blend.model != 0,
        "prerank": dataclasses.asdict(ranker.prerank),
    }


def _finish(
    world: Path,
    schema: FeatureSchema,
    recipe: WorldRecipe,
    report: dict[str, Any],
    written: dict[str, Any],
) -> None:
    """The report beside the world, then the stamp that names it whole, with its manifest
    (what writing the world said of its files, `written`, and how the world was built)."""
    (world / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    stamp_world(
        world,
        schema,
        **written,
        source="interactions",
        interactions=recipe.interactions.name,
        item_table=None if recipe.items is None else recipe.items.name,
        seed=recipe.seed,
        served=report["served"],
        counts=report["counts"],
        evaluation=report["evaluation"]["methods"],
        build_seconds=report["seconds"]["total"],
    )
