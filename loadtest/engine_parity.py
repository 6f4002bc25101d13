"""Both engines on one split of a public ratings set: the served worlds' recall@10 side by side.

`python -m loadtest.engine_parity --data DIR [--set latest-small] [--seeds 3]` cuts each
user's ratings in time (`recsys split-log`'s cut: the first 80% earlier), builds a world from
the earlier part with the local engine and with `--engine spark` (local[2]), and scores, for
every user with later positives, the list each world's files give them (what the service
answers, item for item: served_quality checks that) against those later positives. The
target: the Spark world's recall@10 within 5% of the local world's. Figures print as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from recsys_tools.live_evaluation import from_files, questions, score
from recsys_tools.world.judge.answers import AskContext
from recsys_tools.world.judge.split import write_split
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.log import LogColumns, read_log
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.on_spark import build_world_on_spark
from recsys_tools.world.recipes.recipe import WorldRecipe
from recsys_tools.world.spark.session import SparkSettings

from app.world.schema import load_schema
from loadtest.served_quality import MIN_RATING, SETS, SHARE

K = 10


def measure(name: str, data: Path, folder: Path, seed: int) -> dict[str, Any]:
    public = SETS[name]
    split = write_split(
        read_log(data / public.ratings, public.columns), SHARE, folder, "rating", seed=seed
    )
    columns = LogColumns(weight="rating", min_weight=MIN_RATING)
    recipe = WorldRecipe(
        interactions=split.earlier,
        columns=columns,
        items=data / public.items,
        item_columns=public.item_columns,
        seed=seed,
    )
    schema = load_schema(interactions_schema_path())
    asked = questions(read_log(split.later, columns), read_log(split.earlier, columns))
    users = [one.user for one in asked]
    figures: dict[str, Any] = {}
    for engine in ("local", "spark"):
        world = folder / f"world-{engine}"
        started = time.perf_counter()
        if engine == "local":
            build_world_from_log(recipe, world, schema)
        else:
            settings = SparkSettings("local[2]", (), 2_000_000)
            build_world_on_spark(recipe, str(split.earlier), world, schema, settings)
        figures[engine] = {
            "build_seconds": round(time.perf_counter() - started, 1),
            **score(asked, from_files(world, users, AskContext()), K),
        }
    key = f"recall@{K}"
    return {
        "set": name,
        "seed": seed,
        **figures,
        "spark_over_local": round(figures["spark"][key] / figures["local"][key], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # The Spark engine takes logs with times only.
    timed = sorted(name for name, public in SETS.items() if public.timed)
    parser.add_argument("--set", choices=timed, default="latest-small")
    parser.add_argument("--data", type=Path, required=True, help="the folder with its files")
    parser.add_argument("--folder", type=Path, default=Path("var/engine_parity"))
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args()
    runs = []
    for seed in range(7, 7 + args.seeds):
        runs.append(measure(args.set, args.data, args.folder / f"seed-{seed}", seed))
        print(json.dumps(runs[-1]), flush=True)
    ratios = [run["spark_over_local"] for run in runs]
    print(json.dumps({"median_spark_over_local": statistics.median(ratios), "ratios": ratios}))


if __name__ == "__main__":
    main()
