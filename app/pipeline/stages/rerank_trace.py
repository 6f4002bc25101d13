"""What a trace shows of stage `rerank`: the answer, and what the rules changed against the
model's order, each left-out item with the selector that left it out. Built beside the stage,
from its selection."""

from __future__ import annotations

import math

import numpy as np

from app.core.vocabulary import Stage
from app.pipeline.selectors.selecting import Selection
from app.pipeline.trace import Trace, model_order
from app.pipeline.types import Ranked, Scored
from app.release.catalog import Catalog


def record_rerank(trace: Trace, ranked: Ranked, selection: Selection, catalog: Catalog) -> None:
    """The answer, and what rerank changed against the model's order: items boosted or
    moved, backfilled unscored, and those the model put in the top N that it left out, each
    with the selector that left it out."""
    scored = ranked.scored
    order = model_order(scored.scores, scored.positions)
    model_rank = np.zeros(len(scored.scores), dtype=np.int64)
    model_rank[order] = np.arange(1, len(order) + 1)
    record = trace.record(Stage.RERANK)
    record.came_in, record.went_out = len(scored.positions), len(selection.positions)
    changes = record.table("changes", "What rerank changed", ["item_id", "change"])
    answer = record.table("answer", "The answer", ["rank", "item_id", "score", "model_rank"])
    chosen, final = selection.positions, selection.scores
    for served, (j, score) in enumerate(zip(chosen.tolist(), final.tolist(), strict=True), 1):
        item_id = str(catalog.ids_at(scored.positions[j : j + 1])[0])
        raw = float(scored.scores[j])
        answer.rows.append(
            {
                "rank": served,
                "item_id": item_id,
                "score": None if np.isnan(score) else round(score, 4),
                "model_score": None if np.isnan(raw) else round(raw, 4),
                "model_rank": None if np.isnan(raw) else int(model_rank[j]),
            }
        )
        change = _change(raw, score, int(model_rank[j]), served)
        if change:
            changes.rows.append({"item_id": item_id, "change": change})
    served_at = set(chosen.tolist())
    for j in (j for j in order[: ranked.asked.query.num_items].tolist() if j not in served_at):
        item_id = str(catalog.ids_at(scored.positions[j : j + 1])[0])
        # The model's first N are rerank's starting answer: each left out has its selector.
        reason = selection.left_out[j]
        changes.rows.append({"item_id": item_id, "change": f"model rank {model_rank[j]}: {reason}"})
    _follow(trace, scored, selection)


def _follow(trace: Trace, scored: Scored, selection: Selection) -> None:
    at = np.flatnonzero(scored.positions == trace.about)
    if not len(at):
        return
    j = int(at[0])
    picked = np.flatnonzero(selection.positions == j)
    if len(picked):
        trace.followed.served_rank = int(picked[0]) + 1
    elif j in selection.left_out:  # in the model's first N, left out by a selector
        trace.followed.facts["rerank_rule"] = selection.left_out[j]


def _change(raw: float, final: float, model_rank: int, served: int) -> str:
    if np.isnan(raw):
        return "backfilled: not scored by the model"
    if not np.isnan(final) and not math.isclose(final, raw, rel_tol=1e-6, abs_tol=1e-9):
        return (
            f"boosted by the rules ({raw:.4f} -> {final:.4f}): model rank {model_rank}, "
            f"served {served}"
        )
    if model_rank != served:
        return f"moved from model rank {model_rank} to {served}"
    return ""
