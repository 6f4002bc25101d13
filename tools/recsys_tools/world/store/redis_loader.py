"""Writing the world's user and item blobs (and seen lists) into Redis."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import numpy.typing as npt
import redis
from redis.cluster import RedisCluster

from app.clients.feature_store import (
    FLOAT32,
    ITEMS_VERSION_FIELD,
    WORLD_ID_FIELD,
    encode_seen,
    layout_meta,
)
from app.core.errors import RecsysError
from app.core.membership import lookup
from app.release.catalog import ITEMS_FILE, SEEN_FILE, USERS_FILE
from app.release.keyspace import KeySpace
from app.release.schema import FeatureSchema
from app.release.world import read_stamp, verify_files
from recsys_tools.world.store.files import (
    PositiveLists,
    SeenLists,
    load_items,
    load_positives,
    load_seen,
    load_users,
)

BATCH = 5_000
# A progress line at most this often, so a large load shows it is moving.
PROGRESS_EVERY_S = 2.0
log = logging.getLogger("recsys.load")


class RedisUnreachableError(RecsysError):
    """Redis did not answer the loader."""


@dataclass(frozen=True, slots=True)
class LoadReport:
    items: int
    users: int
    seen_lists: int

    def said(self) -> str:
        return (
            f"{self.items:,} item and {self.users:,} user feature blobs, "
            f"{self.seen_lists:,} histories"
        )


def _batches(pairs: Iterable[tuple[str, bytes]], size: int) -> Iterator[list[tuple[str, bytes]]]:
    iterator = iter(pairs)
    while batch := list(islice(iterator, size)):
        yield batch


def _blobs(
    keys: Iterable[str], embeddings: npt.NDArray[np.float32], dense: npt.NDArray[np.float32]
) -> Iterator[tuple[str, bytes]]:
    rows = np.ascontiguousarray(np.concatenate([embeddings, dense], axis=1), dtype=FLOAT32)
    for key, row in zip(keys, rows, strict=True):
        yield key, row.tobytes()


def _seen_lists(
    seen: SeenLists, item_ids: npt.NDArray[np.str_], keys: KeySpace
) -> Iterator[tuple[str, bytes]]:
    """Each user's history as the service reads it: catalog positions, oldest first.

    An empty history is written too, so that a reload clears what an older load left.
    """
    id_order = np.argsort(item_ids, kind="stable")
    at = np.searchsorted(item_ids, seen.item_ids, sorter=id_order)
    np.minimum(at, len(item_ids) - 1, out=at)
    positions = id_order[at]
    known = item_ids[positions] == seen.item_ids
    if not known.all():
        log.warning("%d seen entries name items the catalog lacks: left out", (~known).sum())
    for index, user_id in enumerate(seen.user_ids.tolist()):
        start, end = seen.offsets[index], seen.offsets[index + 1]
        history = positions[start:end][known[start:end]]
        yield keys.seen(user_id), encode_seen(history[::-1])  # stored newest first


def _positive_lists(
    positives: PositiveLists, item_ids: npt.NDArray[np.str_], keys: KeySpace
) -> Iterator[tuple[str, bytes]]:
    """Each user's positives as the consumer reads them: positions, oldest first."""
    id_order = np.argsort(item_ids, kind="stable")
    at = lookup(item_ids, id_order, positives.item_ids.tolist())
    for index, user_id in enumerate(positives.user_ids.tolist()):
        start, end = positives.offsets[index], positives.offsets[index + 1]
        history = at[start:end]
        yield keys.positives(user_id), encode_seen(history[history >= 0])


Client = redis.Redis | RedisCluster


def _write(client: Client, pairs: Iterable[tuple[str, bytes]], what: str, total: int) -> int:
    written = 0
    last_report = time.monotonic()
    for batch in _batches(pairs, BATCH):
        if isinstance(client, RedisCluster):
            client.mset_nonatomic(dict(batch))  # keys of many slots, one MSET per slot
        else:
            client.mset(dict(batch))
        written += len(batch)
        if time.monotonic() - last_report > PROGRESS_EVERY_S:
            log.info("%s: %d of %d written", what, written, total)
            last_report = time.monotonic()
    return written


def load_world_into_redis(
    world: Path, client: Client, schema: FeatureSchema, keys: KeySpace
) -> LoadReport:
    """Write every blob, then the layout record last: readers trust only complete loads.

    Redis that cannot be reached is a RedisUnreachableError naming the fix.
    """
    try:
        return _load(world, client, schema, keys)
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise RedisUnreachableError(
            f"cannot reach Redis ({exc}): start it, or point --redis-url at it"
        ) from None


def _load(world: Path, client: Client, schema: FeatureSchema, keys: KeySpace) -> LoadReport:
    stamp = read_stamp(world)
    if stamp is not None:
        verify_files(world, stamp, (ITEMS_FILE, USERS_FILE, SEEN_FILE))
    items = load_items(world)
    users = load_users(world)
    items.check(schema)
    users.check(schema)
    client.delete(keys.meta)
    n_items = _write(
        client,
        _blobs((keys.item(i) for i in items.ids.tolist()), items.embeddings, items.dense),
        "item features",
        len(items.ids),
    )
    n_users = _write(
        client,
        _blobs((keys.user(u) for u in users.ids.tolist()), users.embeddings, users.dense),
        "user features",
        len(users.ids),
    )
    seen = load_seen(world)
    seen_lists = 0
    if seen is not None:
        pairs = _seen_lists(seen, items.ids, keys)
        seen_lists = _write(client, pairs, "seen lists", len(seen.user_ids))
    positives = load_positives(world)
    if positives is not None:
        lists = _positive_lists(positives, items.ids, keys)
        _write(client, lists, "positives", len(positives.user_ids))
    meta = layout_meta(schema)
    # A new version on every load tells services holding the items in memory to re-read.
    meta[ITEMS_VERSION_FIELD] = f"{time.time_ns():x}-{secrets.token_hex(4)}"
    if stamp is not None:
        meta[WORLD_ID_FIELD] = stamp.world_id
    # redis-py annotates the mapping's key type invariantly; a dict[str, str] is what it takes.
    client.hset(keys.meta, mapping=meta)  # type: ignore[arg-type]
    return LoadReport(n_items, n_users, seen_lists)
