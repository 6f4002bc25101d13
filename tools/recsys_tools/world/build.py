"""Assembling a world directory: tables, index, default user, model, manifest."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.release.attributes import save_attributes
from app.release.catalog import HOLDOUT_FILE, MANIFEST_FILE, MODEL_FILE
from app.release.foldin import PLAIN, save_foldin
from app.release.neighbours import save_neighbours
from app.release.schema import FeatureSchema
from recsys_tools.world.files import (
    ItemTable,
    UserTable,
    save_default_user,
    save_table,
    write_manifest,
)
from recsys_tools.world.identity import STAMPED_FILES, stamp_world
from recsys_tools.world.index import build_index, save_index
from recsys_tools.world.neighbours import item_neighbours
from recsys_tools.world.synth import generate_world
from recsys_tools.world.titles import generated_attributes
from recsys_tools.world.train import train_ranker

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DemoSize:
    items: int
    users: int
    impressions: int


DEMO = DemoSize(items=100_000, users=20_000, impressions=200_000)
LARGE = DemoSize(items=1_000_000, users=100_000, impressions=400_000)
# The manifest's `source` of a world the demo generated, and so may build again.
SYNTHETIC = "synthetic"
# What build-world's evaluation writes beside the world.
REPORT_FILE = "report.json"


def write_catalog(
    world: Path, schema: FeatureSchema, items: ItemTable, users: UserTable, index_factory: str
) -> None:
    """Check and save the tables, then build the index and the cold-start default over them.

    This starts the world afresh: what an earlier build left (a seen list, a model, the
    manifest, held-out rows) would otherwise be served beside tables it does not belong to.
    """
    items.check(schema)
    users.check(schema)
    world.mkdir(parents=True, exist_ok=True)
    for name in (*STAMPED_FILES, MANIFEST_FILE, REPORT_FILE, HOLDOUT_FILE):
        (world / name).unlink(missing_ok=True)
    save_table(world, items)
    save_table(world, users)
    save_default_user(world, users)
    started = time.perf_counter()
    index = build_index(items.embeddings, index_factory)
    save_index(world, index)
    log.info(
        "indexed %d items (%s) in %.1f s",
        index.ntotal,
        index_factory,
        time.perf_counter() - started,
    )
    write_manifest(
        world,
        schema_version=schema.version,
        embedding_dim=schema.embedding_dim,
        items=len(items.ids),
        users=len(users.ids),
        index=index_factory,
        index_ntotal=int(index.ntotal),
        index_build_seconds=round(time.perf_counter() - started, 2),
    )


def build_demo_world(
    world: Path, schema: FeatureSchema, size: DemoSize, index_factory: str = "auto", seed: int = 7
) -> dict[str, object]:
    """Generate, train and write a synthetic world; returns the training report."""
    started = time.perf_counter()
    generated = generate_world(schema, size.items, size.users, size.impressions, seed)
    log.info("generated %d items, %d users", size.items, size.users)
    write_catalog(world, schema, generated.items, generated.users, index_factory)
    save_table(world, generated.seen)
    # Its vectors are generated, not fitted: new ones are folded in with plain counts.
    save_foldin(world, PLAIN)
    # Items clicked by the same users are neighbours; the pre-rank weights stay the default
    # (the user's vector alone): nothing here was held out to fit them on.
    clicked = generated.interactions.clicked == 1
    by_user = np.argsort(generated.interactions.users[clicked], kind="stable")
    save_neighbours(
        world,
        item_neighbours(
            generated.interactions.users[clicked][by_user],
            generated.interactions.items[clicked][by_user],
            size.users,
            size.items,
        ),
    )
    log.info("training the ranker on %d impressions", size.impressions)
    trained = train_ranker(generated, schema, seed)
    (world / MODEL_FILE).write_bytes(trained.onnx_model)
    save_attributes(world, generated_attributes(generated.items.categories, seed))
    report = trained.report.as_dict()
    write_manifest(
        world,
        source=SYNTHETIC,
        seed=seed,
        training=report,
        build_seconds=round(time.perf_counter() - started, 1),
    )
    stamp_world(world, schema)
    return report
