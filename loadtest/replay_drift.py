"""What real time buys on a log whose tastes drift: `recsys replay` with and without events.

`python -m loadtest.replay_drift [--out docs/benchmarks.json]` generates the log
(recsys_tools.world.generate.drift), builds a world from its history as `recsys build-world` does,
serves it on the local stack with a real recsys-ingest, and replays the later part twice on
one Redis load: first posting nothing (the static figure), then posting each row after
asking (real time). The ratio of the two hit@10 is the figure docs/realtime.md shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from recsys_tools.demo import LocalStack
from recsys_tools.localstack import start_ingest
from recsys_tools.replay import ReplayRow, replay, rows_in_time_order
from recsys_tools.world.generate.drift import write_drift_log
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.log import LogColumns, read_log
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.world.schema import load_schema
from loadtest.record import record
from loadtest.service import local_service

log = logging.getLogger("loadtest.replay_drift")
COLUMNS = LogColumns(weight="rating", min_weight=4.0)


def replay_twice(
    url: str, stack: LocalStack, world: Path, folder: Path, rows: list[ReplayRow], k: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rows replayed posting nothing, then again posting each (a real recsys-ingest
    applies them), on one Redis load: the static figure and the real-time one."""
    settings = {"RECSYS_REDIS_URL": stack.settings.redis_url, "RECSYS_ARTIFACTS_DIR": str(world)}
    consumer = start_ingest(settings, folder / "ingest")
    try:
        static = asyncio.run(replay(url, rows, k, events=False))
        live = asyncio.run(replay(url, rows, k, events=True))
    finally:
        consumer.stop()
    return static, live


def measure(folder: Path, k: int, seed: int) -> dict[str, Any]:
    drift = write_drift_log(folder, seed=seed)
    world = folder / "world"
    recipe = WorldRecipe(interactions=drift.history, columns=COLUMNS, seed=seed)
    build_world_from_log(recipe, world, load_schema(interactions_schema_path()))
    rows = rows_in_time_order(read_log(drift.later, COLUMNS), drift.since)
    with local_service(world) as (api, stack):
        static, live = replay_twice(api.url, stack, world, folder, rows, k)
    hit = f"hit@{k}"
    return {
        "log": "generated, drifting tastes (recsys_tools/world/generate/drift.py)",
        "rows_replayed": len(rows),
        "static": static,
        "with_events": live,
        "hit_ratio": round(live[hit] / static[hit], 3) if static[hit] else None,
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path("var/drift"))
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    figures = measure(args.folder, args.k, args.seed)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "replay", figures)


if __name__ == "__main__":
    main()
