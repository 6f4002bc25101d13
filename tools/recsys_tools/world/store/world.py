"""A whole world written in one order, whichever engine learnt it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from app.world.attributes import save_attributes
from app.world.foldin import FoldInParams, save_foldin
from app.world.item_prior import ItemPrior, save_item_prior
from app.world.layout import MODEL_FILE, PAGE_NEIGHBOURS_FILE
from app.world.neighbours import Neighbours, save_neighbours
from app.world.order import OrderModel, save_order
from app.world.prerank import PrerankWeights, save_prerank
from app.world.schema import FeatureSchema
from app.world.tables import HeldOut, ItemTable, UserTable, save_holdout
from recsys_tools.world.store.catalog import write_catalog

Listed = TypeVar("Listed")


@dataclass(frozen=True, slots=True)
class WorldParts:
    """Every table and model of a world, learnt and ready to write, but the users' lists: an
    engine writes those its own way (from memory, or streamed from its cluster)."""

    items: ItemTable
    users: UserTable
    attributes: Mapping[str, npt.NDArray[np.str_]]
    foldin: FoldInParams
    neighbours: Neighbours
    page_neighbours: Neighbours | None  # the item page's own list; None: it reads the feed's
    prior: ItemPrior
    prior_report: dict[str, Any]  # how the prior was fitted, kept in the manifest
    prerank: PrerankWeights
    model: bytes  # model.onnx
    held_out: HeldOut  # the ranker's rows it never learnt from
    order: OrderModel | None = None  # the order model, where the schema declares its signal


@dataclass(frozen=True, slots=True)
class Written(Generic[Listed]):
    """What writing a world returned: what `write_lists` did, and what the manifest says of
    the files written (the build stamps it, once, with the rest)."""

    listed: Listed
    manifest: dict[str, Any]


def write_world(
    world: Path,
    schema: FeatureSchema,
    parts: WorldParts,
    index_factory: str,
    write_lists: Callable[[Path], Listed],
) -> Written[Listed]:
    """The world's files, and what `write_lists` (the users' lists) returned.

    The catalog goes first: writing it clears what an earlier build left in the directory.
    Neither the stamp nor the manifest is written here; the build stamps the world once its
    report is beside it.
    """
    catalog = write_catalog(world, schema, parts.items, parts.users, index_factory)
    save_attributes(world, parts.attributes)
    listed = write_lists(world)
    save_foldin(world, parts.foldin)
    save_neighbours(world, parts.neighbours)
    if parts.page_neighbours is not None:
        save_neighbours(world, parts.page_neighbours, PAGE_NEIGHBOURS_FILE)
    save_item_prior(world, parts.prior)
    save_prerank(world, parts.prerank)
    if parts.order is not None:
        save_order(world, parts.order)
    (world / MODEL_FILE).write_bytes(parts.model)
    save_holdout(world, parts.held_out)
    return Written(listed, {**catalog.manifest(), "item_prior": parts.prior_report})
