"""`recsys demo-loop`: the whole loop on a local stack, each step said as a sentence.

A generated log whose tastes drift day by day (recsys_tools.world.generate.drift) is laid
out so that its later days are the week before today. The world built from its history
serves, on a local Redis, a Triton (model control on), the API (as its own process, two
worlds allowed), recsys-ingest and recsys-archive. Then:

1. the week's traffic is posted to /events, as the frontend would have: the ingest consumer
   folds it into the users, the archive keeps it;
2. `recsys retrain` builds the next world from the history and the archive's week, judged
   against the serving world on the latest day;
3. `recsys release world advance`, as its timer would, loads the world accepted beside the
   serving one (its keys under its own prefix, its model on Triton under its own name) for
   a share of users;
4. today's traffic: each user asks for ten items before each thing they rate, and clicks
   the item where the answer showed it (the click names the answer);
5. `recsys release judge` reads the archive and says promote, roll back or wait;
6. the demo does what it says.

Everything runs under `--folder` (var/loop by default) and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import redis

from app.archive.rows import Kind, day_of
from app.archive.store import ArchiveStore
from app.release.keyspace import KeySpace
from app.world.schema import load_schema, world_schema
from app.world.stamp import read_stamp
from recsys_tools.commands import Commands
from recsys_tools.demo import StackOptions, prepare_model_repository
from recsys_tools.localstack import (
    Launch,
    ManagedProcess,
    default_triton_env,
    project_root,
    start_archive,
    start_ingest,
    start_managed_on_ports,
    start_redis,
    start_triton,
    unapplied,
    unarchived,
)
from recsys_tools.loop_traffic import RatingRow, ask_and_click, post_week
from recsys_tools.outcomes import TYPES
from recsys_tools.retrain import retrain
from recsys_tools.retrain_rows import RetrainPlan
from recsys_tools.verdict import Judgement, Verdict, arm_rates, judge
from recsys_tools.world.generate.drift import DAY, DailyDrift, DailyShape, daily_drift
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.log import LogColumns
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe
from recsys_tools.world.store.redis_loader import load_world_into_redis
from recsys_tools.world_advance import Advance, advance
from recsys_tools.worlds_client import call

log = logging.getLogger(__name__)
COLUMNS = LogColumns(weight="rating", min_weight=4.0)
PARTITIONS = 2
K = 10
DEMO_USERS = 4000
SETTLE_S = 180.0  # the consumers are generous; a slow machine may take long


@dataclass(frozen=True, slots=True)
class LoopOptions:
    folder: Path
    shape: DailyShape = field(default_factory=DailyShape)
    seed: int = 5
    percent: float = 10.0
    min_answers: int = 100
    max_answers: int = 100_000
    margin: float = 0.25
    retrain_margin: float = 0.02


@dataclass(slots=True)
class Cycle:
    """What the loop did: each step's sentence and time, and what the traffic got."""

    steps: list[tuple[str, float]] = field(default_factory=list)
    failed_answers: int = 0
    answers: dict[str, int] = field(default_factory=dict)
    verdict: str = ""
    final_world: str = ""

    @contextmanager
    def step(self, say: Callable[[str], None]) -> Iterator[list[str]]:
        """Time the step; its sentence is what the block puts in the list it gets."""
        started = time.monotonic()
        said: list[str] = []
        yield said
        seconds = time.monotonic() - started
        sentence = f"{' '.join(said)} ({seconds:.1f} s)"
        self.steps.append((sentence, seconds))
        say(sentence)


def shifted(drift: DailyDrift, now_s: float) -> DailyDrift:
    """The log moved in time so that the day after the later days is today (UTC)."""
    today = int(now_s // DAY * DAY)
    offset = today - drift.next_day_start

    def moved(rows: list[RatingRow]) -> list[RatingRow]:
        return [(user, item, rating, ts + offset) for user, item, rating, ts in rows]

    return DailyDrift(moved(drift.history), moved(drift.later), moved(drift.next_day), today)


@dataclass(frozen=True, slots=True)
class Api:
    process: ManagedProcess
    url: str
    token: str


def _start_api(env: dict[str, str], folder: Path) -> Api:
    token = secrets.token_hex(16)

    def launch(ports: Mapping[str, int]) -> Launch:
        url = f"http://127.0.0.1:{ports['http']}"

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        port = str(ports["http"])
        full = {**os.environ, **env, "RECSYS_PORT": port, "RECSYS_ADMIN_TOKEN": token}
        argv = (sys.executable, "-m", "app", "--log-level", "warning")
        return Launch(argv, full, ready, ready_timeout_s=120.0)

    process = start_managed_on_ports("recsys-api", ["http"], launch, folder / "api.log")
    return Api(process, f"http://127.0.0.1:{process.ports['http']}", token)


def _settled(client: redis.Redis, keys: KeySpace, processes: list[ManagedProcess]) -> None:
    give_up = time.monotonic() + SETTLE_S
    while unapplied(client, keys, PARTITIONS) or unarchived(client, keys, PARTITIONS):
        if time.monotonic() > give_up:
            raise TimeoutError("\n".join(p.log_tail() for p in processes))
        time.sleep(0.1)


def run_loop(options: LoopOptions, say: Callable[[str], None] = print) -> Cycle:
    folder = options.folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cycle = Cycle()
    drift, history = _generated(options, cycle, say)
    stable = folder / "worlds" / "serving"
    with cycle.step(say) as said:
        schema = load_schema(interactions_schema_path())
        build_world_from_log(WorldRecipe(history, COLUMNS, seed=options.seed), stable, schema)
        said.append(f"Built the serving world {_world_id(stable)} from the history.")
    with ExitStack() as running:
        stack = _LoopStack.started(folder, stable, running)
        _past_week(stack, drift, options, cycle, say)
        report = _retrained(history, stable, options, cycle, say)
        if report["outcome"] != "accepted":
            cycle.verdict, cycle.final_world = "refused", _world_id(stable)
            return cycle
        with cycle.step(say) as said:
            said.append(stack.advance(options.percent))
        _todays_traffic(stack, drift, cycle, say)
        with cycle.step(say) as said:
            candidate = Path(report["world"])
            judgement = _judged(folder / "archive", drift.next_day_start, candidate, options)
            cycle.verdict = judgement.verdict.value
            low, high = judgement.interval
            said.append(
                f"Judged: click rate {judgement.candidate_rate:.4f} against "
                f"{judgement.stable_rate:.4f}, difference {judgement.difference:+.4f} "
                f"(95%: {low:+.4f} to {high:+.4f}): {judgement.verdict.value}, {judgement.why}."
            )
        with cycle.step(say) as said:
            said.append(stack.act(judgement.verdict))
        cycle.final_world = stack.serving_world()
    return cycle


def _generated(
    options: LoopOptions, cycle: Cycle, say: Callable[[str], None]
) -> tuple[DailyDrift, Path]:
    """The drifting log, moved to end today, and its history written for the first build."""
    shape = options.shape
    with cycle.step(say) as said:
        drift = shifted(daily_drift(options.seed, shape), time.time())
        history = drift.write_history(options.folder / "history.csv")
        said.append(
            f"Generated {shape.users:,} users whose tastes drift day by day: "
            f"{len(drift.history):,} ratings of history, {len(drift.later):,} over the last "
            f"{shape.later_days} days, {len(drift.next_day):,} today."
        )
    return drift, history


def _past_week(
    stack: _LoopStack,
    drift: DailyDrift,
    options: LoopOptions,
    cycle: Cycle,
    say: Callable[[str], None],
) -> None:
    with cycle.step(say) as said:
        posted = asyncio.run(post_week(stack.api.url, drift.later))
        _settled(stack.redis, KeySpace("recsys"), stack.processes)
        yesterday = day_of((drift.next_day_start - DAY) * 1000)
        kept = ArchiveStore(str(options.folder / "archive")).read_day(Kind.EVENTS, yesterday)
        said.append(
            f"Posted the last {options.shape.later_days} days' {posted:,} ratings to /events: "
            "recsys-ingest folded them into the users, recsys-archive kept them by day"
            f" ({kept.num_rows:,} of them yesterday)."
        )


def _retrained(
    history: Path, stable: Path, options: LoopOptions, cycle: Cycle, say: Callable[[str], None]
) -> dict[str, Any]:
    """`recsys retrain` on the history and the archive's days: its report."""
    with cycle.step(say) as said:
        report = retrain(
            RetrainPlan(
                interactions=history,
                columns=COLUMNS,
                archive=str(options.folder / "archive"),
                serving=stable,
                worlds=options.folder / "worlds",
                window_days=options.shape.later_days,
                margin=options.retrain_margin,
                seed=options.seed,
            )
        )
        new, serving = (report["evaluation"][w][f"hit@{K}"] for w in ("new", "serving"))
        said.append(
            f"Retrained on the history and the archive's {report['rows']['archive']:,} "
            f"events: {report['outcome']} (hit@{K} on {report['held_out_day']}'s users: new "
            f"world {new:.4f}, serving world {serving:.4f})."
        )
    return report


def _todays_traffic(
    stack: _LoopStack, drift: DailyDrift, cycle: Cycle, say: Callable[[str], None]
) -> None:
    with cycle.step(say) as said:
        day = asyncio.run(ask_and_click(stack.api.url, drift.next_day, K))
        _settled(stack.redis, KeySpace("recsys"), stack.processes)
        cycle.failed_answers, cycle.answers = day.failed, dict(day.answers)
        said.append(
            "Today's traffic: "
            + ", ".join(
                f"{role} {day.answers.get(role, 0):,} answers, {day.clicks.get(role, 0):,} clicked"
                for role in ("stable", "candidate")
            )
            + f"; {day.failed} failed or degraded."
        )


def _judged(archive: Path, today_s: int, candidate: Path, options: LoopOptions) -> Judgement:
    today = day_of(today_s * 1000)
    rates = arm_rates(ArchiveStore(str(archive)), "world_id", today, today)
    candidate_id = _world_id(candidate)
    stable_id = next(arm for arm in rates if arm != candidate_id)
    kind = TYPES[0]
    return judge(
        rates[stable_id][kind],
        rates[candidate_id][kind],
        options.min_answers,
        options.max_answers,
        options.margin,
    )


def _world_id(world: Path) -> str:
    stamp = read_stamp(world)
    return stamp.world_id if stamp is not None else ""


@dataclass
class _LoopStack:
    folder: Path
    redis: redis.Redis
    triton_url: str
    repository: Path
    api: Api
    processes: list[ManagedProcess]

    @classmethod
    def started(cls, folder: Path, stable: Path, running: ExitStack) -> _LoopStack:
        schema = world_schema(stable, None)
        options = StackOptions(stable, project_root() / "model_repository", folder / "run")
        repository = prepare_model_repository(options, schema.model_name)
        processes: list[ManagedProcess] = []
        running.callback(_stop_all, processes)
        redis_process, redis_url = start_redis(folder / "run" / "redis")
        processes.append(redis_process)
        client = redis.Redis.from_url(redis_url)
        running.callback(client.close)
        load_world_into_redis(stable, client, schema, KeySpace("recsys"))
        triton, triton_url = start_triton(
            default_triton_env(),
            repository,
            folder / "run" / "triton",
            [schema.model_name],
            model_control=True,
        )
        processes.append(triton)
        common = {
            "RECSYS_REDIS_URL": redis_url,
            "RECSYS_ARTIFACTS_DIR": str(stable),
            "RECSYS_EVENT_PARTITIONS": str(PARTITIONS),
            "RECSYS_WORLDS_FILE": str(folder / "worlds.toml"),
            "RECSYS_EVENT_MAX_AGE_MS": str(10 * DAY * 1000),
        }
        processes.append(start_ingest(common, folder / "run" / "ingest"))
        archive = {**common, "RECSYS_ARCHIVE_URI": str(folder / "archive")}
        processes.append(start_archive(archive, folder / "run" / "archive"))
        api_env = {
            **common,
            "RECSYS_TRITON_URL": triton_url,
            "RECSYS_REQUEST_BUDGET_MS": "1000",
            "RECSYS_TRITON_TIMEOUT_MS": "500",
            "RECSYS_REDIS_TIMEOUT_MS": "200",
        }
        api = _start_api(api_env, folder / "run")
        processes.append(api.process)
        return cls(folder, client, triton_url, repository, api, processes)

    def advance(self, percent: float) -> str:
        """What the advance timer does: the retrain's accepted world staged and loaded."""
        plan = Advance(
            self.folder / "worlds", self.api.url, self.api.token, self.repository,
            self.triton_url, percent,
        )  # fmt: skip
        return advance(plan, self.redis)

    def act(self, verdict: Verdict) -> str:
        if verdict is Verdict.PROMOTE:
            state = call(self.api.url, self.api.token, "promote")
            return f"Promoted: world {state['stable']} now answers every user."
        if verdict is Verdict.ROLL_BACK:
            state = call(self.api.url, self.api.token, "rollback")
            return f"Rolled back: world {state['stable']} answers every user again."
        return "Waited: the candidate keeps its share until the judge can tell."

    def serving_world(self) -> str:
        body = {"user_id": "u1", "num_items": 1}
        answer = httpx.post(f"{self.api.url}/recommend", json=body, timeout=10.0).json()
        world: str = answer["world"]["id"]
        return world


def _stop_all(processes: list[ManagedProcess]) -> None:
    for process in reversed(processes):
        process.stop()


def _run(args: argparse.Namespace) -> None:
    # Each step says itself; the clients' request lines would drown the sentences.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    options = LoopOptions(
        folder=args.folder,
        shape=replace(DailyShape(), users=args.users),
        seed=args.seed,
        percent=args.percent,
        min_answers=args.min_answers,
        margin=args.margin,
    )
    started = time.monotonic()
    cycle = run_loop(options)
    print(f"The loop took {time.monotonic() - started:.0f} s; world {cycle.final_world} serves.")


def register(commands: Commands) -> None:
    loop = commands.add_parser(
        "demo-loop",
        help="the loop on a local stack: traffic, archive, retrain, canary, judge, promote",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    loop.add_argument("--folder", type=Path, default=project_root() / "var" / "loop")
    # Enough users that a 10% candidate gets the answers the judge needs in one day.
    loop.add_argument("--users", type=int, default=DEMO_USERS)
    loop.add_argument("--seed", type=int, default=5)
    loop.add_argument("--percent", type=float, default=10.0, help="the candidate's share")
    loop.add_argument("--min-answers", type=int, default=100, help="the judge's, per arm")
    loop.add_argument("--margin", type=float, default=0.25, help="the judge's, relative")
    loop.set_defaults(run=_run)
