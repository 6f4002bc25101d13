"""Item pages against the item-to-item baseline, and the home feed beside them, served live.

`python -m loadtest.item_page [--seeds 1] [--neighbours cosine|ease] [--viewed W]
[--out docs/benchmarks.json]` generates a log, cuts each user's rows in time (the first 80%
earlier, the rest later), builds a world from the earlier part as `recsys build-world` does
(the feed's neighbours scored by `--neighbours`; an EASE world's pages read cosine's),
serves it on the local stack (real Redis, real Triton, the API as its own process; the
rules' `viewed` objective `--viewed`), and for every user with a later positive asks:

- the item page of the last item they chose before the cut (`context.item_id`, page
  `product`), scored by whether the first item they chose after it is in the top 10;
- the home feed, scored the same way, and compared item for item with the answer the
  world's files give (`recsys evaluate`): the feed the item pages must leave as it was.

The baseline is item-to-item: the ten nearest neighbours (by co-occurrence, the list the
world's pages read) of the viewed item that the user has not chosen. Two logs:

- sessions (recsys_tools.world.generate.sessions): a user rates several items of one theme
  in a row; what comes next is told by what came last;
- drift (recsys_tools.world.generate.drift, its history): each user rates items of one group,
  in no order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from recsys_tools.demo import local_stack, stack_options
from recsys_tools.live_evaluation import Answers, agreement, from_files
from recsys_tools.world.generate.drift import write_drift_log
from recsys_tools.world.generate.sessions import write_session_items, write_session_log
from recsys_tools.world.judge.answers import AskContext
from recsys_tools.world.judge.split import write_split
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.learn.neighbours import COSINE, NeighbourModel
from recsys_tools.world.read.items import ItemColumns
from recsys_tools.world.read.log import InteractionLog, LogColumns, read_log
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.release.rules import ObjectivesRule
from app.world.layout import ITEMS_FILE
from app.world.neighbours import load_page_neighbours
from app.world.schema import load_schema
from loadtest.record import record
from loadtest.service import api_on

log = logging.getLogger("loadtest.item_page")
K = 10
SHARE = 0.2
COLUMNS = LogColumns(weight="rating", min_weight=4.0)
PLAIN_RULES = "[diversity]\nmax_per_category = 0\n"
CONCURRENCY = 4


@dataclass(frozen=True, slots=True)
class Visit:
    """A user on the page of the last item they chose before the cut, and what they chose
    next; `seen`, every item of theirs before the cut."""

    user: str
    viewed: str
    following: str
    seen: frozenset[str]


def visits(earlier: InteractionLog, later: InteractionLog) -> list[Visit]:
    """One per user with a positive on each side of the cut, in user order."""
    last: dict[str, tuple[int, str]] = {}
    seen: dict[str, set[str]] = {}
    users, items = earlier.user_ids[earlier.user], earlier.items.ids[earlier.item]
    for user, item, moment, positive in zip(
        users.tolist(),
        items.tolist(),
        earlier.time.tolist(),
        earlier.positive.tolist(),
        strict=True,
    ):
        seen.setdefault(user, set()).add(item)
        if positive and (user not in last or moment >= last[user][0]):
            last[user] = (moment, item)
    first: dict[str, tuple[int, str]] = {}
    rows = later.positive
    for user, item, moment in zip(
        later.user_ids[later.user[rows]].tolist(),
        later.items.ids[later.item[rows]].tolist(),
        later.time[rows].tolist(),
        strict=True,
    ):
        if item in seen.get(user, ()) or user not in last:
            continue
        if user not in first or moment < first[user][0]:
            first[user] = (moment, item)
    return [
        Visit(user, last[user][1], first[user][1], frozenset(seen[user])) for user in sorted(first)
    ]


def item_to_item(world: Path, chosen: list[Visit]) -> dict[str, list[str]]:
    """Each visit's baseline: the viewed item's nearest neighbours the user has not seen, from
    the list the world's pages read (cosine's, in an EASE world)."""
    with np.load(world / ITEMS_FILE) as stored:
        ids = stored["ids"].astype(str)
    neighbours = load_page_neighbours(world, len(ids))
    assert neighbours is not None, "a world built from a log has neighbours"
    at = {item: n for n, item in enumerate(ids.tolist())}
    answers: dict[str, list[str]] = {}
    for visit in chosen:
        row = neighbours.positions[at[visit.viewed]]
        near = [str(ids[p]) for p in row.tolist() if p >= 0]
        answers[visit.user] = [item for item in near if item not in visit.seen][:K]
    return answers


async def _ask(url: str, chosen: list[Visit], body: Callable[[Visit], dict[str, Any]]) -> Answers:
    answers = Answers()
    queue: asyncio.Queue[Visit] = asyncio.Queue()
    for visit in chosen:
        queue.put_nowait(visit)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            visit = queue.get_nowait()
            answer = await client.post(
                "/recommend", json={"user_id": visit.user, "num_items": K, **body(visit)}
            )
            if answer.status_code != 200:
                answers.failed += 1
                continue
            payload = answer.json()
            answers.lists[visit.user] = [item["item_id"] for item in payload["items"]]
            for flag in payload["degraded"]:
                answers.degraded[flag] += 1

    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return answers


def hits(chosen: list[Visit], lists: dict[str, list[str]]) -> dict[str, Any]:
    """hit@10 of the next item, and how often the viewed item itself was served."""
    answered = [visit for visit in chosen if visit.user in lists]
    hit = sum(visit.following in lists[visit.user][:K] for visit in answered)
    shown = sum(visit.viewed in lists[visit.user] for visit in answered)
    return {
        "visits": len(answered),
        f"hit@{K}": round(hit / max(len(answered), 1), 4),
        "viewed_item_served": shown,
    }


def measure(
    kind: str,
    folder: Path,
    seed: int,
    neighbours: NeighbourModel = COSINE,
    viewed: float | None = None,
) -> dict[str, Any]:
    items: Path | None = None
    if kind == "sessions":
        whole = write_session_log(folder / "log.csv", seed)
        items = write_session_items(folder / "items.csv")
    else:
        whole = write_drift_log(folder / "drift", seed).history
    split = write_split(read_log(whole, COLUMNS), SHARE, folder / "split", "rating", seed=0)
    world = folder / "world"
    recipe = WorldRecipe(
        interactions=split.earlier,
        columns=COLUMNS,
        items=items,
        item_columns=ItemColumns(category="genre") if items else ItemColumns(),
        seed=seed,
        neighbours=neighbours,
    )
    build_world_from_log(recipe, world, load_schema(interactions_schema_path()))
    chosen = visits(read_log(split.earlier, COLUMNS), read_log(split.later, COLUMNS))
    moment = AskContext(page="home")
    files = from_files(world, [visit.user for visit in chosen], moment)
    plain = folder / "plain.toml"
    objectives = "" if viewed is None else f"[objectives]\nviewed = {viewed!r}\n"
    plain.write_text(PLAIN_RULES + objectives)
    options = stack_options(world)
    with (
        local_stack(options) as stack,
        api_on(stack, options.run_dir / "api.log", rules_file=str(plain)) as api,
    ):
        home = asyncio.run(_ask(api.url, chosen, lambda _: {"context": moment.as_json()}))
        page = asyncio.run(
            _ask(
                api.url,
                chosen,
                lambda visit: {
                    "context": {**moment.as_json(), "page": "product", "item_id": visit.viewed}
                },
            )
        )
    baseline = hits(chosen, item_to_item(world, chosen))
    on_page, on_home = hits(chosen, page.lists), hits(chosen, home.lists)
    return {
        "log": kind,
        "seed": seed,
        "neighbours": neighbours.kind,
        "viewed": ObjectivesRule().viewed if viewed is None else viewed,
        "item_page": on_page | {"failed": page.failed, "degraded": dict(page.degraded)},
        "item_to_item": baseline,
        "home": on_home | {"failed": home.failed, "same_as_files": agreement(home, files)},
        "item_page_over_item_to_item": round(on_page[f"hit@{K}"] / baseline[f"hit@{K}"], 3)
        if baseline[f"hit@{K}"]
        else None,
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--logs", default="sessions,drift")
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    parser.add_argument("--neighbours", choices=("cosine", "ease"), default="cosine")
    parser.add_argument(
        "--viewed", type=float, help="the rules' [objectives] viewed (its default if not given)"
    )
    args = parser.parse_args()
    model = NeighbourModel(args.neighbours)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for kind in args.logs.split(","):
            for seed in range(3, 3 + args.seeds):
                folder = Path(scratch) / f"{kind}-{seed}"
                runs.append(measure(kind, folder, seed, model, args.viewed))
                log.info("%s", json.dumps(runs[-1]))
    ratios = {
        kind: statistics.median(
            run["item_page_over_item_to_item"]
            for run in runs
            if run["log"] == kind and run["item_page_over_item_to_item"]
        )
        for kind in args.logs.split(",")
    }
    figures = {"runs": runs, "median_item_page_over_item_to_item": ratios}
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        # Each model and weight its own key: a sweep leaves the defaults' figures as they were.
        key = "item_page" + ("" if model.kind == "cosine" else f"_{model.kind}")
        key += "" if args.viewed is None else f"_viewed{args.viewed:g}"
        record(args.out, key, figures)


if __name__ == "__main__":
    main()
