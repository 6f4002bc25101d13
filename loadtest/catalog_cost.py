"""The API's CPU per /recommend with a tenth of the catalog added while serving, against a
catalog of the same size built offline.

`python -m loadtest.catalog_cost [--items 100000] [--rounds 4] [--out docs/benchmarks.json]`
builds two demo worlds from one generator: one of `items` items (all built offline), one of
nine tenths of them, to which the rest is added through `POST /catalog/items` (copies of
its own items' features with a little noise: the same kind of item, new ids). Both are
served at once, each on its own local stack (real Redis and Triton), and the same open-loop
load goes to one then the other, round after round, in alternating order; the API
process's CPU time is read around each turn. The figure is the ratio of the medians, added
over offline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from recsys_tools.demo import StackOptions, local_stack, stack_options
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world

from app.world.layout import ITEM_PRIOR_FILE, ITEMS_FILE, MANIFEST_FILE
from app.world.schema import load_schema
from loadtest.compare_checkouts import api_cpu_ms
from loadtest.openloop import Load, demo_bodies, run
from loadtest.record import record
from loadtest.service import ApiProcess, api_on

log = logging.getLogger("loadtest.catalog_cost")
WARMUP_S = 3.0
BATCH = 1000


def _world(folder: Path, items: int, users: int) -> Path:
    world = folder / f"world-{items}"
    if not (world / MANIFEST_FILE).is_file():
        size = DemoSize(items=items, users=users, impressions=users * 10)
        build_demo_world(world, load_schema(), size, seed=7)
    return world


def _copies(world: Path, count: int, seed: int) -> list[dict[str, Any]]:
    """`count` new items, each a copy of one of the world's with a little noise."""
    schema = load_schema()
    rng = np.random.default_rng(seed)
    with np.load(world / ITEMS_FILE) as stored:
        vectors = stored["embeddings"].astype(np.float32)
        dense = stored["dense"].astype(np.float32)
        codes = stored["categories"].astype(np.int64)
    with np.load(world / ITEM_PRIOR_FILE) as stored:
        names = [str(name) for name in stored["category_names"].tolist()]
    copies = []
    for n, source in enumerate(rng.integers(0, len(vectors), size=count).tolist()):
        vector = vectors[source] + rng.normal(0.0, 0.05, size=vectors.shape[1])
        copies.append(
            {
                "item_id": f"added-{n}",
                "title": f"Added {n}",
                "categories": [names[codes[source]]],
                "embedding": [float(v) for v in vector],
                "dense": dict(zip(schema.item_dense, map(float, dense[source]), strict=True)),
            }
        )
    return copies


def _add(api: ApiProcess, items: list[dict[str, Any]]) -> None:
    with httpx.Client(base_url=api.url, timeout=60.0) as client:
        for start in range(0, len(items), BATCH):
            put = client.post("/catalog/items", json={"items": items[start : start + BATCH]})
            put.raise_for_status()


async def _rounds(
    apis: dict[str, ApiProcess], rate: float, duration_s: float, rounds: int
) -> dict[str, list[float]]:
    bodies = demo_bodies(1000, 20)
    for api in apis.values():
        await run(Load(f"{api.url}/recommend", bodies), rate, WARMUP_S)
    figures: dict[str, list[float]] = {name: [] for name in apis}
    for number in range(rounds):
        turns = list(apis) if number % 2 == 0 else list(reversed(apis))
        for name in turns:
            figures[name].append(round(await api_cpu_ms(apis[name], bodies, rate, duration_s), 3))
    return figures


def measure(
    folder: Path, items: int, rate: float, duration_s: float, rounds: int
) -> dict[str, Any]:
    users = 20_000
    whole, part = _world(folder, items, users), _world(folder, items * 9 // 10, users)
    added = _copies(part, items - items * 9 // 10, seed=3)
    with ExitStack() as stack:
        apis: dict[str, ApiProcess] = {}
        for name, world in (("offline", whole), ("added_online", part)):
            # Two stacks at once: each its own model repository and servers' files.
            template = stack_options(world).model_template
            options = StackOptions(world, template, folder.resolve() / f"run-{name}")
            running = stack.enter_context(local_stack(options))
            log_path = options.run_dir / f"api-{name}.log"
            apis[name] = stack.enter_context(
                api_on(running, log_path, catalog_headroom=str(len(added) + 100))
            )
        _add(apis["added_online"], added)
        figures = asyncio.run(_rounds(apis, rate, duration_s, rounds))
    offline, online = (statistics.median(figures[k]) for k in ("offline", "added_online"))
    return {
        "items": items,
        "added_online": len(added),
        "rate": rate,
        "duration_s": duration_s,
        "cpu_ms_per_request": figures,
        "median_ms": {"offline": offline, "added_online": online},
        "added_over_offline": round(online / offline, 3),
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path("var/catalog_cost"))
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s, open loop")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds a turn")
    parser.add_argument("--rounds", type=int, default=4, help="turns each")
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    figures = measure(args.folder, args.items, args.rate, args.duration, args.rounds)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "catalog_cost", figures)


if __name__ == "__main__":
    main()
