"""Writing the world's user and item blobs (and seen lists) into Redis.

At scale: the user tables are read a chunk at a time from memory maps of their files (never
whole), the chunks are written by several threads in batches of MSETs, a progress line says
how far it is, and a load that stopped part-way resumes where it stopped (LoadProgress).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import cast

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
from app.release.keyspace import KeySpace
from app.world.layout import ITEMS_FILE, POSITIVES_FILE, SEEN_FILE, USERS_FILE
from app.world.schema import FeatureSchema
from app.world.stamp import read_stamp, verify_files
from app.world.tables import SeenLists, UserTable, load_items
from recsys_tools.world.store.npz_stream import mapped

# Seen and positive lists share a layout: users, offsets, items.
Lists = SeenLists
StrArray = npt.NDArray[np.str_]
FloatArray = npt.NDArray[np.float32]
BATCH = 5_000
# Users (or items) per chunk: the unit a thread writes and a resumed load skips.
CHUNK = 20_000
# Threads writing at once, each with its MSETs in flight.
WORKERS = 4
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
    seen: Lists, item_ids: npt.NDArray[np.str_], keys: KeySpace
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
    positives: Lists, item_ids: npt.NDArray[np.str_], keys: KeySpace
) -> Iterator[tuple[str, bytes]]:
    """Each user's positives as the consumer reads them: positions, oldest first."""
    id_order = np.argsort(item_ids, kind="stable")
    at = lookup(item_ids, id_order, positives.item_ids.tolist())
    for index, user_id in enumerate(positives.user_ids.tolist()):
        start, end = positives.offsets[index], positives.offsets[index + 1]
        history = at[start:end]
        yield keys.positives(user_id), encode_seen(history[history >= 0])


Client = redis.Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class KeyChunks:
    """One kind of key to write, in chunks of rows: `pairs(start, end)` makes rows
    start..end's keys and values."""

    name: str
    rows: int
    pairs: Callable[[int, int], Iterator[tuple[str, bytes]]]


class LoadProgress:
    """Which chunks of which world are in Redis: a hash beside the layout record, so a load
    that stopped part-way (a killed loader, a lost connection) goes on where it stopped when
    run again on the same world, and is cleared once the load is whole."""

    def __init__(self, client: Client, keys: KeySpace, world_id: str | None) -> None:
        self._client, self._key, self._world = client, f"{keys.meta}:loading", world_id
        done: dict[bytes, bytes] = client.hgetall(self._key) if world_id else {}  # type: ignore[assignment]
        if done.get(b"world", b"").decode() != (world_id or ""):
            done = {}
        self.done = {key.decode() for key in done if key != b"world"}
        self._lock = threading.Lock()

    @property
    def resuming(self) -> bool:
        return bool(self.done)

    def start(self) -> None:
        self._client.delete(self._key)
        if self._world:
            self._client.hset(self._key, "world", self._world)

    def mark(self, chunk: str) -> None:
        if self._world:
            with self._lock:
                self._client.hset(self._key, chunk, "1")

    def clear(self) -> None:
        self._client.delete(self._key)


def _write_batches(client: Client, pairs: Iterable[tuple[str, bytes]]) -> int:
    written = 0
    for batch in _batches(pairs, BATCH):
        if isinstance(client, RedisCluster):
            client.mset_nonatomic(dict(batch))  # keys of many slots, one MSET per slot
        else:
            client.mset(dict(batch))
        written += len(batch)
    return written


def _write_part(client: Client, part: KeyChunks, progress: LoadProgress, workers: int) -> int:
    """The part's chunks by `workers` threads (each MSET a round trip: several in flight keep
    Redis busy), each chunk marked done once written; a progress line every few seconds."""
    chunks = [(start, min(start + CHUNK, part.rows)) for start in range(0, part.rows, CHUNK)]
    todo = [(s, e) for s, e in chunks if f"{part.name}:{s}" not in progress.done]
    if len(todo) < len(chunks):
        log.info("%s: %d of %d chunks were written before: resuming", part.name,
                 len(chunks) - len(todo), len(chunks))  # fmt: skip
    written, started, shown = part.rows - sum(e - s for s, e in todo), time.monotonic(), 0.0

    def write(chunk: tuple[int, int]) -> int:
        count = _write_batches(client, part.pairs(*chunk))
        progress.mark(f"{part.name}:{chunk[0]}")
        return count

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for count in pool.map(write, todo):
            written += count
            elapsed = time.monotonic() - started
            if elapsed - shown > PROGRESS_EVERY_S:
                shown = elapsed
                rate = (written / elapsed) if elapsed else 0.0
                log.info("%s: %s of %s written (%s a second)", part.name, f"{written:,}",
                         f"{part.rows:,}", f"{rate:,.0f}")  # fmt: skip
    return part.rows


def load_world_into_redis(
    world: Path, client: Client, schema: FeatureSchema, keys: KeySpace, workers: int = WORKERS
) -> LoadReport:
    """Write every blob, then the layout record last: readers trust only complete loads.

    Redis that cannot be reached is a RedisUnreachableError naming the fix.
    """
    try:
        return _load(world, client, schema, keys, workers)
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise RedisUnreachableError(
            f"cannot reach Redis ({exc}): start it, or point --redis-url at it"
        ) from None


def _user_blobs(keys: KeySpace, world: Path, schema: FeatureSchema) -> KeyChunks:
    users = mapped(world / USERS_FILE)
    ids, embeddings, dense = users["ids"], users["embeddings"], users["dense"]
    UserTable(cast(StrArray, ids), cast(FloatArray, embeddings), cast(FloatArray, dense)).check(
        schema
    )

    def pairs(start: int, end: int) -> Iterator[tuple[str, bytes]]:
        names = (keys.user(u) for u in ids[start:end].tolist())
        return _blobs(names, np.asarray(embeddings[start:end]), np.asarray(dense[start:end]))

    return KeyChunks("user features", len(ids), pairs)


def _lists(
    name: str, path: Path, make: Callable[[Lists], Iterator[tuple[str, bytes]]]
) -> KeyChunks | None:
    """A seen or positives file's users, a chunk of users (and only their items) at a time."""
    if not path.is_file():
        return None
    table = mapped(path)
    user_ids, offsets, item_ids = table["user_ids"], table["offsets"], table["item_ids"]

    def pairs(start: int, end: int) -> Iterator[tuple[str, bytes]]:
        bounds = np.asarray(offsets[start : end + 1], dtype=np.int64)
        chunk = Lists(
            np.asarray(user_ids[start:end]),
            bounds - bounds[0],
            np.asarray(item_ids[bounds[0] : bounds[-1]]),
        )
        return make(chunk)

    return KeyChunks(name, len(user_ids), pairs)


def _load(
    world: Path, client: Client, schema: FeatureSchema, keys: KeySpace, workers: int
) -> LoadReport:
    stamp = read_stamp(world)
    if stamp is not None:
        verify_files(world, stamp, (ITEMS_FILE, USERS_FILE, SEEN_FILE))
    items = load_items(world)
    items.check(schema)
    users = _user_blobs(keys, world, schema)
    progress = LoadProgress(client, keys, None if stamp is None else stamp.world_id)
    client.delete(keys.meta)
    if not progress.resuming:
        progress.start()
    item_blobs = KeyChunks(
        "item features",
        len(items.ids),
        lambda s, e: _blobs(
            (keys.item(i) for i in items.ids[s:e].tolist()), items.embeddings[s:e], items.dense[s:e]
        ),
    )
    seen = _lists("seen lists", world / SEEN_FILE, lambda c: _seen_lists(c, items.ids, keys))
    positives = _lists(
        "positives", world / POSITIVES_FILE, lambda c: _positive_lists(c, items.ids, keys)
    )
    written = {}
    for part in (item_blobs, users, seen, positives):
        if part is not None:
            written[part.name] = _write_part(client, part, progress, workers)
    meta = layout_meta(schema)
    # A new version on every load tells services holding the items in memory to re-read.
    meta[ITEMS_VERSION_FIELD] = f"{time.time_ns():x}-{secrets.token_hex(4)}"
    if stamp is not None:
        meta[WORLD_ID_FIELD] = stamp.world_id
    # redis-py annotates the mapping's key type invariantly; a dict[str, str] is what it takes.
    client.hset(keys.meta, mapping=meta)  # type: ignore[arg-type]
    progress.clear()
    return LoadReport(
        written["item features"], written["user features"], written.get("seen lists", 0)
    )
