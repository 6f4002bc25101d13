"""The cascade on a log with planted sequential behaviour: sessions of related items.

What a user rates next is told by what they rated last (the theme of the session under
way). Recall by the user's vector averages over every theme they touched; the neighbours of
the latest items find the theme; the model, given those signals, orders the kept items.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recsys_tools.world.generate.sessions import (
    SessionShape,
    write_session_items,
    write_session_log,
)
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.items import ItemColumns
from recsys_tools.world.read.log import LogColumns
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.pipeline.signals import SIGNALS
from app.release.catalog import load_catalog
from app.world.schema import load_schema

pytestmark = pytest.mark.integration
COLUMNS = LogColumns(user="user_id", item="item_id", time="timestamp", weight="rating")
SMALL = SessionShape(genres=5, themes_per_genre=8, items_per_theme=25, users=500)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("sessions")
    log = write_session_log(folder / "sessions.csv", seed=3, shape=SMALL)
    items = write_session_items(folder / "items.csv", shape=SMALL)
    recipe = WorldRecipe(
        interactions=log,
        columns=COLUMNS,
        seed=5,
        items=items,
        item_columns=ItemColumns(category="genre"),
    )
    schema = load_schema(interactions_schema_path())
    return folder / "world", build_world_from_log(recipe, folder / "world", schema)


def test_each_stage_of_the_cascade_earns_its_place(built: tuple[Path, dict[str, Any]]) -> None:
    _, report = built
    stages = report["evaluation"]["stages"]
    methods = report["evaluation"]["methods"]
    ndcg = {name: figures["ndcg@10"] for name, figures in stages.items()}
    # Pre-rank follows the session under way; the model ranks what it kept better still.
    assert ndcg["prerank"] > 1.1 * ndcg["recall"], stages
    assert ndcg["rank"] >= 1.1 * ndcg["recall"], stages
    assert ndcg["rank"] > ndcg["prerank"], stages
    assert ndcg["rank"] > methods["item_knn"]["ndcg@10"], methods
    assert ndcg["rank"] > methods["popularity"]["ndcg@10"], methods
    # Pre-rank keeps a few hundred of the pool: most of what was held out stays in it.
    assert stages["recall"]["pool_share"] >= stages["prerank"]["pool_share"] >= 0.5, stages
    weights = report["ranker"]["prerank"]
    assert weights["similar"] > 0 or weights["recent"] > 0, weights


def test_the_world_serves_the_cascade_it_was_evaluated_with(
    built: tuple[Path, dict[str, Any]],
) -> None:
    world, report = built
    schema = load_schema(world / "feature_schema.json")
    catalog = load_catalog(world, schema, nprobe=8)
    # Every signal but the user's vector (pre-rank's base) and the order model's (a build
    # asks for that one).
    assert schema.sequence == tuple(name for name in SIGNALS[1:] if name != "order")
    assert catalog.order is None
    assert catalog.neighbours is not None
    # The item table's genres are the catalog's categories: the category signal reads them.
    assert len(np.unique(catalog.categories)) == SMALL.genres
    assert catalog.vectors is not None
    assert catalog.prerank.user > 0
    # Items of one theme are one another's neighbours: the session's theme is found.
    themes = np.char.lstrip(catalog.item_ids, "i").astype(int) // SMALL.items_per_theme
    near = catalog.neighbours.positions[:, :5]
    same = themes[near[near >= 0]] == np.repeat(themes, 5)[near.ravel() >= 0]
    assert same.mean() > 0.8
    assert report["ranker"]["blend"]["sequence"], report["ranker"]["blend"]
