"""`recsys export-catalog`: the catalog as served now, as an item table for the next world.

Reads the served world's items and its change log in Redis (every item put and withdrawn
while serving), and writes one CSV row per item the catalog holds now: the world's items
less those withdrawn, with the attributes a later put gave them, and every added item not
withdrawn. Columns: item_id, title, categories (names, A|B), published_at (unix seconds;
blank where nothing said when: a world built from a log without times, for the items its
item table gave no date). The next build reads it as its item table, so it takes the changes
in:

    recsys export-catalog --world var/world --redis-url redis://... --out items-now.csv
    recsys build-world --interactions LOG --items items-now.csv --category-col categories \\
        --title-col title --published-col published_at --world var/world-next
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import redis

from app.core.errors import ConfigError
from app.release.keyspace import KeySpace
from app.world.attributes import load_attributes
from app.world.layout import ITEMS_FILE
from app.world.stamp import read_stamp
from recsys_tools.commands import Commands
from recsys_tools.world.recipes.report import read_report

COLUMNS = ("item_id", "title", "categories", "published_at")
PAGE = 1000


@dataclass(slots=True)
class ItemRow:
    title: str
    categories: str
    published_at: int | None  # None: nothing said when


def built_without_times(world: Path) -> bool:
    """Whether the world's report says its log had no times: every item the item table gave
    no date then holds the log's first time, 0, which means "never said", not 1970."""
    times = (read_report(world) or {}).get("times")
    return isinstance(times, dict) and "column" in times and times["column"] is None


def published(moments: list[int], timeless: bool) -> list[int | None]:
    """Each item's publish time; None for the zeros of a world built without times."""
    return [None if timeless and moment == 0 else moment for moment in moments]


def world_rows(world: Path) -> dict[str, ItemRow]:
    """The world's items as it was built."""
    with np.load(world / ITEMS_FILE) as stored:
        ids = stored["ids"].astype(str).tolist()
        moments = stored["published_at"].astype(np.int64).tolist()
    dated = published(moments, built_without_times(world))
    attributes = load_attributes(world, len(ids)).columns
    titles = attributes.get("title", np.full(len(ids), "")).tolist()
    names = attributes.get("categories", np.full(len(ids), "")).tolist()
    return {
        item: ItemRow(str(title), str(categories), moment)
        for item, title, categories, moment in zip(ids, titles, names, dated, strict=True)
    }


def replayed(rows: dict[str, ItemRow], batches: list[dict[str, Any]]) -> dict[str, ItemRow]:
    """`rows` with the log's batches applied in order: puts (a vector-only refit changes no
    attribute) and withdrawals."""
    for body in batches:
        for put in body.get("puts", []):
            if len(put) > 8 and put[8]:
                continue
            rows[str(put[0])] = ItemRow(str(put[1]), "|".join(put[2]), int(put[4]))
        for item in body.get("withdrawals", []):
            rows.pop(str(item), None)
    return rows


def log_bodies(client: redis.Redis, log_key: str) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []
    start = "-"
    while True:
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]], client.xrange(log_key, start, "+", PAGE)
        )
        bodies += [json.loads(fields[b"body"]) for _, fields in entries]
        if len(entries) < PAGE:
            return bodies
        start = "(" + entries[-1][0].decode()


def write_table(rows: dict[str, ItemRow], out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for item, row in rows.items():
            when = "" if row.published_at is None else row.published_at
            writer.writerow((item, row.title, row.categories, when))
    return len(rows)


def _run(args: argparse.Namespace) -> None:
    stamp = read_stamp(args.world)
    if stamp is None:
        raise ConfigError(f"{args.world} has no world id: its change log cannot be found")
    client = redis.Redis.from_url(args.redis_url)
    try:
        bodies = log_bodies(client, KeySpace(args.key_prefix).catalog(stamp.world_id, "log"))
    finally:
        client.close()
    written = write_table(replayed(world_rows(args.world), bodies), args.out)
    print(json.dumps({"items": written, "batches": len(bodies), "out": str(args.out)}))


def register(commands: Commands) -> None:
    command = commands.add_parser(
        "export-catalog",
        help="the catalog as served now (the world's items and the changes since) as an "
        "item table for the next build",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("--world", type=Path, required=True, help="the served world's folder")
    command.add_argument("--redis-url", required=True, help="the Redis the service reads")
    command.add_argument("--key-prefix", default="recsys", help="RECSYS_REDIS_KEY_PREFIX")
    command.add_argument("--out", type=Path, required=True, help="the item table to write")
    command.set_defaults(run=_run)
