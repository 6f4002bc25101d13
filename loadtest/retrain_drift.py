"""What retraining buys on a log whose tastes drift day by day: the world retrained on the
archive against the world left frozen, judged on the next day's hit@10.

`python -m loadtest.retrain_drift [--out docs/benchmarks.json]` generates the log
(recsys_tools.world.generate.drift.daily_drift: each day a user may move to another interest
group), builds the frozen world from its first 30 days as `recsys build-world` does, writes
the next 7 days into an archive as recsys-archive writes them (ratings), runs `recsys retrain`
(base log plus the archive's window, judged against the frozen world on its latest day), and
asks both worlds, from their files, for the users of the day after: the share with one of that
day's new positives in their ten.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from recsys_tools.retrain import RetrainPlan, base_rows, hit_at_k, retrain
from recsys_tools.world.generate.drift import DailyDrift, daily_drift
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.log import LogColumns
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.archive.rows import EVENTS_SCHEMA, Kind
from app.archive.store import ArchiveStore
from app.release.schema import load_schema
from loadtest.record import record

COLUMNS = LogColumns(weight="rating", min_weight=4.0)
K = 10


def write_archive(root: Path, rows: list[tuple[str, str, float, int]]) -> int:
    """The rows as the archive keeps rating events."""
    events = [
        {
            "event_id": f"r{n}",
            "user_id": user,
            "item_id": item,
            "type": "rating",
            "ts_ms": ts * 1000,
            "value": rating,
            "answer_id": None,
            "entry": "0-0",
        }
        for n, (user, item, rating, ts) in enumerate(rows)
    ]
    ArchiveStore(str(root)).write(Kind.EVENTS, pa.Table.from_pylist(events, schema=EVENTS_SCHEMA))
    return len(events)


def _table(rows: list[tuple[str, str, float, int]]) -> pa.Table:
    users, items, ratings, times = zip(*rows, strict=True)
    return pa.table(
        {
            "user_id": list(users),
            "item_id": list(items),
            "timestamp": [int(t) for t in times],
            "weight": list(ratings),
        }
    )


def measure(folder: Path, seed: int) -> dict[str, Any]:
    drift: DailyDrift = daily_drift(seed)
    base = drift.write_history(folder / "history.csv")
    frozen = folder / "frozen"
    started = time.perf_counter()
    recipe = WorldRecipe(interactions=base, columns=COLUMNS, seed=seed)
    build_world_from_log(recipe, frozen, load_schema(interactions_schema_path()))
    frozen_s = time.perf_counter() - started
    archived = write_archive(folder / "archive", drift.later)
    plan = RetrainPlan(
        interactions=base,
        columns=COLUMNS,
        archive=str(folder / "archive"),
        serving=frozen,
        worlds=folder / "worlds",
        window_days=7,
        seed=seed,
    )
    report = retrain(plan)
    history = pa.concat_tables([base_rows(plan), _table(drift.later)])
    next_day = _table(drift.next_day)
    judged = {
        "frozen": hit_at_k(frozen, history, next_day, K, 4.0),
        "retrained": hit_at_k(Path(report["world"]), history, next_day, K, 4.0),
    }
    hit = f"hit@{K}"
    return {
        "command": "python -m loadtest.retrain_drift",
        "seed": seed,
        "rows": {
            "history": len(drift.history),
            "archive": archived,
            "next_day": len(drift.next_day),
        },
        "next_day": judged,
        "retrained_over_frozen": round(judged["retrained"][hit] / judged["frozen"][hit], 3),
        "retrain_report": {
            "held_out_day": report["held_out_day"],
            "evaluation": report["evaluation"],
            "outcome": report["outcome"],
            "seconds": report["seconds"],
        },
        "frozen_build_s": round(frozen_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="merge the figures into this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(Path(folder), args.seed)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "retrain_drift", figures)


if __name__ == "__main__":
    main()
