"""`recsys retrain`: the next world, built from the base log and what the archive kept.

One run, each step said as it starts and timed:
1. gather: the base log, and the archive's events over the window (a rating keeps its value,
   a click, like or purchase counts as a positive at the log's --min-weight, a dislike below
   it; impressions are not interactions), and the answers it logged. The window is the
   --window-days whole UTC days before today, by the clock of the machine running the retrain
   (--today names another day, to run a past day's retrain again): never by the newest row
   or folder, which one API host whose clock ran ahead, or one row stamped years on, would
   carry into the future until that date came. Nothing stamped from today on is used (today
   is not over); what is stamped after now is counted in the report (`left_out`);
2. split: the latest day of the two together is held out (yesterday, when it has rows); the
   rest is what the world learns;
3. build: `build-world` on the rest, into a hidden folder of --worlds, renamed to its world id
   once whole; its ranker learns from each user's own candidates that they did not go on to
   like (sampled negatives);
4. impressions: where the archive logged answers before the held-out day, a second ranker
   learns from them, shown-and-chosen against shown-and-skipped
   (world/learn/ranker/from_impressions.py), its rows packed from the world serving, which
   showed them;
5. evaluate: the new world and the world serving (--serving), each from its own files, asked
   for the held-out day's users: hit@k, the share of them with one of that day's new
   positives in their k. The new world is asked with each ranker, and both rankers order the
   held-out day's answers (NDCG@10 of what was chosen, beside the order shown); so is the
   lists' ranker with the answers' network added to its score. --ranker says which ships:
   `lists`, `impressions`, `lists_with_answers`, or `better` (the highest hit@k; the lists'
   on a tie);
6. decide: refused when the new world's hit@k is below the serving one's by more than
   --margin (relative); otherwise accepted: --worlds/candidate points at it, for loading.

Nothing here touches the world serving, its Redis or its model. A run stopped at any step
(SIGTERM, a crash, a kill) leaves its hidden folder and retrain.state behind; the next run
says where the last stopped, and clears them. --metrics-file writes the outcome for
node_exporter's textfile collector (recsys_retrain_last_outcome...).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app.core.atomic_files import write_atomically
from app.core.errors import ConfigError
from app.world.layout import MODEL_FILE
from app.world.schema import FeatureSchema, load_schema, world_schema
from app.world.stamp import read_stamp
from recsys_tools.commands import Commands
from recsys_tools.retrain_progress import STATE_FILE, Progress, said_stopped
from recsys_tools.retrain_rows import (
    Gathered,
    RetrainPlan,
    Window,
    as_of,
    gather,
    split_latest_day,
)
from recsys_tools.retrain_verdict import hit_at_k, judged_rankers, learnt_models
from recsys_tools.world.flags import add_log_flags, log_columns
from recsys_tools.world.judge.answers import WorldAnswers
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.learn.ranker.from_impressions import (
    ImpressionRanker,
    ShownRows,
    shown_items,
    train_impression_ranker,
)
from recsys_tools.world.learn.ranker.net import NETWORKS
from recsys_tools.world.read.formats import FileLayout
from recsys_tools.world.read.log import LogColumns, require_times
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe
from recsys_tools.world.recipes.report import built_neighbours
from recsys_tools.world.store.identity import stamp_world

log = logging.getLogger("recsys.retrain")
CANDIDATE_LINK = "candidate"
STEPS = ("gather", "split", "build", "impressions", "evaluate", "decide")
RANKERS = ("lists", "impressions", "lists_with_answers", "better")
# The training log's own columns, whatever the base log's were.
TRAINING = "training.parquet"
HELD_OUT = "held-out.parquet"


class RetrainRefusedError(ConfigError):
    """The new world is worse than the one serving by more than the margin."""


def retrain(plan: RetrainPlan) -> dict[str, Any]:
    """Build, judge and accept (or refuse) the next world; the report (also in the world's
    retrain.json). RetrainRefusedError when refused."""
    require_times(
        plan.columns.time is not None,
        str(plan.interactions),
        "recsys retrain holds out the latest day and reads the archive by day; give a base "
        "log with a time column (--time-col)",
    )
    progress = Progress(plan.worlds)
    try:
        return _retrain(plan, progress)
    except RetrainRefusedError:
        raise
    except BaseException:
        log.error(
            "the retrain stopped during its %s step; the world serving is untouched",
            progress.step or "first",
        )
        raise


def _retrain(plan: RetrainPlan, progress: Progress) -> dict[str, Any]:
    if read_stamp(plan.serving) is None:
        raise ConfigError(f"{plan.serving} is not a stamped world: give --serving the world served")
    plan.worlds.mkdir(parents=True, exist_ok=True)
    said_stopped(plan.worlds)
    positive = plan.columns.min_weight if plan.columns.min_weight is not None else 1.0
    building = plan.worlds / f".building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    window = Window.ending_before_today(
        time.time() if plan.now_s is None else plan.now_s, plan.window_days
    )
    with progress.step_in("gather", "Gathering the base log and the archive's window."):
        gathered = gather(plan, window)
        rows = pa.concat_tables([gathered.base, gathered.archived])
        shown = shown_items(gathered.answers, gathered.events, positive)
    _said_gathered(gathered, window, shown.answers)
    with progress.step_in("split", "Holding out the latest day to judge on."):
        history, held_out, day = split_latest_day(rows)
        pq.write_table(history, building / TRAINING)
        pq.write_table(held_out, building / HELD_OUT)
    log.info(
        "  %s held out: %d rows; %d rows to learn from", day, held_out.num_rows, history.num_rows
    )
    world = building / "world"
    with progress.step_in("build", "Building the next world from the rest."):
        schema = _built(plan, building / TRAINING, world, positive)
    held_from = int(np.datetime64(day, "s").astype(np.int64))
    with progress.step_in("impressions", "Learning a ranker from what the answers showed."):
        learnt = _learnt(plan, shown.before(held_from), schema, world)
    if learnt is None:
        log.info("  too few answers with a choice before %s: the ranker from lists only", day)
    with progress.step_in("evaluate", f"Judging both worlds on {day}'s users."):
        judged = judged_rankers(plan, world, history, held_out, shown.since(held_from), learnt)
        serving = hit_at_k(WorldAnswers(plan.serving), history, held_out, plan.k, positive)
    shipped = judged["shipped"]
    if shipped != "lists":
        assert learnt is not None
        (world / MODEL_FILE).write_bytes(learnt_models(learnt)[shipped])
        stamp_world(world, schema)  # a new model: a new id, the manifest's digests again
    verdict = _Verdict(plan, judged["hit"][shipped], serving)
    facts = {
        "held_out_day": day,
        "window_days": plan.window_days,
        "window": {"first": window.first, "last": window.last},
        "left_out": gathered.left_out,
        "rows": {
            "base": gathered.base.num_rows,
            "archive": gathered.archived.num_rows,
            "held_out": held_out.num_rows,
        },
    }
    with progress.step_in("decide", "Deciding."):
        final, report = _decided(plan, world, verdict, facts, judged, progress)
    report["seconds"] = progress.seconds
    write_atomically(final / "retrain.json", json.dumps(report, indent=2).encode())
    if verdict.accepted:  # last: what the link names is whole, report and all
        _link_candidate(plan.worlds, final.name)
    shutil.rmtree(building, ignore_errors=True)
    (plan.worlds / STATE_FILE).unlink(missing_ok=True)
    if not verdict.accepted:
        raise RetrainRefusedError(
            f"world {final.name} refused: {verdict.said()}; its files and report are in {final}"
        )
    return report


def _learnt(
    plan: RetrainPlan, shown: ShownRows, schema: FeatureSchema, world: Path
) -> ImpressionRanker | None:
    """A ranker from what the serving world's answers showed; None with too few choices."""
    lists_model = (world / MODEL_FILE).read_bytes()
    return train_impression_ranker(
        plan.serving, shown, schema, world, plan.seed, plan.network, lists_model
    )


def _said_gathered(gathered: Gathered, window: Window, answers: int) -> None:
    log.info(
        "  %d rows from the base log, %d from the archive from %s to %s; %d answers logged",
        gathered.base.num_rows,
        gathered.archived.num_rows,
        window.first,
        window.last,
        answers,
    )
    future = sum(gathered.left_out["future"].values())
    if future:
        log.warning(
            "  %d rows stamped after %s UTC, this run's clock, left out (%s): a host whose "
            "clock ran ahead, or rows stamped in the future",
            future,
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(window.now_s)),
            ", ".join(f"{n} {where}" for where, n in gathered.left_out["future"].items() if n),
        )


def _built(plan: RetrainPlan, training: Path, world: Path, positive: float) -> FeatureSchema:
    """The next world, built from the training rows in their own columns."""
    recipe = WorldRecipe(
        interactions=training,
        columns=LogColumns(
            weight="weight", min_weight=positive, layout=FileLayout(format="parquet")
        ),
        seed=plan.seed,
        network=plan.network,
        # The serving world's neighbour model, and its order model where it has one, so
        # that the verdict compares like with like.
        neighbours=built_neighbours(plan.serving),
        order_model="order" in world_schema(plan.serving, None).sequence,
    )
    build_world_from_log(recipe, world, load_schema(plan.schema or interactions_schema_path()))
    # The world's own: the build adds the order signal to the schema it was given.
    return world_schema(world, None)


@dataclass(frozen=True, slots=True)
class _Verdict:
    """The new world's hit@k against the serving one's, within the plan's margin."""

    plan: RetrainPlan
    new: dict[str, Any]
    serving: dict[str, Any]

    @property
    def metric(self) -> str:
        return f"hit@{self.plan.k}"

    @property
    def ratio(self) -> float:
        serving = self.serving[self.metric]
        return float(self.new[self.metric] / serving) if serving else float("inf")

    @property
    def accepted(self) -> bool:
        return bool(self.new[self.metric] >= self.serving[self.metric] * (1.0 - self.plan.margin))

    def said(self) -> str:
        return (
            f"{self.metric} {self.new[self.metric]:.4f} against {self.serving[self.metric]:.4f} "
            f"serving ({self.ratio:.3f}x, margin {self.plan.margin:.0%})"
        )


def _decided(
    plan: RetrainPlan,
    world: Path,
    verdict: _Verdict,
    facts: dict[str, Any],
    judged: dict[str, Any],
    progress: Progress,
) -> tuple[Path, dict[str, Any]]:
    """The new world renamed to its id, and the report: the run's facts and its verdict."""
    stamp = read_stamp(world)
    assert stamp is not None  # build_world_from_log stamps what it writes
    serving = read_stamp(plan.serving)
    assert serving is not None  # checked before the run began
    final = plan.worlds / stamp.world_id
    os.replace(world, final)
    report: dict[str, Any] = {
        "world_id": stamp.world_id,
        "world": str(final),
        "serving": str(plan.serving),
        "serving_world_id": serving.world_id,
        **facts,
        "evaluation": {
            "new": verdict.new,
            "serving": verdict.serving,
            "ratio": round(verdict.ratio, 3),
        },
        "ranker": judged,
        "margin": plan.margin,
        "outcome": "accepted" if verdict.accepted else "refused",
        "seconds": progress.seconds,
    }
    return final, report


def _link_candidate(worlds: Path, world_id: str) -> None:
    """--worlds/candidate names the accepted world, replaced in one rename."""
    link = worlds / CANDIDATE_LINK
    staged = worlds / f".{CANDIDATE_LINK}-{os.getpid()}"
    staged.unlink(missing_ok=True)
    staged.symlink_to(world_id)
    os.replace(staged, link)


def metrics_text(outcome: str, report: dict[str, Any] | None) -> str:
    """The last run, as node_exporter's textfile collector reads it."""
    lines = [
        "# HELP recsys_retrain_last_run_timestamp_seconds When the last retrain ended.",
        "# TYPE recsys_retrain_last_run_timestamp_seconds gauge",
        f"recsys_retrain_last_run_timestamp_seconds {time.time():.0f}",
        "# HELP recsys_retrain_last_outcome 1 for how the last retrain ended, 0 for the others.",
        "# TYPE recsys_retrain_last_outcome gauge",
    ]
    for each in ("accepted", "refused", "failed"):
        lines.append(f'recsys_retrain_last_outcome{{outcome="{each}"}} {int(each == outcome)}')
    if report is not None:
        lines += [
            "# HELP recsys_retrain_step_seconds Seconds each step of the last retrain took.",
            "# TYPE recsys_retrain_step_seconds gauge",
        ]
        for step, seconds in report["seconds"].items():
            lines.append(f'recsys_retrain_step_seconds{{step="{step}"}} {seconds}')
    return "\n".join(lines) + "\n"


def _stop_on_sigterm() -> None:
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _run(args: argparse.Namespace) -> None:
    plan = RetrainPlan(
        interactions=args.interactions,
        columns=log_columns(args),
        archive=args.archive,
        serving=args.serving,
        worlds=args.worlds,
        window_days=args.window_days,
        margin=args.margin,
        k=args.k,
        seed=args.seed,
        network=args.network,
        ranker=args.ranker,
        schema=args.schema,
        metrics_file=args.metrics_file,
        now_s=None if args.today is None else as_of(args.today, time.time()),
    )
    _stop_on_sigterm()
    outcome, report = "failed", None
    try:
        report = retrain(plan)
        outcome = "accepted"
    except RetrainRefusedError:
        outcome = "refused"
        raise
    finally:
        if plan.metrics_file is not None:
            write_atomically(plan.metrics_file, metrics_text(outcome, report).encode())
    evaluation, metric = report["evaluation"], f"hit@{plan.k}"
    new, serving = evaluation["new"][metric], evaluation["serving"][metric]
    print(
        f"World {report['world_id']} accepted: {metric} {new:.4f} against {serving:.4f} "
        f"serving ({evaluation['ratio']}x) on {report['held_out_day']}; "
        f"{plan.worlds / CANDIDATE_LINK} points at it."
    )


def _day(text: str) -> str:
    try:
        return str(np.datetime64(text, "D"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day (YYYY-MM-DD)") from exc


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "retrain",
        help="the next world from the base log and the archive, judged against the serving one",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--interactions", type=Path, required=True, help="the base log")
    add_log_flags(parser)
    parser.add_argument("--archive", required=True, help="the archive's path or URI")
    parser.add_argument("--serving", type=Path, required=True, help="the world serving now")
    parser.add_argument("--worlds", type=Path, required=True, help="where new worlds go")
    parser.add_argument(
        "--window-days",
        type=int,
        default=7,
        help="archive days to learn from: the whole days before today",
    )
    parser.add_argument(
        "--today",
        type=_day,
        default=None,
        metavar="YYYY-MM-DD",
        help="run as on this past day (default: today, by this machine's UTC clock): the "
        "window ends the day before; to run a past day's retrain again",
    )
    parser.add_argument("--margin", type=float, default=0.02, help="relative; 0.02: 2%%")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--network", choices=NETWORKS, default="auto", help="as build-world's")
    parser.add_argument(
        "--ranker",
        choices=RANKERS,
        default="better",
        help="the ranker shipped: from candidate lists, from the archive's answers, the "
        "lists' with the answers' network added, or the one with the highest hit@k on the "
        "held-out day",
    )
    parser.add_argument("--schema", type=Path, default=None)
    parser.add_argument("--metrics-file", type=Path, default=None, help="for node_exporter")
    parser.set_defaults(run=_run)
