"""A world's catalog written afresh: its tables checked and saved, the index and the
cold-start default built over them, the manifest."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from app.world.layout import HOLDOUT_FILE, MANIFEST_FILE, REPORT_FILE, STAMPED_FILES
from app.world.manifest import update_manifest
from app.world.schema import FeatureSchema
from recsys_tools.world.store.files import ItemTable, UserTable, save_default_user, save_table
from recsys_tools.world.store.index import build_index, save_index

log = logging.getLogger(__name__)


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
    update_manifest(
        world,
        schema_version=schema.version,
        embedding_dim=schema.embedding_dim,
        items=len(items.ids),
        users=len(users.ids),
        index=index_factory,
        index_ntotal=int(index.ntotal),
        index_build_seconds=round(time.perf_counter() - started, 2),
    )
