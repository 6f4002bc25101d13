"""What each input buys: the build's evaluation again without the item table's categories
and publish times, and (asked for) without each derived feature group, so a user sees when
their item table helps or hurts; `auto` keeps the item table's features only where they do
not lower the ranked list's NDCG@10.

Leaving an input out never changes the world's files: the ranker is trained blind to its
columns (scaled by 0 as a row is standardised, in training and in the served graph) and the
blend gives them no weight. So the catalog keeps its categories for the rerank rules and
for the attributes a client may ask for, whatever the ranker was allowed to see.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from app.world.schema import FeatureSchema
from recsys_tools.world.read.log import InteractionLog

log = logging.getLogger("recsys.build")

# The ranker's input blocks a build can leave out, to measure what each one buys.
FEATURE_GROUPS = ("user_dense", "item_dense", "sequence")
# The item table's categories and publish times, in every feature derived from them.
ITEM_TABLE = "item_table"
ITEM_FEATURES = ("auto", "on", "off")
EVERYTHING = "everything"
# The columns made from the item table: (block, feature) by what the table gives.
FROM_CATEGORIES = (
    ("item_dense", "category_share"),
    ("user_dense", "category_breadth"),
    ("sequence", "recent_category"),
)
FROM_PUBLISHED = (("item_dense", "freshness"),)
# The columns that read the log's times: left out of a world built from a log without them
# (every time reads 0 there, so an age or a recency would say nothing, and the hour a request
# comes at would be one the model never saw vary).
FROM_TIMES = (("item_dense", "freshness"), ("user_dense", "tenure"), ("user_dense", "recency"))

Learnt = TypeVar("Learnt")
# Learn from the log leaving out some inputs (FEATURE_GROUPS, ITEM_TABLE); evaluate it.
LearnAndEvaluate = Callable[[frozenset[str]], tuple[Learnt, dict[str, Any]]]


def has_item_features(log: InteractionLog) -> bool:
    return bool(log.items.category_names) or log.items.published is not None


def _block_names(schema: FeatureSchema, block: str) -> tuple[str, ...]:
    named = {"item_dense": schema.item_dense, "user_dense": schema.user_dense}
    return named.get(block, schema.sequence)


def _column(schema: FeatureSchema, block: str, name: str) -> int | None:
    names = _block_names(schema, block)
    if block not in schema.blocks or name not in names:
        return None
    start: int = schema.blocks[block].start
    return start + names.index(name)


def item_table_columns(schema: FeatureSchema, log: InteractionLog) -> list[int]:
    """The row's columns made from what the log's item table gives."""
    made = (FROM_CATEGORIES if log.items.category_names else ()) + (
        FROM_PUBLISHED if log.items.published is not None else ()
    )
    found = [_column(schema, block, name) for block, name in made]
    return [column for column in found if column is not None]


def time_columns(schema: FeatureSchema) -> list[int]:
    """The row's columns that read times: ages and recencies, the request's hour and day."""
    found = [_column(schema, block, name) for block, name in FROM_TIMES]
    columns = [column for column in found if column is not None]
    if "context" in schema.blocks and schema.time_features:
        end: int = schema.blocks["context"].stop
        columns.extend(range(end - len(schema.time_features), end))
    return columns


def time_features(schema: FeatureSchema) -> list[str]:
    """The names of what time_columns are, as a report says what was left out."""
    named = [name for block, name in FROM_TIMES if _column(schema, block, name) is not None]
    return [*named, *(f"context {name}" for name in schema.time_features)]


def ignored_columns(
    schema: FeatureSchema, groups: frozenset[str], log: InteractionLog
) -> npt.NDArray[np.bool_] | None:
    """The row's columns the ranker is not to see, or None when it sees them all; a log
    without times has its time columns left out whatever the groups."""
    ignored = np.zeros(schema.width, dtype=bool)
    if not log.timed:
        ignored[time_columns(schema)] = True
    for group in FEATURE_GROUPS:
        if group in groups and group in schema.blocks:
            ignored[schema.blocks[group]] = True
    if ITEM_TABLE in groups:
        ignored[item_table_columns(schema, log)] = True
    return ignored if ignored.any() else None


def ignored_signals(
    schema: FeatureSchema, groups: frozenset[str], log: InteractionLog
) -> npt.NDArray[np.bool_]:
    """Of the schema's sequence signals, those the blend is to give no weight."""
    ignored = ignored_columns(schema, groups, log)
    if ignored is None or "sequence" not in schema.blocks:
        return np.zeros(len(schema.sequence), dtype=bool)
    return ignored[schema.blocks["sequence"]]


def _row(name: str, evaluation: dict[str, Any], used: bool) -> dict[str, Any]:
    ranked = evaluation["stages"]["rank"]
    return {
        "input": name,
        "used": used,
        "recall@10": ranked["recall@10"],
        "ndcg@10": ranked["ndcg@10"],
    }


def _better(challenger: dict[str, Any], holder: dict[str, Any]) -> bool:
    return bool((challenger["ndcg@10"] or 0.0) > (holder["ndcg@10"] or 0.0))


@dataclass(frozen=True, slots=True)
class Weighed(Generic[Learnt]):
    learnt: Learnt
    evaluation: dict[str, Any]
    without: frozenset[str]  # what the served world's ranker leaves out
    report: dict[str, Any]


def weigh_inputs(
    train: InteractionLog,
    first: tuple[Learnt, dict[str, Any]],
    learn: LearnAndEvaluate[Learnt],
    item_features: str,
    compare: bool,
) -> Weighed[Learnt]:
    """`first` was learnt from `train` as `item_features` says (without the item table's
    features when off); each comparison learns once more. Returns what the build keeps."""
    learnt, evaluation = first
    given = has_item_features(train)
    served = frozenset({ITEM_TABLE}) if given and item_features == "off" else frozenset()
    rows = [_row(EVERYTHING if not served else "without the item table", evaluation, True)]
    chosen = Weighed(learnt, evaluation, served, {})
    if given and item_features != "off" and (item_features == "auto" or compare):
        bare = learn(frozenset({ITEM_TABLE}))
        rows.append(_row("without the item table's categories and dates", bare[1], False))
        if item_features == "auto" and _better(rows[-1], rows[0]):
            rows[0]["used"], rows[-1]["used"] = False, True
            chosen = Weighed(bare[0], bare[1], frozenset({ITEM_TABLE}), {})
            log.warning(
                "the item table's categories and dates lowered NDCG@10 (%s against %s): the "
                "ranker is trained without them (the rules still use the categories; "
                "--item-features on keeps them)",
                rows[0]["ndcg@10"],
                rows[-1]["ndcg@10"],
            )
    if compare:
        for group in FEATURE_GROUPS:
            _, figures = learn(chosen.without | {group})
            rows.append(_row(f"without {group.replace('_', ' ')}", figures, False))
    # Each row against the world as served: what leaving the input out (or, for a row not
    # served, putting it back) does to the ranked list.
    base = next(row["ndcg@10"] for row in rows if row["used"]) or 0.0
    for row in rows:
        row["change"] = round((row["ndcg@10"] or 0.0) - base, 4)
    report = {
        "item_features": _item_features_said(given, item_features, chosen.without),
        "compared": rows,
    }
    return dataclasses.replace(chosen, report=report)


def _item_features_said(given: bool, asked: str, without: frozenset[str]) -> str:
    if not given:
        return "none given"
    if ITEM_TABLE not in without:
        return "used"
    if asked == "off":
        return "left out of the ranker (--item-features off)"
    return "left out of the ranker: they lowered NDCG@10"
