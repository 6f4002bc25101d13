"""`recsys evaluate`: the build's claim checked against the running service, on your data.

Split a log in time (`recsys split-log`), build a world from the earlier part, serve it, then
ask the service once for each user with positives in the later part. Each answer is scored
as the build scores its holdout: recall@K (hits over min(K, the user's later positives)),
NDCG@K, and, given `--earlier`, any item served that the user had already seen there. With
`--world`, the build's own figure for its answer (report.json) is printed beside the live
one: the report is only worth trusting where the two agree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.core.errors import ConfigError
from app.world.layout import REPORT_FILE
from recsys_tools.commands import Commands
from recsys_tools.world.flags import add_log_flags, log_columns
from recsys_tools.world.judge.answers import AskContext, WorldAnswers
from recsys_tools.world.judge.measures import bootstrap_interval
from recsys_tools.world.judge.split import write_split
from recsys_tools.world.read.log import InteractionLog, LogColumns, read_log
from recsys_tools.world.recipes.report import read_report

# Requests in flight at once: enough to finish a few thousand users in seconds, few enough
# that the service's admission never refuses one.
CONCURRENCY = 4
# The draws behind a live figure's interval: fixed, so one set of answers gives one interval.
INTERVAL_SEED = 7


@dataclass(frozen=True, slots=True)
class Question:
    """One user's question: what they went on to like, and what they had seen before."""

    user: str
    relevant: frozenset[str]
    seen: frozenset[str]


@dataclass(slots=True)
class Tally:
    """What the answers scored, summed over the users asked."""

    k: int
    users: int = 0
    recalls: list[float] = field(default_factory=list)  # each user's: the mean and its interval
    ndcg: float = 0.0
    seen_served: int = 0
    short: int = 0  # answers with fewer than K items

    def add(self, asked: Question, items: list[str]) -> None:
        """One answer, scored against what the user went on to like."""
        self.users += 1
        hits = [item in asked.relevant for item in items[: self.k]]
        ideal = min(self.k, len(asked.relevant))
        self.recalls.append(sum(hits) / ideal)
        discounts = [1.0 / math.log2(rank + 2) for rank in range(self.k)]
        dcg = sum(d for d, hit in zip(discounts, hits, strict=False) if hit)
        self.ndcg += dcg / sum(discounts[:ideal])
        self.seen_served += sum(item in asked.seen for item in items)
        self.short += len(items) < self.k

    def report(self) -> dict[str, Any]:
        users = max(self.users, 1)
        return {
            "users": self.users,
            f"recall@{self.k}": round(sum(self.recalls) / users, 4),
            f"recall@{self.k}_interval": bootstrap_interval(self.recalls, INTERVAL_SEED),
            f"ndcg@{self.k}": round(self.ndcg / users, 4),
            "seen_items_served": self.seen_served,
            "short_answers": self.short,
        }


def questions(
    later: InteractionLog, earlier: InteractionLog | None = None, users: int = 0
) -> list[Question]:
    """Each user with a later positive they had not seen before: the items they went on to
    like. In the order the log first names them; the first `users` of them, if set."""
    seen: dict[str, set[str]] = defaultdict(set)
    if earlier is not None:
        for user, item in zip(
            earlier.user_ids[earlier.user].tolist(),
            earlier.items.ids[earlier.item].tolist(),
            strict=True,
        ):
            seen[user].add(item)
    liked: dict[str, set[str]] = {}
    rows = later.positive
    for user, item in zip(
        later.user_ids[later.user[rows]].tolist(),
        later.items.ids[later.item[rows]].tolist(),
        strict=True,
    ):
        if item not in seen[user]:
            liked.setdefault(user, set()).add(item)
    asked = [
        Question(user, frozenset(items), frozenset(seen[user])) for user, items in liked.items()
    ]
    return asked[:users] if users else asked


@dataclass(slots=True)
class Answers:
    """Each user's answer, item ids best first, and what the service said of it."""

    lists: dict[str, list[str]] = field(default_factory=dict)
    failed: int = 0
    cold_start: int = 0
    degraded: dict[str, int] = field(default_factory=lambda: defaultdict(int))


async def ask_all(
    url: str,
    users: list[str],
    k: int,
    body: dict[str, Any] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Answers:
    """One /recommend of K items per user, CONCURRENCY at a time; `body` adds to each."""
    answers = Answers()
    queue: asyncio.Queue[str] = asyncio.Queue()
    for user in users:
        queue.put_nowait(user)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            user = queue.get_nowait()
            try:
                answer = await client.post(
                    "/recommend", json={**(body or {}), "user_id": user, "num_items": k}
                )
            except httpx.HTTPError:
                answers.failed += 1
                continue
            if answer.status_code != 200:
                answers.failed += 1
                continue
            payload = answer.json()
            answers.lists[user] = [item["item_id"] for item in payload["items"]]
            answers.cold_start += bool(payload["cold_start"])
            for flag in payload["degraded"]:
                answers.degraded[flag] += 1

    async with httpx.AsyncClient(base_url=url, timeout=10.0, transport=transport) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return answers


def score(asked: list[Question], answers: Answers, k: int) -> dict[str, Any]:
    """The answers scored against what each user went on to like, and what the service
    said of them."""
    tally = Tally(k)
    for one in asked:
        if one.user in answers.lists:
            tally.add(one, answers.lists[one.user])
    return tally.report() | {
        "failed_requests": answers.failed,
        "cold_start_answers": answers.cold_start,
        "degraded_answers": dict(sorted(answers.degraded.items())),
    }


def from_files(world: Path, users: list[str], moment: AskContext) -> Answers:
    """The world's answers computed from its files (answers.py): what the service must say."""
    computed = WorldAnswers(world)
    return Answers(lists=dict(computed.answers(users, moment)))


def agreement(live: Answers, offline: Answers) -> dict[str, Any]:
    """How many users the service answered exactly as the world's files say it should."""
    users = [user for user in live.lists if user in offline.lists]
    same = [user for user in users if live.lists[user] == offline.lists[user]]
    differing = [user for user in users if user not in set(same)]
    return {
        "users_compared": len(users),
        "identical_answers": len(same),
        "first_differing_users": differing[:5],
    }


def _stages(world: Path) -> dict[str, Any]:
    report = read_report(world)
    stages = None if report is None else report.get("evaluation")
    stages = stages.get("stages") if isinstance(stages, dict) else None
    if not isinstance(stages, dict):
        raise ConfigError(
            f"{world / REPORT_FILE}: no build report to compare with (no evaluation stages in "
            "it); a world built by recsys build-world writes one"
        )
    return stages


def _number(value: object) -> float | None:
    """A figure as the report holds it: a finite number, not a bool; None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        figure = float(value)
    except OverflowError:  # an integer past float's range
        return None
    return figure if math.isfinite(figure) else None


def build_claim(world: Path, k: int) -> dict[str, float | None]:
    """What the world's build said its answer would score on its own holdout (None for a
    stage whose figure is not a finite number)."""
    return {
        stage: _number(figures.get(f"recall@{k}")) if isinstance(figures, dict) else None
        for stage, figures in _stages(world).items()
    }


def build_claim_interval(world: Path, k: int) -> list[float] | None:
    """The ranked answer's interval over resamples of the build's judged users
    (measures.bootstrap_interval); None from a build that did not report one, or where the
    report's is not two finite numbers, low first."""
    ranked = _stages(world).get("rank")
    bounds = ranked.get(f"recall@{k}_interval") if isinstance(ranked, dict) else None
    if not (isinstance(bounds, list) and len(bounds) == 2):
        return None
    low, high = _number(bounds[0]), _number(bounds[1])
    if low is None or high is None or low > high:
        return None
    return [low, high]


def inside(figure: float | None, bounds: list[float] | None) -> bool | None:
    """Whether a figure lies in an interval; None where either is missing."""
    if figure is None or bounds is None:
        return None
    return bounds[0] <= figure <= bounds[1]


def _read(path: Path, columns: LogColumns) -> InteractionLog:
    return read_log(path, columns)


def _run(args: argparse.Namespace) -> None:
    # One line a request would bury the report.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.url is None and args.world is None:
        raise ConfigError("give --url (a running service), --world (its files), or both")
    columns = log_columns(args)
    later = _read(args.interactions, columns)
    earlier = _read(args.earlier, columns) if args.earlier is not None else None
    asked = questions(later, earlier, args.users)
    if not asked:
        raise ConfigError(
            f"{args.interactions}: no user has a positive there they had not seen before; "
            "check --min-weight and that the file is the later part of the log"
        )
    users = [one.user for one in asked]
    moment = AskContext(hour=args.hour, weekday=args.weekday)
    report: dict[str, Any] = {}
    offline = None
    if args.world is not None:
        offline = from_files(args.world, users, moment)
        report["files"] = score(asked, offline, args.k)
        report["build_claims"] = build_claim(args.world, args.k)
        report["build_claim_interval"] = build_claim_interval(args.world, args.k)
    if args.url is not None:
        live = asyncio.run(ask_all(args.url, users, args.k, {"context": moment.as_json()}))
        report["live"] = score(asked, live, args.k)
        if offline is not None:
            report["live_vs_files"] = agreement(live, offline)
    claimed = report.get("build_claims", {}).get("rank")
    measured = report.get("live", report.get("files", {})).get(f"recall@{args.k}")
    if claimed and measured is not None:
        report["served_over_build"] = round(measured / claimed, 3)
        # Inside: the gap is within the claim's own sampling noise. Outside is no proof of
        # more: the build judged other users, and the served figure has noise of its own.
        report["served_inside_build_interval"] = inside(measured, report["build_claim_interval"])
    print(json.dumps(report, indent=2))


def _split(args: argparse.Namespace) -> None:
    log = _read(args.interactions, log_columns(args))
    files = write_split(log, args.later_share, args.out, args.weight_col, seed=args.seed)
    print(
        json.dumps(
            {
                "earlier": str(files.earlier),
                "earlier_rows": files.earlier_rows,
                "later": str(files.later),
                "later_rows": files.later_rows,
            }
        )
    )


def register(commands: Commands) -> None:
    split = commands.add_parser(
        "split-log",
        help="cut each user's rows in time: an earlier part to build from, a later to judge",
        description=__doc__,
    )
    split.add_argument("--interactions", type=Path, required=True, help="the whole log")
    split.add_argument("--out", type=Path, required=True, help="folder for the two parts")
    split.add_argument(
        "--later-share",
        type=float,
        default=0.2,
        help="each user's latest share of rows that go to the later part (drawn at random with "
        "--seed in a log without times); default 0.2",
    )
    split.add_argument(
        "--seed",
        type=int,
        default=7,
        help="for a log without times (--time-col none): the draw of each user's later rows; "
        "default 7",
    )
    add_log_flags(split)
    split.set_defaults(run=_split)
    command = commands.add_parser(
        "evaluate",
        help="score a running service's answers against the later part of a log",
        description=__doc__,
    )
    command.add_argument(
        "--interactions",
        type=Path,
        required=True,
        help="what users did after the world's log ended (split-log's later part)",
    )
    command.add_argument(
        "--url", default=None, help="the running API, such as http://127.0.0.1:8080"
    )
    command.add_argument(
        "--earlier",
        type=Path,
        default=None,
        help="the log the world was built from, in the same layout: its items are not "
        "counted as later positives, and any served is reported",
    )
    command.add_argument(
        "--world",
        type=Path,
        default=None,
        help="the served world: its answers computed from its files, and its build's claim",
    )
    command.add_argument(
        "--hour", type=int, default=12, help="the hour (UTC) every request says it is; default 12"
    )
    command.add_argument(
        "--weekday", type=int, default=2, help="the weekday every request says (0 is Monday)"
    )
    command.add_argument("--k", type=int, default=10, help="answer length; default 10")
    command.add_argument("--users", type=int, default=0, help="ask at most this many users")
    add_log_flags(command)
    command.set_defaults(run=_run)
