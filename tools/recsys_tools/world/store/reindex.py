"""A world's index rebuilt beside it: a copy of the world that a running service can reload.

The copy keeps the world's id, its items and every other file (hard links where the file
system allows, so a large world costs little disk), with a new index and its digest in the
manifest. Point the service's artifacts directory (a symlink) at the copy and reload.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from app.core.errors import ConfigError
from app.world.layout import INDEX_FILE, MANIFEST_FILE
from app.world.manifest import read_manifest, update_manifest
from app.world.stamp import file_digest, read_stamp
from app.world.tables import load_items
from recsys_tools.world.store.index import build_index, save_index


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def reindex_beside(world: Path, out: Path, factory: str) -> str:
    """Write the copy to `out` (which must not exist); return the world id it keeps."""
    stamp = read_stamp(world)
    if stamp is None:
        raise ConfigError(f"{world} carries no world id: rebuild it (recsys build-world)")
    if out.exists():
        raise ConfigError(f"{out} exists: choose a new directory for the rebuilt world")
    # Every file is linked but the two this rewrites: the manifest in place, so it is copied;
    # the index by a rename, which leaves the linked original alone.
    shutil.copytree(world, out, copy_function=_link_or_copy, ignore=_manifest)
    shutil.copy2(world / MANIFEST_FILE, out / MANIFEST_FILE)
    items = load_items(out)
    save_index(out, build_index(items.embeddings, factory))
    files = {**read_manifest(out).files, INDEX_FILE: file_digest(out / INDEX_FILE)}
    update_manifest(out, files=files)
    return stamp.world_id


def _manifest(directory: str, names: list[str]) -> list[str]:
    return [MANIFEST_FILE] if MANIFEST_FILE in names else []
