"""A world's catalog written afresh: its tables checked and saved, the index and the
cold-start default built over them; what the manifest says of them, returned for the stamp."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.world.layout import HOLDOUT_FILE, MANIFEST_FILE, REPORT_FILE, STAMPED_FILES
from app.world.schema import FeatureSchema
from app.world.tables import ItemTable, UserTable, save_default_user, save_table
from recsys_tools.world.store.index import build_index, save_index

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CatalogFacts:
    """What the manifest says of a world's catalog and its index."""

    schema_version: int
    embedding_dim: int
    items: int
    users: int
    index: str  # the factory asked for
    index_ntotal: int
    index_build_seconds: float

    def manifest(self) -> dict[str, Any]:
        return asdict(self)


def write_catalog(
    world: Path, schema: FeatureSchema, items: ItemTable, users: UserTable, index_factory: str
) -> CatalogFacts:
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
    return CatalogFacts(
        schema_version=schema.version,
        embedding_dim=schema.embedding_dim,
        items=len(items.ids),
        users=len(users.ids),
        index=index_factory,
        index_ntotal=int(index.ntotal),
        index_build_seconds=round(time.perf_counter() - started, 2),
    )
