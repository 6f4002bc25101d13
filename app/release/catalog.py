"""The catalog as the service holds it: item ids and metadata, the FAISS index, defaults.

Read from the world's files (app.world.layout; docs/world-format.md), with room for the items
added while serving (app.release.arrivals).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.core.vocabulary import Positions
from app.release.added_cells import added_cells
from app.release.arrivals import CatalogRoom, make_room
from app.world.attributes import ItemAttributes, load_attributes
from app.world.item_prior import ItemPrior, load_item_prior
from app.world.layout import DEFAULT_USER_FILE, INDEX_FILE, ITEMS_FILE, PAGE_NEIGHBOURS_FILE
from app.world.neighbours import Neighbours, load_neighbours
from app.world.order import OrderModel, load_order
from app.world.prerank import PrerankWeights, load_prerank
from app.world.schema import FeatureSchema
from app.world.stored import reading


@dataclass(frozen=True, slots=True)
class Catalog:
    """Everything recall and rerank need about items, held in process memory."""

    item_ids: npt.NDArray[np.str_]
    categories: npt.NDArray[np.int64]
    published_at: npt.NDArray[np.int64]
    popular_order: npt.NDArray[np.int64]
    default_user_blob: npt.NDArray[np.float32]
    index: Any  # faiss.Index: the bindings carry no types
    # The item embeddings, and the item-to-item neighbours; None where a world or a test has
    # none. FP32: numpy converts half precision a hundred times slower than it multiplies,
    # which would cost pre-rank more than its whole score (measured: 180 of 210 us for 2,600
    # candidates); 128 bytes an item at 32 dimensions, 13 MB for 100k items.
    vectors: npt.NDArray[np.float32] | None = None
    # The neighbours hold the world's items only: one added while serving has none (what
    # users chose with it is the next build's to learn) and reads past their rows find none.
    neighbours: Neighbours | None = None
    # The item page's own list, where the build scored it by another model than the feed's
    # (app.world.neighbours); None: the page reads `neighbours`.
    page_neighbours: Neighbours | None = None
    prerank: PrerankWeights = field(default_factory=PrerankWeights)
    attributes: ItemAttributes = field(default_factory=ItemAttributes)
    # Items added while serving (app.release.arrivals): the arrays above are then views of
    # the room's, as long as the world's items and the added ones together.
    room: CatalogRoom | None = None
    # What an added item's vector is guessed from (app.world.item_prior); None: no guess.
    prior: ItemPrior | None = None
    # The order model over the world's items (app.world.order); None: the world has none.
    order: OrderModel | None = None

    @property
    def size(self) -> int:
        """Positions below this hold an item (or an added item's hole), world's or added."""
        return len(self.categories)

    @property
    def neighbours_for_pages(self) -> Neighbours | None:
        """The neighbours an item page reads: its own list, or the feed's."""
        return self.neighbours if self.page_neighbours is None else self.page_neighbours

    @property
    def world_size(self) -> int:
        """The items the world was built with: the FAISS index's rows."""
        return len(self.item_ids)

    @property
    def rows(self) -> int:
        """The positions any change may fill: the world's items and the room past them."""
        return self.size if self.room is None else self.room.rows

    def ids_at(self, positions: Positions) -> npt.NDArray[np.str_]:
        """The ids at `positions` (all below `size`)."""
        base = len(self.item_ids)
        if self.room is None or len(positions) == 0 or int(positions.max()) < base:
            ids: npt.NDArray[np.str_] = self.item_ids[positions]
            return ids
        added = positions >= base
        found = self.item_ids[np.where(added, 0, positions)].astype(object)
        found[added] = [self.room.id_at(p) for p in positions[added].tolist()]
        return found.astype(np.str_)


def in_room(catalog: Catalog, room: CatalogRoom) -> Catalog:
    """The catalog as the room holds it now: views up to its size, no copy."""
    size = room.size
    return replace(
        catalog,
        categories=room.categories[:size],
        published_at=room.published_at[:size],
        vectors=room.vectors[:size],
        attributes=replace(catalog.attributes, extra=room.attributes),
        room=room,
    )


def with_room(catalog: Catalog, capacity: int, blob_width: int) -> Catalog:
    """The catalog with room for `capacity` items added while serving (none at 0)."""
    if capacity <= 0:
        return catalog
    vectors = catalog.vectors
    if vectors is None:
        raise ConfigError("a catalog without item vectors cannot take items while serving")
    room = make_room(
        catalog.categories,
        catalog.published_at,
        vectors,
        capacity,
        blob_width,
    )
    room.cells = added_cells(catalog.index, room.rows)
    return in_room(catalog, room)


def _require(world: Path, name: str) -> Path:
    path = world / name
    if not path.is_file():
        raise ConfigError(
            f"{path} is missing: build the world first (recsys build-world, or build-demo)"
        )
    return path


def set_search_breadth(index: Any, nprobe: int) -> None:
    """Set nprobe on IVF indexes once, at load; flat indexes have nothing to set."""
    with contextlib.suppress(RuntimeError):
        faiss.extract_index_ivf(index).nprobe = nprobe


def read_index(path: Path, mmap: bool) -> Any:
    """The FAISS index; mapped, its pages are the page cache's, shared by every process."""
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as exc:
        raise ConfigError(f"{path} is not a FAISS index faiss can read: {exc}") from exc


def load_catalog(world: Path, schema: FeatureSchema, nprobe: int, mmap: bool = False) -> Catalog:
    items_path = _require(world, ITEMS_FILE)
    with reading(items_path), np.load(items_path) as items:
        item_ids = items["ids"].astype(np.str_)
        categories = items["categories"].astype(np.int64)
        published_at = items["published_at"].astype(np.int64)
        popularity = items["popularity"].astype(np.float64)
        vectors = np.ascontiguousarray(items["embeddings"], dtype=np.float32)
    index = read_index(_require(world, INDEX_FILE), mmap)
    default_path = _require(world, DEFAULT_USER_FILE)
    with reading(default_path):
        default_user = np.load(default_path).astype(np.float32)
    if index.ntotal != len(item_ids):
        raise ConfigError(f"index holds {index.ntotal} vectors but the catalog {len(item_ids)}")
    if index.d != schema.embedding_dim:
        raise ConfigError(f"index dimension {index.d} != schema embedding_dim")
    if default_user.shape != (schema.user_blob_width,):
        raise ConfigError(f"default user blob has shape {default_user.shape}")
    if not np.isfinite(default_user).all():
        # Every cold start and every fallback would pack it: NaN scores, dropped answers.
        raise ConfigError(f"{default_path} holds NaN or Inf: rebuild the world")
    set_search_breadth(index, nprobe)
    # Stable sort: equally popular items keep catalog order, so cold answers are deterministic.
    popular_order = np.argsort(-popularity, kind="stable").astype(np.int64)
    neighbours = load_neighbours(world, len(item_ids))
    page_neighbours = load_neighbours(world, len(item_ids), PAGE_NEIGHBOURS_FILE)
    order = load_order(world, len(item_ids), "order" in schema.sequence)
    return Catalog(
        item_ids,
        categories,
        published_at,
        popular_order,
        default_user,
        index,
        vectors,
        neighbours,
        page_neighbours,
        load_prerank(world),
        load_attributes(world, len(item_ids)),
        prior=load_item_prior(world, schema.embedding_dim, len(schema.item_dense)),
        order=order,
    )
