"""What retraining buys on a log whose tastes drift day by day: the world retrained on the
archive against the world left frozen, judged on the next day's hit@10.

`python -m loadtest.retrain_drift [--live] [--out docs/benchmarks.json]` generates the log
(recsys_tools.world.generate.drift.daily_drift: each day a user may move to another interest
group), builds the frozen world from its first 30 days as `recsys build-world` does, writes
the next 7 days into an archive as recsys-archive writes them (ratings; and, unless
--no-impressions, each active user's answer of the day from the frozen world with the clicks
on what in it matched their taste that day), runs `recsys retrain`
(base log plus the archive's window, judged against the frozen world on its latest day), and
asks both worlds, from their files, for the users of the day after: the share with one of that
day's new positives in their ten. The retrain's report compares the ranker learnt from the
answers (shown-and-chosen against shown-and-skipped) with the one learnt from candidate lists
(sampled negatives). With --live, each world is also served on the local stack
with a real recsys-ingest: the archive's days posted as events (a frozen world still folds
its users in), then the next day replayed asking before each positive (hit@10 per positive).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import redis
from recsys_tools.localstack import start_ingest, unapplied
from recsys_tools.replay import ReplayRow, replay
from recsys_tools.retrain import retrain
from recsys_tools.retrain_rows import RetrainPlan, archive_rows, as_of, base_rows
from recsys_tools.retrain_verdict import hit_at_k
from recsys_tools.world.generate.drift import DAY, START, DailyDrift, DailyShape, daily_drift
from recsys_tools.world.judge.answers import AskContext, WorldAnswers
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.log import LogColumns
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.archive.rows import ANSWERS_SCHEMA, EVENTS_SCHEMA, Kind, day_of
from app.archive.store import ArchiveStore
from app.release.keyspace import KeySpace
from app.world.schema import load_schema
from app.world.stamp import read_stamp
from loadtest.record import record
from loadtest.service import local_service

COLUMNS = LogColumns(weight="rating", min_weight=4.0)
K = 10
# The chance a generated user clicks a shown item of their taste that day.
CLICK_SHARE = 0.3


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


def write_answers(root: Path, world: Path, drift: DailyDrift, seed: int) -> dict[str, int]:
    """Each active user's answer on each later day, asked a minute before their first rating
    of it, as the world's files give it (its real-time fold-in left out), logged as
    recsys-archive logs answers; each shown item of the user's taste that day clicked with
    CLICK_SHARE, the click naming the answer."""
    rng = np.random.default_rng(seed)
    served = WorldAnswers(world)
    stamp = read_stamp(world)
    world_id = "" if stamp is None else stamp.world_id
    asked: dict[tuple[str, int], int] = {}
    for user, _, _, ts in drift.later:
        key = (user, (ts - START) // DAY)
        asked[key] = min(asked.get(key, ts), ts)
    by_moment: dict[tuple[int, int], list[tuple[str, int, int]]] = {}
    for (user, day), ts in asked.items():
        at = ts - 60
        by_moment.setdefault(((at // 3600) % 24, (at // DAY + 3) % 7), []).append((user, day, at))
    answers: list[dict[str, Any]] = []
    clicks: list[dict[str, Any]] = []
    for (hour, weekday), asks in sorted(by_moment.items()):
        users = [user for user, _, _ in asks]
        for (user, day, at), (_, items) in zip(
            asks, served.answers(users, AskContext(hour=hour, weekday=weekday)), strict=True
        ):
            answer_id = f"a{len(answers)}"
            answers.append(
                {
                    "answer_id": answer_id,
                    "ts_ms": at * 1000,
                    "user_id": user,
                    "page": "other",
                    "variant": "control",
                    "model_version": "1",
                    "world_id": world_id,
                    "degraded": False,
                    "items": items,
                    "scores": [float(-rank) for rank in range(len(items))],
                    "entry": "0-0",
                }
            )
            for item in items:
                if drift.likes(day, user, item) and rng.random() < CLICK_SHARE:
                    clicks.append(
                        {
                            "event_id": f"c{len(clicks)}",
                            "user_id": user,
                            "item_id": item,
                            "type": "click",
                            "ts_ms": at * 1000 + 5_000,
                            "value": None,
                            "answer_id": answer_id,
                            "entry": "0-0",
                        }
                    )
    store = ArchiveStore(str(root))
    store.write(Kind.ANSWERS, pa.Table.from_pylist(answers, schema=ANSWERS_SCHEMA))
    store.write(Kind.EVENTS, pa.Table.from_pylist(clicks, schema=EVENTS_SCHEMA))
    return {"answers": len(answers), "clicks": len(clicks)}


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


def _rows(rows: list[tuple[str, str, float, int]], ask: bool) -> list[ReplayRow]:
    return [
        ReplayRow(user, item, ts, ask and rating >= 4.0, rating) for user, item, rating, ts in rows
    ]


def served_next_day(world: Path, drift: DailyDrift, folder: Path) -> dict[str, Any]:
    """The world served with a real recsys-ingest: the archive's days posted as events (the
    real-time path folds them in), then the next day replayed, asking before each positive."""
    with local_service(world) as (api, stack):
        settings = {
            "RECSYS_REDIS_URL": stack.settings.redis_url,
            "RECSYS_ARTIFACTS_DIR": str(world),
        }
        consumer = start_ingest(settings, folder / f"ingest-{world.name}")
        try:
            asyncio.run(replay(api.url, _rows(drift.later, ask=False), K, events=True))
            client = redis.Redis.from_url(stack.settings.redis_url)
            give_up = time.monotonic() + 120.0
            while unapplied(client, KeySpace("recsys"), stack.settings.event_partitions) > 0:
                if time.monotonic() > give_up:
                    raise TimeoutError(consumer.log_tail())
                time.sleep(0.1)
            client.close()
            return asyncio.run(replay(api.url, _rows(drift.next_day, ask=True), K, events=True))
        finally:
            consumer.stop()


def measure(
    folder: Path, seed: int, live: bool, item_move: float, impressions: bool = True
) -> dict[str, Any]:
    drift: DailyDrift = daily_drift(seed, DailyShape(item_move=item_move))
    base = drift.write_history(folder / "history.csv")
    frozen = folder / "frozen"
    started = time.perf_counter()
    recipe = WorldRecipe(interactions=base, columns=COLUMNS, seed=seed)
    build_world_from_log(recipe, frozen, load_schema(interactions_schema_path()))
    frozen_s = time.perf_counter() - started
    archived = write_archive(folder / "archive", drift.later)
    shown = write_answers(folder / "archive", frozen, drift, seed) if impressions else {}
    plan = RetrainPlan(
        interactions=base,
        columns=COLUMNS,
        archive=str(folder / "archive"),
        serving=frozen,
        worlds=folder / "worlds",
        window_days=7,
        seed=seed,
        # The run as on the day judged: the log's days are long past.
        now_s=as_of(day_of(drift.next_day_start * 1000), time.time()),
    )
    report = retrain(plan)
    # What the users had before the day judged: the archive's clicks too, as the retrain
    # learnt them; an item clicked in the week and rated the day after is not a discovery.
    archived_rows = archive_rows(ArchiveStore(plan.archive).read(Kind.EVENTS), COLUMNS)
    history = pa.concat_tables([base_rows(plan), archived_rows])
    next_day = _table(drift.next_day)
    judged = {
        "frozen": hit_at_k(WorldAnswers(frozen), history, next_day, K, 4.0),
        "retrained": hit_at_k(WorldAnswers(Path(report["world"])), history, next_day, K, 4.0),
    }
    hit = f"hit@{K}"
    served = {}
    if live:
        served = {
            "frozen": served_next_day(frozen, drift, folder),
            "retrained": served_next_day(Path(report["world"]), drift, folder),
        }
        served["retrained_over_frozen"] = round(served["retrained"][hit] / served["frozen"][hit], 3)
    return {
        "command": "python -m loadtest.retrain_drift",
        "seed": seed,
        "item_move": item_move,
        "rows": {
            "history": len(drift.history),
            "archive": archived,
            "next_day": len(drift.next_day),
            **shown,
        },
        "next_day": judged,
        "retrained_over_frozen": round(judged["retrained"][hit] / judged["frozen"][hit], 3),
        "retrain_report": {
            "held_out_day": report["held_out_day"],
            "evaluation": report["evaluation"],
            "ranker": report["ranker"],
            "outcome": report["outcome"],
            "seconds": report["seconds"],
        },
        "frozen_build_s": round(frozen_s, 1),
        "served_with_real_time": served,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--item-move",
        type=float,
        default=0.0,
        help="each later day, the chance an item leaves its interest group for another",
    )
    parser.add_argument(
        "--no-impressions",
        action="store_true",
        help="archive the ratings only, no answers: the ranker learns from candidate lists",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="also serve each world on the local stack, the archive's days posted as events",
    )
    parser.add_argument("--out", type=Path, default=None, help="merge the figures into this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(
            Path(folder), args.seed, args.live, args.item_move, not args.no_impressions
        )
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "retrain_drift", figures)


if __name__ == "__main__":
    main()
