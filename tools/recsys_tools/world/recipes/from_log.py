"""A servable world from an interaction log: read, hold out, learn, evaluate, learn again, write.

Everything is learnt first without each user's latest positives and evaluated on them; then,
unless the holdout is kept out, learnt again on every interaction for the world that serves.
The steps are the functions below, in the order build_world_from_log runs them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.errors import ConfigError
from app.world.layout import REPORT_FILE
from app.world.manifest import update_manifest
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.ablation import ITEM_TABLE, Weighed, weigh_inputs
from recsys_tools.world.judge.evaluate import Holdout, evaluate, split_holdout
from recsys_tools.world.learn.derive import check_derivable
from recsys_tools.world.learn.factorize import foldin_params
from recsys_tools.world.learn.ranker.from_log import ListRanker
from recsys_tools.world.learn.regularization import Choice, choose_regularization
from recsys_tools.world.read.items import read_items
from recsys_tools.world.read.log import InteractionLog, read_log
from recsys_tools.world.read.tables import FLAGS
from recsys_tools.world.recipes.learnt import (
    Learnt,
    learn,
    positive_lists,
    served_tables,
    world_parts,
)
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.recipes.report import counts, histories
from recsys_tools.world.store.files import SeenLists, save_table
from recsys_tools.world.store.identity import stamp_world
from recsys_tools.world.store.world import write_world

log = logging.getLogger("recsys.build")


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


def _write(
    world: Path, schema: FeatureSchema, recipe: WorldRecipe, part: InteractionLog, learnt: Learnt
) -> tuple[int, SeenLists]:
    """Write the world's files; returns how many users have features, and the seen lists."""
    items, users, seen = served_tables(part, learnt)
    parts = world_parts(
        schema,
        (items, users),
        part.items,
        foldin_params(part, recipe.shrink),
        learnt.neighbours,
        learnt.ranker,
        recipe.seed,
    )

    def lists(world: Path) -> None:
        save_table(world, seen)
        save_table(world, positive_lists(part))

    write_world(world, schema, parts, recipe.index_factory, lists)
    return len(users.ids), seen


def _hold_out(whole: InteractionLog, recipe: WorldRecipe, clock: Clock) -> Holdout:
    with clock.step("holdout"):
        holdout = split_holdout(whole, recipe.holdout_share)
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
    return holdout


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
        recipe.shrink,
        clock.took("regularization"),
        "" if choice is None else f" (recall@10 on the train part's own split: {choice.recall})",
    )
    return recipe, choice


@dataclass(frozen=True, slots=True)
class Judged:
    """What was learnt on the train part and how it did, with the inputs chosen."""

    weighed: Weighed[Learnt]
    recipe: WorldRecipe  # with the inputs left out


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


def _learn_and_judge(
    train: InteractionLog,
    holdout: Holdout,
    schema: FeatureSchema,
    recipe: WorldRecipe,
    clock: Clock,
) -> Judged:
    def judge(learnt: Learnt) -> dict[str, Any]:
        served = learnt.served()
        return evaluate(train, holdout, served, schema, recipe.index_factory, recipe.seed)

    return judge_inputs(
        train,
        recipe,
        clock,
        lambda chosen: learn(train, schema, chosen, clock, "train"),
        lambda chosen: learn(train, schema, chosen, clock, "compare"),
        judge,
    )


def _report(
    recipe: WorldRecipe,
    judged: Judged,
    learnt: Learnt,
    choice: Choice | None,
    counted: dict[str, Any],
    seen: SeenLists,
) -> dict[str, Any]:
    return {
        "engine": {"name": "local"},
        "source": {
            "interactions": str(recipe.interactions),
            "items": None if recipe.items is None else str(recipe.items),
        },
        "served": "train part" if recipe.keep_holdout else "all interactions",
        "counts": counted,
        "evaluation": judged.weighed.evaluation,
        "inputs": judged.weighed.report,
        "histories": histories(seen),
        "als": {
            "regularization": recipe.shrink,
            "chosen_on": None if choice is None else choice.recall,
        },
        "ranker": ranker_report(learnt.ranker),
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


def finish(world: Path, schema: FeatureSchema, recipe: WorldRecipe, report: dict[str, Any]) -> None:
    """The report beside the world, its manifest, and the stamp that names it whole."""
    (world / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    update_manifest(
        world,
        source="interactions",
        interactions=recipe.interactions.name,
        item_table=None if recipe.items is None else recipe.items.name,
        seed=recipe.seed,
        served=report["served"],
        counts=report["counts"],
        evaluation=report["evaluation"]["methods"],
        build_seconds=report["seconds"]["total"],
    )
    stamp_world(world, schema)


def build_world_from_log(recipe: WorldRecipe, world: Path, schema: FeatureSchema) -> dict[str, Any]:
    """Build, evaluate and write the world; returns the report also written to report.json."""
    check_derivable(schema)
    clock = Clock()
    started = time.perf_counter()
    whole = _read(recipe, clock)
    holdout = _hold_out(whole, recipe, clock)
    train = whole.subset(holdout.train)
    recipe, choice = regularize(train, schema, recipe, clock)
    judged = _learn_and_judge(train, holdout, schema, recipe, clock)
    recipe, learnt, served = judged.recipe, judged.weighed.learnt, train
    if not recipe.keep_holdout:
        served = whole
        learnt = learn(whole, schema, recipe, clock, "all")
    with clock.step("write"):
        users, seen = _write(world, schema, recipe, served, learnt)
    log.info("wrote the world to %s %s", world, clock.took("write"))
    report = _report(recipe, judged, learnt, choice, counts(whole, served, users), seen)
    report["seconds"] = {**clock.seconds, "total": round(time.perf_counter() - started, 2)}
    finish(world, schema, recipe, report)
    return report
