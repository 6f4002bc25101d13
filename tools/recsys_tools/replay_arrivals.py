"""Items a replayed log names that the served world lacks: each put into the catalog, with its
title and categories from the item table, just before its first row, as a shop adds a
product before anyone can buy it (`recsys replay`, unless --static-catalog)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.world.layout import ITEM_PRIOR_FILE, ITEMS_FILE
from recsys_tools.world.read.items import ItemInfo

# The catalog call takes at most this many categories an item.
MAX_CATEGORIES = 16


@dataclass(frozen=True, slots=True)
class WorldItems:
    """What the served world holds: its item ids, and the category names it knows."""

    ids: frozenset[str]
    categories: tuple[str, ...]


def world_items(world: Path) -> WorldItems:
    with np.load(world / ITEMS_FILE) as stored:
        ids = frozenset(stored["ids"].astype(str).tolist())
    prior = world / ITEM_PRIOR_FILE
    if not prior.is_file():
        return WorldItems(ids, ())
    with np.load(prior) as stored:
        names = tuple(str(name) for name in stored["category_names"].tolist())
    return WorldItems(ids, names)


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The puts to make before each row (by its index), and the ids that are new."""

    before: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    new: frozenset[str] = frozenset()
    unplaced: tuple[str, ...] = ()  # new ids the table gives no category the world knows


def _described(item: str, ts_s: int, table: ItemInfo | None, known: set[str]) -> dict[str, Any]:
    put: dict[str, Any] = {"item_id": item, "published_at": max(ts_s, 0)}
    if table is None:
        return put
    at = np.flatnonzero(table.ids == item)
    if not len(at):
        return put
    n = int(at[0])
    codes = table.category_codes[table.category_offsets[n] : table.category_offsets[n + 1]]
    names = [table.category_names[c] for c in codes.tolist()]
    put["categories"] = [name for name in names if name in known][:MAX_CATEGORIES]
    if table.titles is not None:
        put["title"] = str(table.titles[n])[:512]
    return put


def arrivals(
    items: Sequence[str], times: Sequence[int], world: WorldItems, table: ItemInfo | None
) -> Arrivals:
    """For rows naming `items` at `times` (in replay order): each item the world lacks, put
    just before the first row naming it."""
    before: dict[int, list[dict[str, Any]]] = {}
    placed: set[str] = set()
    unplaced: list[str] = []
    known = set(world.categories)
    for n, (item, ts_s) in enumerate(zip(items, times, strict=True)):
        if item in world.ids or item in placed or item in unplaced:
            continue
        put = _described(item, ts_s, table, known)
        if not put.get("categories"):  # the catalog call needs one the world knows
            unplaced.append(item)
            continue
        placed.add(item)
        before.setdefault(n, []).append(put)
    return Arrivals(before, frozenset(placed) | frozenset(unplaced), tuple(unplaced))
