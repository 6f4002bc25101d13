"""What is served, measured on a public ratings set: live answers against the build's claim.

`python -m loadtest.served_quality --set latest-small --data DIR [--out docs/benchmarks.json]`
reads a public movie-ratings set from DIR (never from the repository: its licence forbids
redistribution; docs/your-data.md says where it is published), then:

1. cuts each user's ratings in time (`recsys split-log`: the first 80% earlier, the rest
   later) and builds a world from the earlier part as `recsys build-world` does;
2. serves it on the local stack (real Redis, real Triton, the API as its own process) and
   asks /recommend once for every user with later positives (ratings of 4 or more), with
   rules that change nothing and with the packaged rules: recall@10 and NDCG@10, seen items
   served, failed requests, and how many answers equal, item for item, the list the world's
   files give (`recsys evaluate`);
3. replays the later ratings in time order through the service (`recsys replay`): hit@10
   with nothing posted, then with each rating posted as it happens (a set without times,
   lastfm-2k's play counts, has its later part drawn at random with the seed, and no replay;
   `--no-replay` leaves it out: it is most of a run's time);
4. computes the baselines on the same split: popularity, and EASE (loadtest/ease.py) with
   its λ chosen on the earlier part's own split, answered and replayed the same way; and
   EASE at its best, λ (20-1000) and its input (positives, or every row) chosen on the
   later part itself: an upper bound of what EASE gets on this split.

The ratios the targets are set in: live recall over EASE's at its best (1.1x) and over
EASE's as chosen, live over the build's own claim (within 5%), the replay over EASE's replay.
Beside the claim, whether live lies inside the claim's 95% interval over resamples of the
build's judged users (its sampling noise alone: outside is no proof of more, live has its own).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from recsys_tools.demo import local_stack, stack_options
from recsys_tools.live_evaluation import (
    Answers,
    agreement,
    ask_all,
    build_claim,
    build_claim_interval,
    from_files,
    inside,
    questions,
    score,
)
from recsys_tools.replay import rows_in_time_order
from recsys_tools.world.judge.answers import AskContext
from recsys_tools.world.judge.split import write_split
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.learn.neighbours import COSINE, NeighbourModel
from recsys_tools.world.read.formats import FileLayout
from recsys_tools.world.read.items import ItemColumns
from recsys_tools.world.read.log import InteractionLog, LogColumns, read_log
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.world.schema import load_schema
from loadtest import ease
from loadtest.record import record
from loadtest.replay_drift import replay_twice
from loadtest.service import api_on

log = logging.getLogger("loadtest.served_quality")
MIN_RATING = 4.0
SHARE = 0.2
K = 10
PLAIN_RULES = "[diversity]\nmax_per_category = 0\n"
GENRES = (
    "unknown,action,adventure,animation,children,comedy,crime,documentary,drama,fantasy,"
    "film_noir,horror,musical,mystery,romance,scifi,thriller,war,western"
)


@dataclass(frozen=True, slots=True)
class PublicSet:
    """Where a public set's files are and how they are laid out (the table in docs/your-data.md)."""

    ratings: str
    columns: LogColumns
    items: str
    item_columns: ItemColumns
    issue_anchor: dict[str, float] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.columns.time is not None

    @property
    def split_columns(self) -> LogColumns:
        """How the split's parts are laid out (write_split): the default columns, the
        weight under its own name (positives from the set's own min_weight), and a
        timestamp where the set has times."""
        return LogColumns(
            weight=self.columns.weight,
            min_weight=self.columns.min_weight,
            time="timestamp" if self.timed else None,
        )


SETS = {
    "latest-small": PublicSet(
        "ratings.csv",
        LogColumns(user="userId", item="movieId", weight="rating", min_weight=MIN_RATING),
        "movies.csv",
        ItemColumns(item_id="movieId", category="genres", title="title"),
        # The EASE figures the issue measured these sets' live answers against.
        {"ease_recall@10": 0.117, "ease_replay_static": 0.056, "ease_replay_events": 0.081},
    ),
    "100k": PublicSet(
        "u.data",
        LogColumns(
            weight="rating",
            min_weight=MIN_RATING,
            layout=FileLayout(
                format="tsv",
                header=False,
                columns=("user_id", "item_id", "rating", "timestamp"),
            ),
        ),
        "u.item",
        ItemColumns(
            category_cols=("unknown..western",),
            published="released",
            published_format="%d-%b-%Y",
            title="title",
            layout=FileLayout(
                sep="|",
                header=False,
                columns=("item_id", "title", "released", "video", "url", *GENRES.split(",")),
                encoding="latin-1",
            ),
        ),
        {"ease_recall@10": 0.190},
    ),
    # hetrec2011-lastfm-2k: play counts per user and artist, no times (GroupLens publishes
    # it for non-commercial research; never committed). Each user's held-out part is drawn
    # at random with the seed the report states.
    "lastfm-2k": PublicSet(
        "user_artists.dat",
        LogColumns(
            user="userID",
            item="artistID",
            weight="weight",  # plays: no min_weight, every row is a positive
            time=None,
            layout=FileLayout(format="tsv"),
        ),
        "artists.dat",
        ItemColumns(item_id="id", title="name", layout=FileLayout(format="tsv")),
    ),
}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _baselines(
    earlier_path: Path, later_path: Path, columns: LogColumns, seed: int, replay: bool
) -> dict[str, Any]:
    earlier, later = read_log(earlier_path, columns), read_log(later_path, columns)
    lam, tried = ease.chosen_lambda(earlier, SHARE, seed=seed)
    model = ease.fit(earlier, lam)
    chosen: dict[str, Any] = {
        "lambda": lam,
        "lambda_tried_on_the_earlier_parts_split": tried,
        f"recall@{K}": round(ease.recall_at_k(model, earlier, later), 4),
    }
    if later.timed and replay:  # a replay plays the later rows in time order
        rows = rows_in_time_order(later, None)
        timeline = [(row.user, row.item, row.positive) for row in rows]
        chosen["replay_static_hit@10"] = round(ease.replay(model, earlier, timeline, False), 4)
        chosen["replay_events_hit@10"] = round(ease.replay(model, earlier, timeline, True), 4)
    return {
        "ease_best_on_the_judged_part": _ease_at_its_best(earlier, later, later_path),
        "ease": chosen,
        "popularity": {
            f"recall@{K}": round(ease.recall_at_k(model, earlier, later, popular=True), 4)
        },
    }


# EASE at its best depends on the split alone (the same for every seed where the set has
# times; drawn by the seed where it has none): fitted once a split, known by its later part.
_AT_ITS_BEST: dict[str, dict[str, Any]] = {}


def _ease_at_its_best(earlier: InteractionLog, later: InteractionLog, path: Path) -> dict[str, Any]:
    key = hashlib.sha256(path.read_bytes()).hexdigest()
    if key not in _AT_ITS_BEST:
        _AT_ITS_BEST[key] = ease.best_on_the_judged_part(earlier, later)
    return _AT_ITS_BEST[key]


def _live(
    url: str, later: Path, earlier: Path, files: Answers, columns: LogColumns
) -> dict[str, Any]:
    asked = questions(read_log(later, columns), read_log(earlier, columns))
    users = [one.user for one in asked]
    moment = AskContext()
    started = time.perf_counter()
    live = asyncio.run(ask_all(url, users, K, {"context": moment.as_json()}))
    figures = score(asked, live, K)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    figures["same_as_files"] = agreement(live, files)
    return figures


def measure(
    name: str,
    data: Path,
    folder: Path,
    seed: int,
    neighbours: NeighbourModel = COSINE,
    replay: bool = True,
    order_model: bool = False,
) -> dict[str, Any]:
    public = SETS[name]
    whole = read_log(data / public.ratings, public.columns)
    split = write_split(whole, SHARE, folder, public.columns.weight, seed=seed)
    world = folder / "world"
    columns = public.split_columns
    recipe = WorldRecipe(
        interactions=split.earlier,
        columns=columns,
        items=data / public.items,
        item_columns=public.item_columns,
        seed=seed,
        neighbours=neighbours,
        order_model=order_model,
    )
    started = time.perf_counter()
    report = build_world_from_log(recipe, world, load_schema(interactions_schema_path()))
    built_s = time.perf_counter() - started
    baselines = _baselines(split.earlier, split.later, columns, seed, replay)
    asked = questions(read_log(split.later, columns), read_log(split.earlier, columns))
    files = from_files(world, [one.user for one in asked], AskContext())
    plain = folder / "plain.toml"
    plain.write_text(PLAIN_RULES)
    options = stack_options(world)
    figures: dict[str, Any] = {}
    with local_stack(options) as stack:
        for label, rules in (("plain_rules", plain), ("packaged_rules", None)):
            extra = {} if rules is None else {"rules_file": str(rules)}
            with api_on(stack, options.run_dir / f"api-{label}.log", **extra) as api:
                figures[label] = _live(api.url, split.later, split.earlier, files, columns)
        replayed = None
        if public.timed and replay:
            rows = rows_in_time_order(read_log(split.later, columns), None)
            with api_on(stack, options.run_dir / "api-replay.log", rules_file=str(plain)) as api:
                replayed = replay_twice(api.url, stack, world, folder, rows, K)
    live = figures["plain_rules"][f"recall@{K}"]
    claim = build_claim(world, K)
    claim_interval = build_claim_interval(world, K)
    recall_key = f"recall@{K}"
    return {
        "set": name,
        "seed": seed,
        "users": figures["plain_rules"]["users"],
        "build_seconds": round(built_s, 1),
        "build_claims": claim,
        "build_claim_interval": claim_interval,
        "live_inside_build_interval": inside(live, claim_interval),
        "files": score(asked, files, K),
        **figures,
        "replay": None if replayed is None else {"static": replayed[0], "events": replayed[1]},
        "times": report["times"],
        **baselines,
        "network_weight": report["ranker"]["blend"]["model"],
        "neighbours": report["neighbours"],
        "order_model": report.get("order_model"),
        "als_regularization": report["als"]["regularization"],
        "ratios": {
            "live_over_ease": _ratio(live, baselines["ease"][recall_key]),
            "live_over_ease_at_its_best": _ratio(
                live, baselines["ease_best_on_the_judged_part"][recall_key]
            ),
            "live_over_issue_ease_anchor": _ratio(
                live, public.issue_anchor.get("ease_recall@10", 0.0)
            ),
            "live_over_build_claim": _ratio(live, claim.get("rank") or 0.0),
            "packaged_over_plain_rules": _ratio(figures["packaged_rules"][recall_key], live),
            **_replay_ratios(replayed, baselines["ease"]),
        },
    }


def _replay_ratios(
    replayed: tuple[dict[str, Any], dict[str, Any]] | None, chosen: dict[str, Any]
) -> dict[str, float | None]:
    """The service's replays over EASE's; none for a set without times (nothing to replay)."""
    if replayed is None:
        return {}
    static, events = replayed
    return {
        "replay_static_over_ease": _ratio(static["hit@10"], chosen["replay_static_hit@10"]),
        "replay_events_over_ease": _ratio(events["hit@10"], chosen["replay_events_hit@10"]),
    }


def _inside_count(runs: list[dict[str, Any]]) -> dict[str, int]:
    """How many runs' live figure lay inside their claim's interval, of those whose build
    reported one."""
    judged = [run["live_inside_build_interval"] for run in runs]
    inside_count = sum(one is True for one in judged)
    return {"inside": inside_count, "of": sum(one is not None for one in judged)}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = runs[0]["ratios"].keys()
    return {
        key: float(np.median([run["ratios"][key] for run in runs if run["ratios"][key]]))
        for key in keys
        if any(run["ratios"][key] for run in runs)
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), required=True)
    parser.add_argument("--data", type=Path, required=True, help="the folder with its files")
    parser.add_argument("--folder", type=Path, default=Path("var/served_quality"))
    parser.add_argument("--seeds", type=int, default=1, help="worlds built, each its own seed")
    parser.add_argument("--first-seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    parser.add_argument("--neighbours", choices=("cosine", "ease"), default="cosine")
    parser.add_argument(
        "--no-replay",
        dest="replay",
        action="store_false",
        help="leave out the replays (most of a run's time: the later rows one by one)",
    )
    parser.add_argument(
        "--order-model", action="store_true", help="build each world with the order model"
    )
    args = parser.parse_args()
    model = NeighbourModel(args.neighbours)
    runs = [
        measure(
            args.set,
            args.data,
            args.folder / f"{args.set}-{seed}",
            seed,
            model,
            args.replay,
            args.order_model,
        )
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    figures = {
        "runs": runs,
        "median_ratios": _median(runs),
        "live_inside_build_interval": _inside_count(runs),
    }
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        # A run without replays keeps its own key: the full run's replay figures stay.
        key = (
            ("" if model.kind == "cosine" else f"_{model.kind}")
            + ("_order" if args.order_model else "")
            + ("" if args.replay else "_no_replay")
        )
        record(args.out, f"served_quality_{args.set}{key}", figures)


if __name__ == "__main__":
    main()
