"""`recsys replay`: what real time buys on your own data, measured against a running service.

Walks an interaction log in time order (the part after the world's build, say). For each
positive it first asks /recommend for that user and records whether the item is in the
answer (hit@K, NDCG@K); then, unless --no-events, it posts the row to /events, so the
service knows it before the user's next request. Run with --no-events for the static
figure (first, on a freshly loaded Redis: events change what the second run starts from).
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
from recsys_tools.world.commands import add_log_flags, log_columns
from recsys_tools.world.read.log import InteractionLog, read_log

log = logging.getLogger("recsys.replay")


@dataclass(frozen=True, slots=True)
class Row:
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

    def add(self, rank: int | None) -> None:
        self.asked += 1
        if rank is not None:
            self.hits += 1
            self.ndcg += 1.0 / math.log2(rank + 1)

    def report(self, k: int, events: bool) -> dict[str, Any]:
        asked = max(self.asked, 1)
        return {
            "events": events,
            "positives_asked": self.asked,
            f"hit@{k}": round(self.hits / asked, 4),
            f"ndcg@{k}": round(self.ndcg / asked, 4),
            "events_posted": self.posted,
        }


def rows_in_time_order(interactions: InteractionLog, since_s: int | None) -> list[Row]:
    order = sorted(range(len(interactions.user)), key=lambda n: int(interactions.time[n]))
    rows = []
    for n in order:
        ts = int(interactions.time[n])
        if since_s is not None and ts < since_s:
            continue
        weight = None if interactions.weight is None else float(interactions.weight[n])
        rows.append(
            Row(
                user=str(interactions.user_ids[interactions.user[n]]),
                item=str(interactions.items.ids[interactions.item[n]]),
                ts_s=ts,
                positive=bool(interactions.positive[n]),
                rating=weight,
            )
        )
    return rows


def _event(row: Row, n: int) -> dict[str, Any]:
    """The row as the frontend would have posted it: a rating with its value, else a click."""
    event: dict[str, Any] = {"event_id": f"replay-{n}", "user_id": row.user, "item_id": row.item}
    if row.rating is not None:
        event |= {"type": "rating", "value": row.rating}
    else:
        event["type"] = "click"
    return event


async def replay(
    url: str,
    rows: list[Row],
    k: int,
    events: bool,
    settle_s: float = 0.05,
    token: str | None = None,
) -> dict[str, Any]:
    """Ask, then post, row by row. A user whose last event went out less than `settle_s`
    ago waits for the rest of it first: the service applies events within tens of ms, and
    a frontend's next page comes later than that."""
    score = Score()
    posted_at: dict[str, float] = {}
    caller = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        for n, row in enumerate(rows):
            if row.positive:
                wait = posted_at.get(row.user, 0.0) + settle_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                body = {"user_id": row.user, "num_items": k}
                answer = await client.post("/recommend", json=body)
                answer.raise_for_status()
                items = [item["item_id"] for item in answer.json()["items"]]
                score.add(items.index(row.item) + 1 if row.item in items else None)
            if events:
                batch = {"events": [_event(row, n)]}
                posted = await client.post("/events", json=batch, headers=caller)
                if posted.status_code == 202 and posted.json()["accepted"]:
                    score.posted += 1
                    posted_at[row.user] = time.monotonic()
    return score.report(k, events)


# The event caller's token, from the environment (never a flag: it would show in `ps`).
TOKEN_VARIABLE = "RECSYS_EVENT_TOKEN"


def _run(args: argparse.Namespace) -> None:
    rows = rows_in_time_order(read_log(args.interactions, log_columns(args)), args.since)
    if args.limit:
        rows = rows[: args.limit]
    token = os.environ.get(TOKEN_VARIABLE)
    report = asyncio.run(replay(args.url, rows, args.k, not args.no_events, token=token))
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
    replayed.set_defaults(run=_run)
