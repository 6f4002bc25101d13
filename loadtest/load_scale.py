"""How fast `load-redis` writes a world of many users into a real Redis, by --workers.

A world of --users generated users (their factors, dense features, a seen list and positives
of --history items each) is written beside a small demo world's catalog with the streamed
writer the Spark engine uses, stamped, and loaded into a redis-server started here, once
per worker count, each into an emptied Redis. Figures: users (and keys) written a second,
and the time a world of tens of millions of users would take at that rate.

    python -m loadtest.load_scale --users 2000000 --workers 1,4,8
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import redis
from recsys_tools.localstack import start_redis
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world
from recsys_tools.world.store.identity import stamp_world
from recsys_tools.world.store.npz_stream import NpzStream
from recsys_tools.world.store.redis_loader import load_world_into_redis

from app.release.keyspace import KeySpace
from app.world.layout import ITEMS_FILE, MANIFEST_FILE, POSITIVES_FILE, SEEN_FILE, USERS_FILE
from app.world.schema import FeatureSchema, load_schema

CHUNK = 100_000


def _chunks(total: int, make: object) -> Iterator[np.ndarray]:
    for start in range(0, total, CHUNK):
        yield make(start, min(start + CHUNK, total))  # type: ignore[operator]


def write_world(folder: Path, users: int, history: int, schema: FeatureSchema) -> Path:
    world = folder / f"world-{users}"
    if (world / MANIFEST_FILE).is_file():
        return world
    build_demo_world(world, schema, DemoSize(2_000, 100, 1_000), "auto", 7)
    with np.load(world / ITEMS_FILE) as items:
        item_ids = items["ids"]
    rng = np.random.default_rng(1)
    width = len(str(users)) + 1
    ids_dtype = np.dtype(f"<U{width}")

    def ids(start: int, end: int) -> np.ndarray:
        return np.char.add("u", np.arange(start, end).astype(str)).astype(ids_dtype)

    dim, dense = schema.embedding_dim, len(schema.user_dense)
    with NpzStream(world / USERS_FILE) as out:
        out.array("ids", ids_dtype, (users,), _chunks(users, ids))
        out.array("embeddings", np.float32, (users, dim),
                  _chunks(users, lambda s, e: rng.normal(size=(e - s, dim))))  # fmt: skip
        out.array("dense", np.float32, (users, dense),
                  _chunks(users, lambda s, e: rng.random((e - s, dense))))  # fmt: skip
    offsets = np.arange(users + 1, dtype=np.int64) * history

    def picked(start: int, end: int) -> np.ndarray:
        chosen: np.ndarray = item_ids[rng.integers(0, len(item_ids), end - start)]
        return chosen

    for name in (SEEN_FILE, POSITIVES_FILE):
        with NpzStream(world / name) as out:
            out.array("user_ids", ids_dtype, (users,), _chunks(users, ids))
            out.array("offsets", np.int64, offsets.shape, [offsets])
            out.array(
                "item_ids", item_ids.dtype, (users * history,), _chunks(users * history, picked)
            )
    stamp_world(world, schema)
    return world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=2_000_000)
    parser.add_argument("--history", type=int, default=20)
    parser.add_argument("--workers", default="1,4,8")
    parser.add_argument("--out", type=Path, default=Path("var/load_scale"))
    args = parser.parse_args()
    schema = load_schema()
    world = write_world(args.out, args.users, args.history, schema)
    process, url = start_redis(args.out / "redis")
    client = redis.Redis.from_url(url)
    results = []
    try:
        for workers in [int(n) for n in args.workers.split(",")]:
            client.flushall(asynchronous=True)
            started = time.perf_counter()
            report = load_world_into_redis(world, client, schema, KeySpace("recsys"), workers)
            seconds = time.perf_counter() - started
            keys = int(client.dbsize())
            results.append(
                {
                    "workers": workers,
                    "users": report.users,
                    "keys": keys,
                    "seconds": round(seconds, 1),
                    "users_per_s": round(report.users / seconds),
                    "keys_per_s": round(keys / seconds),
                    "minutes_for_50m_users": round(50_000_000 / (report.users / seconds) / 60, 1),
                    "redis_used_mb": round(int(client.info("memory")["used_memory"]) / 2**20),
                }
            )
            print(json.dumps(results[-1]), flush=True)
    finally:
        client.close()
        process.stop()
        shutil.rmtree(args.out / "redis", ignore_errors=True)
    (args.out / "load.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
