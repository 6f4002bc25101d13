"""What the consumer knows of the world being served: its items, their vectors, its
fold-in parameters and the user blob's layout. Loaded at start, and again when Redis is
found holding another world (app.ingest.consumer follows it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.clients.catalog_log import CatalogLog
from app.clients.catalog_reader import LogReader
from app.core.membership import lookup
from app.core.vocabulary import Positions
from app.ingest.foldin import FoldIn
from app.ingest.item_step import ItemStep, item_step
from app.release.arrivals import make_room
from app.world.foldin import PLAIN, FoldInParams, Weighting, load_foldin
from app.world.layout import DEFAULT_USER_FILE, ITEMS_FILE, SEEN_FILE, USERS_FILE
from app.world.schema import FeatureSchema

log = logging.getLogger("recsys.ingest")
FloatArray = npt.NDArray[np.float32]
# Dense user features the consumer keeps current, by the names the world build gives them
# (tools' derive registry): activity from the count of positives, recency as "just now".
ONLINE_FEATURES = ("activity", "recency")
CATALOG_READ_S = 2.0


@dataclass(frozen=True, slots=True)
class IngestWorld:
    world_id: str  # "" for a world built before stamping
    schema: FeatureSchema
    item_ids: npt.NDArray[np.str_]
    id_order: npt.NDArray[np.intp]
    fold: FoldIn
    params: FoldInParams
    default_blob: FloatArray
    # The items put while serving, and the log they come from (app.clients.catalog_log).
    arrivals: LogReader | None = None
    # How an added item's vector follows the users who choose it; None without arrivals.
    step: ItemStep | None = None

    @property
    def size(self) -> int:
        """The world's items: an added item's position is at least this."""
        return len(self.item_ids)

    @property
    def catalog_size(self) -> int:
        """The world's items and those added up to the last change read: a stored list may
        name any position below it."""
        return self.size if self.arrivals is None else self.arrivals.room.size

    @property
    def blob_width(self) -> int:
        return self.schema.user_blob_width

    def lookup(self, ids: list[str]) -> Positions:
        found = lookup(self.item_ids, self.id_order, ids)
        if self.arrivals is None:
            return found
        return self.arrivals.room.known(found, ids, self.arrivals.room.rows)

    async def follow_catalog(self, timeout_s: float = CATALOG_READ_S) -> None:
        """Know the items put up to now: events may name them."""
        if self.arrivals is not None:
            await self.arrivals.catch_up(timeout_s)

    def refold(self, positives: Positions, blob: FloatArray | None) -> FloatArray:
        """The user's blob with their vector folded in from `positives`, and the activity
        features that follow from them (worlds built from a log only: theirs are known)."""
        k = self.schema.embedding_dim
        new = (self.default_blob if blob is None else blob).astype(np.float32, copy=True)
        new[:k] = self.fold.vector(positives)
        most = self.params.max_user_positives
        for offset, name in enumerate(self.schema.user_dense, start=k):
            if most <= 0 or name not in ONLINE_FEATURES:
                continue
            if name == "activity":
                new[offset] = min(1.0, float(np.log1p(len(positives)) / np.log1p(most)))
            else:
                new[offset] = 1.0
        return new


def load_ingest_world(
    world: Path,
    schema: FeatureSchema,
    world_id: str,
    changes: Callable[[str], CatalogLog] | None = None,
    headroom: int = 0,
    skipped: Callable[[], None] = lambda: None,
) -> IngestWorld:
    """The world's files; with `changes` and room for `headroom` added items, also the
    items its change log puts (read on the first batch; `skipped` hears of each batch that
    cannot be applied)."""
    with np.load(world / ITEMS_FILE) as items:
        item_ids = items["ids"].astype(np.str_)
        vectors = items["embeddings"].astype(np.float32)
        categories = items["categories"].astype(np.int64)
        published = items["published_at"].astype(np.int64)
    default_blob = np.load(world / DEFAULT_USER_FILE).astype(np.float32)
    params = load_foldin(world, len(item_ids))
    if params is None:
        log.warning("%s has no fold-in parameters: vectors are folded in with plain counts", world)
        params = PLAIN
    arrivals, step = None, None
    if changes is not None and headroom > 0:
        step = item_step_of(world, item_ids, vectors)
        room = make_room(categories, published, vectors, headroom, schema.item_blob_width)
        arrivals = LogReader(changes(world_id), room, skipped)
        vectors = room.vectors
        if params.weighting is Weighting.BM25 and len(params.idf):
            # An added item is as rare as the rarest: nobody chose it at the build.
            idf = np.full(room.rows, params.idf.max(), dtype=np.float32)
            idf[: len(params.idf)] = params.idf
            params = replace(params, idf=idf)
    return IngestWorld(
        world_id=world_id,
        schema=schema,
        item_ids=item_ids,
        id_order=np.argsort(item_ids, kind="stable"),
        fold=FoldIn(vectors, params),
        params=params,
        default_blob=default_blob,
        arrivals=arrivals,
        step=step,
    )


def item_step_of(world: Path, item_ids: npt.NDArray[np.str_], vectors: FloatArray) -> ItemStep:
    """The item step's constants, from the world's users and what they had seen."""
    with np.load(world / USERS_FILE) as users:
        user_ids = users["ids"].astype(np.str_)
        user_vectors = users["embeddings"].astype(np.float32)
    with np.load(world / SEEN_FILE) as seen:
        seen_users = seen["user_ids"].astype(np.str_)
        offsets = seen["offsets"].astype(np.int64)
        seen_items = seen["item_ids"].astype(np.str_)
    owners = lookup(user_ids, np.argsort(user_ids, kind="stable"), seen_users.tolist())
    positions = lookup(item_ids, np.argsort(item_ids, kind="stable"), seen_items.tolist())
    rows = np.repeat(owners, np.diff(offsets))
    kept = (rows >= 0) & (positions >= 0)
    per_user = np.bincount(rows[kept], minlength=len(user_ids))
    starts = np.concatenate([[0], np.cumsum(per_user)]).astype(np.int64)
    order = np.argsort(rows[kept], kind="stable")
    return item_step(user_vectors, vectors, starts, positions[kept][order])
