"""Writing the world's user and item blobs (and seen lists) into Redis."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import numpy.typing as npt
import redis
from redis.cluster import RedisCluster

from app.clients.feature_store import FLOAT32, KeySpace, layout_meta
from app.schema import FeatureSchema
from recsys_tools.world.files import load_items, load_seen, load_users

BATCH = 5_000


@dataclass(frozen=True, slots=True)
class LoadReport:
    items: int
    users: int
    seen_lists: int


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


Client = redis.Redis | RedisCluster


def _write(client: Client, pairs: Iterable[tuple[str, bytes]]) -> int:
    written = 0
    for batch in _batches(pairs, BATCH):
        if isinstance(client, RedisCluster):
            client.mset_nonatomic(dict(batch))  # keys of many slots, one MSET per slot
        else:
            client.mset(dict(batch))
        written += len(batch)
    return written


def load_world_into_redis(
    world: Path, client: Client, schema: FeatureSchema, keys: KeySpace
) -> LoadReport:
    """Write every blob, then the layout record last: readers trust only complete loads."""
    items = load_items(world)
    users = load_users(world)
    items.check(schema)
    users.check(schema)
    client.delete(keys.meta)
    n_items = _write(
        client, _blobs((keys.item(i) for i in items.ids.tolist()), items.embeddings, items.dense)
    )
    n_users = _write(
        client, _blobs((keys.user(u) for u in users.ids.tolist()), users.embeddings, users.dense)
    )
    seen_lists = 0
    seen = load_seen(world)
    if seen is not None:
        pipe = client.pipeline(transaction=False)
        for position, user_id in enumerate(seen.user_ids.tolist()):
            start, end = seen.offsets[position], seen.offsets[position + 1]
            key = keys.seen(user_id)
            pipe.delete(key)
            if end > start:
                pipe.rpush(key, *seen.item_ids[start:end].tolist())
                seen_lists += 1
            if len(pipe) >= BATCH:
                pipe.execute()
        pipe.execute()
    # redis-py annotates the mapping's key type invariantly; a dict[str, str] is what it takes.
    client.hset(keys.meta, mapping=layout_meta(schema))  # type: ignore[arg-type]
    return LoadReport(n_items, n_users, seen_lists)
