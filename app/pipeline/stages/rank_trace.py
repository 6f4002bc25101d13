"""What a trace shows of stage `rank`: the top scored, best first, with their heads and
main features, and where the followed item scored. Built beside the stage, from its result."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Indices, Stage
from app.pipeline.trace import TOP_SCORED, ItemIds, Trace, model_order
from app.pipeline.types import Packed, Ranked, Scored
from app.world.schema import HEAD_NAMES, FeatureSchema


def record_rank(
    trace: Trace, packed: Packed, ranked: Ranked, schema: FeatureSchema, ids: ItemIds
) -> None:
    """The top scored, best first, with their heads and main features; the followed item's
    score and rank."""
    scored = ranked.scored
    order = model_order(scored.scores, scored.positions)
    record = trace.record(Stage.RANK)
    record.came_in, record.went_out = len(packed.rows), ranked.candidates
    record.facts["scored_total"] = ranked.candidates
    row_of = np.full(len(scored.positions), -1, dtype=np.int64)
    found = packed.hydrated.items.found
    row_of[found] = np.arange(len(found))
    top = order[:TOP_SCORED]
    # Every figure of the top rows at once, then as Python values: a trace costs a few
    # array operations, not one per feature and row.
    names, figures = _main_features(schema, packed.rows, row_of[top])
    heads = None if scored.heads is None else np.round(scored.heads[top], 4).tolist()
    columns = ["rank", "item_id", "score", *(f"p_{n}" for n in HEAD_NAMES if heads), *names]
    table = record.table(
        "scored", f"Scored before rerank (top {len(top)} of {ranked.candidates})", columns
    )
    top_ids = ids.ids_at(scored.positions[top]).tolist()
    top_scores = np.round(scored.scores[top].astype(np.float64), 4).tolist()
    for k, item_id in enumerate(top_ids):
        entry: dict[str, Any] = {"rank": k + 1, "item_id": item_id, "score": top_scores[k]}
        if heads is not None:
            entry |= {f"p_{name}": p for name, p in zip(HEAD_NAMES, heads[k], strict=False)}
        figure = figures[k]
        if figure is not None:
            entry |= dict(zip(names, figure, strict=True))
        table.rows.append(entry)
    _follow(trace, scored, order, row_of)
    trace.model = {"variant": str(ranked.model.variant), "version": ranked.model.version}


def _follow(trace: Trace, scored: Scored, order: Indices, row_of: npt.NDArray[np.int64]) -> None:
    f = trace.followed
    at = np.flatnonzero(scored.positions == trace.about)
    if len(at):
        f.fetched = bool(row_of[at[0]] >= 0)
        if not np.isnan(scored.scores[at[0]]):
            f.score = round(float(scored.scores[at[0]]), 4)
            f.model_rank = int(np.flatnonzero(order == at[0])[0]) + 1


def _main_features(
    schema: FeatureSchema, rows: npt.NDArray[np.float32], at: Indices
) -> tuple[list[str], list[list[float] | None]]:
    """The rows' main features by name: recall's score (the user-item product's sum), the
    item's dense features and the sequence signals; None for a candidate without a row."""
    names: list[str] = []
    columns: list[npt.NDArray[np.float32]] = []
    picked = rows[np.maximum(at, 0)] if len(rows) else np.zeros((len(at), schema.width))
    product = schema.blocks.get("user_item_product")
    if product is not None:
        names.append("recall")
        columns.append(picked[:, product].sum(axis=1))
    for block_name, block_names in (
        ("item_dense", schema.item_dense),
        ("sequence", schema.sequence),
    ):
        block = schema.blocks.get(block_name)
        if block is not None:
            names.extend(block_names)
            columns.extend(picked[:, block].T)
    if not columns:
        return names, [[] if k >= 0 else None for k in at.tolist()]
    table = np.round(np.column_stack(columns).astype(np.float64), 4).tolist()
    return names, [row if k >= 0 else None for row, k in zip(table, at.tolist(), strict=True)]
