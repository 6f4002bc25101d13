"""`recsys replay`: what real time buys on your own data, measured against a running service.

Walks an interaction log in time order (the part after the world's build, say). For each
positive it first asks /recommend for that user and records whether the item is in the
answer (hit@K, NDCG@K); then, unless --no-events, it posts the row to /events, so the
service knows it before the user's next request. Run with --no-events for the static
figure (first, on a freshly loaded Redis: events change what the second run starts from).

With --world (the served world's folder), items the log names that the world was built
without are put into the catalog, with their title and categories from the item table
(--items and its column flags, as build-world reads it), just before their first row: what
items arriving while serving buy on your data. --static-catalog puts none (the figure of a
catalog frozen at the build, on a fresh Redis too: added items stay in the change log).
Either way positives on those items are reported apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from recsys_tools.commands import Commands
from recsys_tools.replay_arrivals import Arrivals, arrivals, world_items
from recsys_tools.world.flags import (
    add_item_table_flags,
    add_log_flags,
    item_columns,
    log_columns,
)
from recsys_tools.world.read.items import ItemInfo, read_items
from recsys_tools.world.read.log import InteractionLog, read_log, require_times

log = logging.getLogger("recsys.replay")


@dataclass(frozen=True, slots=True)
class ReplayRow:
    user: str
    item: str
    ts_s: int
    positive: bool
    rating: float | None


@dataclass(slots=True)
class Score:
    asked: int = 0
    hits: int = 0
    ndcg: float = 0.0
    posted: int = 0
    new_asked: int = 0  # positives on items the world was built without
    new_hits: int = 0
    added: int = 0  # items put into the catalog before their first row

    def add(self, rank: int | None, new: bool = False) -> None:
        self.asked += 1
        self.new_asked += new
        if rank is not None:
            self.hits += 1
            self.new_hits += new
            self.ndcg += 1.0 / math.log2(rank + 1)

    def report(self, k: int, events: bool) -> dict[str, Any]:
        asked = max(self.asked, 1)
        return {
            "events": events,
            "positives_asked": self.asked,
            f"hit@{k}": round(self.hits / asked, 4),
            f"ndcg@{k}": round(self.ndcg / asked, 4),
            "events_posted": self.posted,
            "new_item_positives": self.new_asked,
            "new_item_hits": self.new_hits,
            "hits_on_new_items_share": round(self.new_hits / max(self.hits, 1), 4),
            "items_added": self.added,
        }


def rows_in_time_order(interactions: InteractionLog, since_s: int | None) -> list[ReplayRow]:
    require_times(
        interactions.timed,
        interactions.source,
        "a replay plays its rows in time order; give a log with a time column (--time-col)",
    )
    order = sorted(range(len(interactions.user)), key=lambda n: int(interactions.time[n]))
    rows = []
    for n in order:
        ts = int(interactions.time[n])
        if since_s is not None and ts < since_s:
            continue
        weight = None if interactions.weight is None else float(interactions.weight[n])
        rows.append(
            ReplayRow(
                user=str(interactions.user_ids[interactions.user[n]]),
                item=str(interactions.items.ids[interactions.item[n]]),
                ts_s=ts,
                positive=bool(interactions.positive[n]),
                rating=weight,
            )
        )
    return rows


def _event(row: ReplayRow, n: int) -> dict[str, Any]:
    """The row as the frontend would have posted it: a rating with its value, else a click."""
    event: dict[str, Any] = {"event_id": f"replay-{n}", "user_id": row.user, "item_id": row.item}
    if row.rating is not None:
        event |= {"type": "rating", "value": row.rating}
    else:
        event["type"] = "click"
    return event


async def replay(
    url: str,
    rows: list[ReplayRow],
    k: int,
    events: bool,
    settle_s: float = 0.05,
    token: str | None = None,
    arriving: Arrivals | None = None,
    admin_token: str | None = None,
) -> dict[str, Any]:
    """Ask, then post, row by row. A user whose last event went out less than `settle_s`
    ago waits for the rest of it first: the service applies events within tens of ms, and
    a frontend's next page comes later than that. With `arriving`, its items are put into
    the catalog before their first row (its `new` ids are scored apart either way)."""
    score = Score()
    posted_at: dict[str, float] = {}
    caller = {"Authorization": f"Bearer {token}"} if token else {}
    admin = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    new = arriving.new if arriving is not None else frozenset()
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        for n, row in enumerate(rows):
            puts = [] if arriving is None else arriving.before.get(n, [])
            if puts:
                added = await client.post("/catalog/items", json={"items": puts}, headers=admin)
                added.raise_for_status()
                score.added += len(puts)
            if row.positive:
                wait = posted_at.get(row.user, 0.0) + settle_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                body = {"user_id": row.user, "num_items": k}
                answer = await client.post("/recommend", json=body)
                answer.raise_for_status()
                items = [item["item_id"] for item in answer.json()["items"]]
                score.add(items.index(row.item) + 1 if row.item in items else None, row.item in new)
            if events:
                batch = {"events": [_event(row, n)]}
                posted = await client.post("/events", json=batch, headers=caller)
                if posted.status_code == 202 and posted.json()["accepted"]:
                    score.posted += 1
                    posted_at[row.user] = time.monotonic()
    return score.report(k, events)


# The event caller's and the catalog's tokens, from the environment (never flags: they
# would show in `ps`).
TOKEN_VARIABLE = "RECSYS_EVENT_TOKEN"
ADMIN_TOKEN_VARIABLE = "RECSYS_ADMIN_TOKEN"


def arrivals_for(
    rows: list[ReplayRow], world: Path, table: ItemInfo | None, static_catalog: bool
) -> Arrivals:
    """The items the world lacks: put before their first row, or (static) only told apart."""
    found = arrivals(
        [row.item for row in rows], [row.ts_s for row in rows], world_items(world), table
    )
    return Arrivals(new=found.new, unplaced=found.unplaced) if static_catalog else found


def _run(args: argparse.Namespace) -> None:
    rows = rows_in_time_order(read_log(args.interactions, log_columns(args)), args.since)
    if args.limit:
        rows = rows[: args.limit]
    arriving = None
    if args.world is not None:
        table = read_items(args.items, item_columns(args)) if args.items is not None else None
        arriving = arrivals_for(rows, args.world, table, args.static_catalog)
    report = asyncio.run(
        replay(
            args.url,
            rows,
            args.k,
            not args.no_events,
            token=os.environ.get(TOKEN_VARIABLE),
            arriving=arriving,
            admin_token=os.environ.get(ADMIN_TOKEN_VARIABLE),
        )
    )
    if arriving is not None:
        report |= {"static_catalog": args.static_catalog, "new_items": len(arriving.new)}
        report["new_items_without_a_known_category"] = len(arriving.unplaced)
    print(json.dumps(report, indent=2))


def register(commands: Commands) -> None:
    replayed = commands.add_parser(
        "replay",
        help="walk a log against a running service: hit@K before each positive, then post it",
        description=__doc__,
    )
    replayed.add_argument(
        "--interactions", type=Path, required=True, help="the log: CSV, TSV or Parquet"
    )
    replayed.add_argument("--url", default="http://127.0.0.1:8080", help="the running API")
    add_log_flags(replayed)
    replayed.add_argument(
        "--since", type=int, default=None, help="replay rows from this unix second on"
    )
    replayed.add_argument("--k", type=int, default=10, help="answer length; default 10")
    replayed.add_argument("--limit", type=int, default=0, help="replay at most this many rows")
    replayed.add_argument(
        "--no-events", action="store_true", help="the static figure: post nothing"
    )
    replayed.add_argument(
        "--world",
        type=Path,
        default=None,
        help="the served world's folder: items the log names that it lacks are put into the "
        "catalog (POST /catalog/items, with RECSYS_ADMIN_TOKEN from the environment if set) "
        "just before their first row, and their hits reported apart",
    )
    replayed.add_argument(
        "--static-catalog",
        action="store_true",
        help="with --world: put no item; the figure of a catalog frozen at the build",
    )
    add_item_table_flags(replayed)
    replayed.set_defaults(run=_run)
