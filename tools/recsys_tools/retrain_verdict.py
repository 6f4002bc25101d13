"""How a retrain judges the next world on the held-out day: hit@k from each world's own
files, each ranker it could ship, and which one ships."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from app.core.errors import ConfigError
from app.world.layout import MODEL_FILE
from recsys_tools.retrain_rows import RetrainPlan
from recsys_tools.world.judge.answers import AskContext, WorldAnswers
from recsys_tools.world.learn.ranker.from_impressions import (
    ImpressionRanker,
    ShownRows,
    compare_on_answers,
)


def hit_at_k(
    answers: WorldAnswers, history: pa.Table, held_out: pa.Table, k: int, positive: float
) -> dict[str, Any]:
    """The share of the held-out day's users with one of that day's new positives (not had
    before) among the world's k for them, from the world's own files."""
    had: dict[str, set[str]] = {}
    for user, item in zip(
        history.column("user_id").to_pylist(), history.column("item_id").to_pylist(), strict=True
    ):
        had.setdefault(user, set()).add(item)
    wanted: dict[str, set[str]] = {}
    day = held_out.filter(pc.greater_equal(held_out.column("weight"), positive))
    for user, item in zip(
        day.column("user_id").to_pylist(), day.column("item_id").to_pylist(), strict=True
    ):
        if item not in had.get(user, set()):
            wanted.setdefault(user, set()).add(item)
    users = sorted(wanted)
    if not users:
        raise ConfigError("the held-out day has no new positives to judge the worlds on")
    hits = sum(
        1 for user, items in answers.answers(users, AskContext()) if set(items[:k]) & wanted[user]
    )
    return {"users": len(users), "hits": hits, f"hit@{k}": round(hits / len(users), 4)}


def judged_rankers(
    plan: RetrainPlan,
    world: Path,
    history: pa.Table,
    held_out: pa.Table,
    held_shown: ShownRows,
    learnt: ImpressionRanker | None,
) -> dict[str, Any]:
    """Each ranker the new world could ship, judged on the held-out day: hit@k, and the
    order it gives that day's answers; which ships (--ranker)."""
    positive = plan.columns.min_weight if plan.columns.min_weight is not None else 1.0
    answers = WorldAnswers(world)  # read once; each ranker asks it in turn
    hit = {"lists": hit_at_k(answers, history, held_out, plan.k, positive)}
    judged: dict[str, Any] = {"hit": hit, "impressions": None, "shipped": "lists"}
    if learnt is None:
        if plan.ranker not in ("lists", "better"):
            raise ConfigError(
                f"--ranker {plan.ranker}: too few answers with a choice to learn from"
            )
        return judged
    models = {"lists": (world / MODEL_FILE).read_bytes(), **learnt_models(learnt)}
    for name, model in models.items():
        if name != "lists":
            hit[name] = hit_at_k(answers.ranked_by(model), history, held_out, plan.k, positive)
    judged["impressions"] = learnt.report
    judged["held_out_answers_ndcg@10"] = compare_on_answers(answers, held_shown, models)
    judged["shipped"] = shipped_ranker(plan.ranker, hit, f"hit@{plan.k}")
    return judged


def shipped_ranker(asked: str, hit: dict[str, dict[str, Any]], metric: str) -> str:
    """The ranker a new world ships: the one asked for where it was judged, the lists' where
    it was not; `better` the highest by `metric` (the lists' on a tie: first of the highest)."""
    if asked == "better":
        return max(hit, key=lambda name: hit[name][metric])
    return asked if asked in hit else "lists"


def learnt_models(learnt: ImpressionRanker) -> dict[str, bytes]:
    models = {"impressions": learnt.onnx_model}
    if learnt.with_lists is not None:
        models["lists_with_answers"] = learnt.with_lists
    return models
