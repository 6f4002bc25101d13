"""What items arriving while serving buy: `recsys replay` with arrivals against the static
catalog, on a generated log whose catalog grows and on a public ratings set.

`python -m loadtest.replay_arrivals [--data DIR] [--out docs/benchmarks.json]`:

1. a log is cut at a date: the world is built from the rows before it, with an item table
   of only the items it holds by then (the catalog as it was that day);
2. the rows after it are replayed in time order through the live service (real Redis,
   Triton and ingest consumer), posting each as an event after asking: once with the
   catalog frozen (`--static-catalog`), once with every item the world lacks put into the
   catalog, with its title and categories, just before its first row. Each run on a fresh
   stack: events and catalog changes stay in Redis;
3. hit@10 of each, their ratio (the issue's target: 1.2x), the share of hits on the
   new items, and the share of positives on new items that no other user had touched
   before (only the item's attributes can find those: a bound on what arrivals buy).

Logs: generated (recsys_tools.world.generate.arrivals: items come out daily, users choose
mostly among the new), and with --data, the public movie-ratings set latest-small
(ratings.csv, movies.csv: never in the repository), cut where its last tenth of ratings
begins.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from recsys_tools.localstack import start_ingest
from recsys_tools.replay import ReplayRow, arrivals_for, replay, rows_in_time_order
from recsys_tools.world.generate.arrivals import write_arrival_log
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.items import ItemColumns, read_items
from recsys_tools.world.read.log import LogColumns, read_log, time_column
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.world.schema import load_schema
from loadtest.record import record
from loadtest.service import local_service

log = logging.getLogger("loadtest.replay_arrivals")
K = 10


def _cut(source: Path, columns: LogColumns, since: int, folder: Path) -> tuple[Path, Path]:
    """The log's rows before `since` and from it on, as two files in its own layout."""
    with source.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        at = header.index(
            time_column(
                columns, source.name, "a replay cuts it in time; give a log with a time column"
            )
        )
        rows = list(reader)
    parts = folder / "earlier.csv", folder / "later.csv"
    for path, later in zip(parts, (False, True), strict=True):
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(row for row in rows if (int(float(row[at])) >= since) == later)
    return parts


def _items_in(table: Path, id_column: str, ids: set[str], out: Path) -> Path:
    """The item table's rows for `ids` only."""
    with table.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        at = header.index(id_column)
        kept = [row for row in reader if row[at] in ids]
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(kept)
    return out


def untouched_share(rows: list[ReplayRow], new: frozenset[str]) -> float:
    """Of the positives on new items, the share whose item no other user had a row on
    before: only its attributes can recall it then, which bounds what arrivals can buy."""
    users: dict[str, set[str]] = {}
    on_new = untouched = 0
    for row in rows:
        if row.positive and row.item in new:
            on_new += 1
            untouched += not (users.get(row.item, set()) - {row.user})
        users.setdefault(row.item, set()).add(row.user)
    return round(untouched / on_new, 3) if on_new else 0.0


def _replayed(
    world: Path,
    folder: Path,
    rows: list[ReplayRow],
    table: Path,
    item_columns: ItemColumns,
    static: bool,
) -> dict[str, Any]:
    arriving = arrivals_for(rows, world, read_items(table, item_columns), static)
    with local_service(world, trending_candidates="50") as (api, stack):
        settings = {
            "RECSYS_REDIS_URL": stack.settings.redis_url,
            "RECSYS_ARTIFACTS_DIR": str(world),
        }
        consumer = start_ingest(settings, folder / ("ingest-static" if static else "ingest"))
        try:
            report = asyncio.run(replay(api.url, rows, K, events=True, arriving=arriving))
        finally:
            consumer.stop()
    return report | {"new_items": len(arriving.new), "unplaced": len(arriving.unplaced)}


def measure(
    name: str,
    source: Path,
    columns: LogColumns,
    table: Path,
    item_columns: ItemColumns,
    since: int,
    folder: Path,
    seed: int,
) -> dict[str, Any]:
    earlier, later = _cut(source, columns, since, folder)
    first = read_log(earlier, columns)
    known = set(first.items.ids[np.unique(first.item)].tolist())
    catalog = _items_in(table, item_columns.item_id, known, folder / "items_then.csv")
    world = folder / "world"
    recipe = WorldRecipe(
        interactions=earlier, columns=columns, items=catalog, item_columns=item_columns, seed=seed
    )
    build_world_from_log(recipe, world, load_schema(interactions_schema_path()))
    rows = rows_in_time_order(read_log(later, columns), None)
    static = _replayed(world, folder, rows, table, item_columns, static=True)
    arriving = _replayed(world, folder, rows, table, item_columns, static=False)
    hit = f"hit@{K}"
    new = arrivals_for(rows, world, None, static_catalog=True).new
    return {
        "log": name,
        "rows_replayed": len(rows),
        "new_item_positives_untouched": untouched_share(rows, new),
        "static_catalog": static,
        "with_arrivals": arriving,
        "hit_ratio": round(arriving[hit] / static[hit], 3) if static[hit] else None,
    }


def _generated(folder: Path, seed: int) -> dict[str, Any]:
    made = write_arrival_log(folder / "log", seed)
    columns = LogColumns(weight="rating", min_weight=4.0)
    items = ItemColumns(category="genre", title="title", published="released")
    return measure("generated", made.log, columns, made.items, items, made.since, folder, seed)


def _movielens(data: Path, folder: Path, seed: int) -> dict[str, Any]:
    columns = LogColumns(user="userId", item="movieId", weight="rating", min_weight=4.0)
    ratings = read_log(data / "ratings.csv", columns)
    since = int(np.quantile(ratings.time, 0.9))
    items = ItemColumns(item_id="movieId", category="genres", title="title")
    return measure(
        "latest-small",
        data / "ratings.csv",
        columns,
        data / "movies.csv",
        items,
        since,
        folder,
        seed,
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="the latest-small set's folder, if at hand")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        runs.append(_generated(Path(scratch) / "generated", args.seed))
        log.info("%s", json.dumps(runs[-1]))
        if args.data is not None:
            (Path(scratch) / "movies").mkdir()
            runs.append(_movielens(args.data, Path(scratch) / "movies", args.seed))
    print(json.dumps(runs, indent=2))
    if args.out is not None:
        record(args.out, "replay_arrivals", {"runs": runs})


if __name__ == "__main__":
    main()
