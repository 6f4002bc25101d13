"""What each stage of the cascade buys, on generated logs: `build-world`'s evaluation per stage.

`python -m loadtest.cascade_quality [--seeds 3] [--networks dcn,mlp] [--out FILE]` generates
two logs for each seed, builds a world from each as `recsys build-world` does (once per
ranking network, on the same log), and reports each stage's figures (the share of held-out
items still in its pool, recall@10 and NDCG@10 of the list it would serve) beside the
item-to-item and popularity baselines, each head's AUC, and the median over seeds of the
ratio the target is set in: recall + pre-rank + rank against recall alone.

- sessions (recsys_tools.world.generate.sessions): users rate items in sessions of one theme; what
  they rate next is told by what they rated last; its item table gives each item's genre;
- drift (recsys_tools.world.generate.drift, its history): each user rates a few items of one group;
  nothing sequential to find, where the cascade must not lose to recall.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from recsys_tools.world.generate.drift import write_drift_log
from recsys_tools.world.generate.sessions import write_session_items, write_session_log
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.items import ItemColumns
from recsys_tools.world.read.log import LogColumns
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.world.schema import load_schema
from loadtest.record import record

COLUMNS = LogColumns(weight="rating", min_weight=4.0)


def _figures(
    log: Path,
    world: Path,
    seed: int,
    network: str,
    items: Path | None = None,
    compare_inputs: bool = False,
) -> dict[str, Any]:
    recipe = WorldRecipe(
        interactions=log,
        columns=COLUMNS,
        seed=seed,
        network=network,
        items=items,
        item_columns=ItemColumns(category="genre"),
        compare_inputs=compare_inputs,
    )
    report = build_world_from_log(recipe, world, load_schema(interactions_schema_path()))
    evaluation = report["evaluation"]
    stages = evaluation["stages"]
    return {
        "stages": stages,
        "item_knn": evaluation["methods"]["item_knn"],
        "popularity": evaluation["methods"]["popularity"],
        "rank_over_recall_ndcg": round(stages["rank"]["ndcg@10"] / stages["recall"]["ndcg@10"], 3),
        "rank_over_item_knn_ndcg": round(
            stages["rank"]["ndcg@10"] / evaluation["methods"]["item_knn"]["ndcg@10"], 3
        ),
        "network": report["ranker"]["network"],
        "inputs": report["inputs"],
        "prerank": report["ranker"]["prerank"],
        "blend": report["ranker"]["blend"],
        "build_seconds": report["seconds"]["total"],
    }


def _inputs(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each compared input's median NDCG@10 change against everything, over the runs."""
    changes: dict[str, list[float]] = {}
    for run in runs:
        for row in run["inputs"]["compared"]:
            changes.setdefault(row["input"], []).append(row["change"])
    return {name: round(statistics.median(values), 4) for name, values in changes.items()}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "median_ndcg_change_by_input": _inputs(runs),
        "median_rank_ndcg": statistics.median(run["stages"]["rank"]["ndcg@10"] for run in runs),
        "median_rank_over_recall_ndcg": statistics.median(
            run["rank_over_recall_ndcg"] for run in runs
        ),
        "median_rank_over_item_knn_ndcg": statistics.median(
            run["rank_over_item_knn_ndcg"] for run in runs
        ),
        "runs": runs,
    }


def measure(
    folder: Path, seeds: list[int], networks: list[str], compare_inputs: bool = False
) -> dict[str, Any]:
    logs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {network: [] for network in networks} for name in ("sessions", "drift")
    }
    for seed in seeds:
        here = folder / f"seed{seed}"
        sessions = write_session_log(here / "sessions.csv", seed=seed)
        genres = write_session_items(here / "items.csv")
        drift = write_drift_log(here / "drift", seed=seed)
        for network in networks:
            logs["sessions"][network].append(
                _figures(
                    sessions, here / f"sessions-{network}", seed, network, genres, compare_inputs
                )
            )
            logs["drift"][network].append(
                _figures(drift.history, here / f"drift-{network}", seed, network)
            )
    return {
        "command": "python -m loadtest.cascade_quality",
        "seeds": seeds,
        **{
            name: {network: _summary(runs) for network, runs in by_network.items()}
            for name, by_network in logs.items()
        },
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--networks", default="dcn,mlp", help="the ranking networks to build, side by side"
    )
    parser.add_argument(
        "--compare-inputs",
        action="store_true",
        help="evaluate the sessions log without its item table and each feature group too",
    )
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(
            Path(folder),
            list(range(3, 3 + args.seeds)),
            args.networks.split(","),
            args.compare_inputs,
        )
    print(json.dumps({k: v for k, v in figures.items()}, indent=2))
    if args.out is not None:
        record(args.out, "cascade", figures)


if __name__ == "__main__":
    main()
