"""A log without times (play counts per user and item): read, split at random with a seed,
built, and served blind to everything that reads times."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from recsys_tools.replay import rows_in_time_order
from recsys_tools.retrain import retrain
from recsys_tools.retrain_rows import RetrainPlan
from recsys_tools.world.judge.holdout import split_holdout
from recsys_tools.world.judge.split import later_rows
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.formats import FileLayout
from recsys_tools.world.read.log import InteractionLog, LogColumns, read_log
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.on_spark import SparkEngine
from recsys_tools.world.recipes.recipe import Clock, WorldRecipe
from recsys_tools.world.spark.session import SparkSettings

from app.clients.onnx_scorer import onnx_scorer
from app.core.errors import ConfigError
from app.release.catalog import load_catalog
from app.world.layout import HOLDOUT_FILE, MODEL_FILE, REPORT_FILE
from app.world.schema import FeatureSchema, load_schema

TSV = FileLayout(format="tsv")
PLAYS = LogColumns(user="userID", item="artistID", weight="weight", time=None, layout=TSV)


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return load_schema(interactions_schema_path())


def _plays(path: Path) -> Path:
    """40 users, each playing 8 to 12 of 30 artists in two tastes, tab-separated, no times."""
    rng = np.random.default_rng(5)
    rows: list[tuple[int, int, int]] = []
    for user in range(1, 41):
        taste = np.arange(1, 16) if user % 2 else np.arange(16, 31)
        played = rng.choice(taste, size=8 + user % 5, replace=False)
        rows += [(user, int(artist), int(rng.integers(1, 500))) for artist in played]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["userID", "artistID", "weight"])
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def plays(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _plays(tmp_path_factory.mktemp("plays") / "user_artists.dat")


def _rewritten(source: Path, target: Path, keep: object = None) -> Path:
    """The same play counts in the reverse order, less the rows `keep` refuses."""
    with source.open() as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    body = [row for row in rows[1:] if keep is None or keep(row)]  # type: ignore[operator]
    with target.open("w", newline="") as handle:
        csv.writer(handle, delimiter="\t").writerows([rows[0], *reversed(body)])
    return target


def _histories(log: InteractionLog) -> dict[str, list[str]]:
    users, items = log.user_ids[log.user].tolist(), log.items.ids[log.item].tolist()
    found: dict[str, list[str]] = {}
    for user, item in zip(users, items, strict=True):
        found.setdefault(user, []).append(item)
    return found


def test_a_log_without_times_orders_each_history_by_its_ids_not_the_file(
    plays: Path, tmp_path: Path
) -> None:
    log = read_log(plays, PLAYS)
    assert not log.timed
    assert not log.time.any()
    histories = _histories(log)
    # The file lists each user's artists in no order that means time; what reads a history's
    # order as recency must not read the file's sort instead, so the same rows in another
    # order give every user the same history.
    reversed_log = read_log(_rewritten(plays, tmp_path / "reversed.dat"), PLAYS)
    assert _histories(reversed_log) == histories
    with plays.open() as handle:
        written = [row["artistID"] for row in csv.DictReader(handle, delimiter="\t")]
    first = log.user_ids[0]
    in_file = [item for item in written[: len(histories[first])]]
    assert sorted(histories[first]) == sorted(in_file)
    assert histories[first] != in_file  # not the file's order
    with pytest.raises(ConfigError, match="--time-format needs a time column"):
        read_log(plays, LogColumns("userID", "artistID", None, time_format="%Y", layout=TSV))


def _later_per_user(log: InteractionLog, later: np.ndarray) -> list[int]:
    counts: list[int] = np.bincount(log.user[later], minlength=log.n_users).tolist()
    return counts


def test_each_users_later_part_is_drawn_at_random_with_the_seed(
    plays: Path, tmp_path: Path
) -> None:
    log = read_log(plays, PLAYS)
    drawn = later_rows(log, 0.2, seed=7)
    assert np.array_equal(drawn, later_rows(log, 0.2, seed=7))
    assert not np.array_equal(drawn, later_rows(log, 0.2, seed=8))
    # As many later rows per user as a cut in time would make: only which ones is drawn.
    in_order = later_rows(dataclasses.replace(log, timed=True), 0.2, seed=7)
    assert _later_per_user(log, drawn) == _later_per_user(log, in_order)
    assert not np.array_equal(drawn, in_order)
    # The build holds out what split-log draws with the same seed.
    assert np.array_equal(split_holdout(log, 0.2, seed=7).train, ~drawn)
    # One user's draw is theirs alone: another user's rows dropped, or the file in another
    # order, draw the same later rows for everyone else.
    fewer = read_log(_rewritten(plays, tmp_path / "fewer.dat", lambda row: row[0] != "1"), PLAYS)
    kept = _later_part(fewer, later_rows(fewer, 0.2, seed=7))
    whole = _later_part(log, drawn)
    assert kept == {user: rows for user, rows in whole.items() if user != "1"}


def _later_part(log: InteractionLog, later: np.ndarray) -> dict[str, set[str]]:
    part: dict[str, set[str]] = {}
    for row in np.flatnonzero(later):
        part.setdefault(str(log.user_ids[log.user[row]]), set()).add(
            str(log.items.ids[log.item[row]])
        )
    return part


def _columns(schema: FeatureSchema, block: str, names: tuple[str, ...], wanted: str) -> int:
    return int(schema.blocks[block].start + names.index(wanted))


def test_a_world_built_without_times_says_so_and_never_reads_them(
    plays: Path, schema: FeatureSchema, tmp_path: Path
) -> None:
    world = tmp_path / "world"
    recipe = WorldRecipe(interactions=plays, columns=PLAYS, seed=7)
    report = build_world_from_log(recipe, world, schema)
    assert report == json.loads((world / REPORT_FILE).read_text())
    times = report["times"]
    assert times["column"] is None
    assert times["held_out"] == "20% of each user's rows, drawn at random with seed 7"
    assert {"tenure", "recency"} <= set(times["left_out"])
    assert report["evaluation"]["users_evaluated"] > 0
    load_catalog(world, schema, nprobe=8, mmap=False)  # loads as the service loads it

    # The served model is blind to every column that reads times, and not to the others.
    with np.load(world / HOLDOUT_FILE) as held:
        rows = held["rows"].astype(np.float32)[:50]
    scorer = onnx_scorer(world / MODEL_FILE)
    before = scorer.score(rows)
    blind = [
        _columns(schema, "user_dense", schema.user_dense, "tenure"),
        _columns(schema, "user_dense", schema.user_dense, "recency"),
        *range(
            schema.blocks["context"].stop - len(schema.time_features), schema.blocks["context"].stop
        ),
    ]
    if "freshness" in schema.item_dense:
        blind.append(_columns(schema, "item_dense", schema.item_dense, "freshness"))
    moved = rows.copy()
    moved[:, blind] += 3.0
    np.testing.assert_array_equal(scorer.score(moved), before)
    seeing = rows.copy()
    seeing[:, schema.blocks["user_item_product"]] += 3.0
    assert not np.array_equal(scorer.score(seeing), before)


def test_what_needs_times_refuses_a_log_without(plays: Path, tmp_path: Path) -> None:
    recipe = WorldRecipe(interactions=plays, columns=PLAYS)
    engine = SparkEngine(str(plays), SparkSettings("local[1]", (), 1000))
    opened = engine.opened(recipe, load_schema(interactions_schema_path()), Clock())
    refused = re.escape(plays.name) + r" has no times \(--time-col none\): "
    with pytest.raises(ConfigError, match=refused + "the Spark engine .* --engine spark"), opened:
        pass
    plan = RetrainPlan(plays, PLAYS, str(tmp_path / "archive"), tmp_path, tmp_path / "worlds")
    with pytest.raises(ConfigError, match=refused + "recsys retrain holds out the latest day"):
        retrain(plan)
    assert not (tmp_path / "worlds").exists()  # refused before any step began
    with pytest.raises(ConfigError, match=refused + "a replay plays its rows in time order"):
        rows_in_time_order(read_log(plays, PLAYS), None)
