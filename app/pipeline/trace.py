"""One request's trace: what each stage did to the candidates, for a sample of requests.

A trace is made only for a sampled request (RECSYS_TRACE_SAMPLE_PERCENT), or one that asks
for it (`debug: true`, or the X-Recsys-Trace header), and only while the debug pages are on:
an unsampled request pays one `is None` test a stage. What a trace holds is small and bounded
(counts, the first ids of each list, the top 50 scored), turned into ids as it is recorded;
kept traces go into a ring of fixed length per process (`TraceRing`), with no I/O on the
request path. In explain mode a trace follows one item (`about`) through every stage, and
`explain.py` says where it left.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Indices, Positions, Scores
from app.pipeline.selectors.selecting import Selection
from app.pipeline.types import Packed, Ranked
from app.release.catalog import Catalog
from app.release.schema import HEAD_NAMES, FeatureSchema

StrArray = npt.NDArray[np.str_]

FIRST_IDS = 10  # ids kept of each list a trace names (a source's, a filter's)
TOP_SCORED = 50  # scored candidates kept, best first, with their main features
NOT_FOLLOWED = -1
# Why a model top-N item no selector moved is not served: equal scores, another order.
TIED = "tied with an item served (equal scores come out in catalog order)"


@dataclass(slots=True)
class Span:
    stage: str
    start_ms: float
    duration_ms: float
    candidates: int | None = None


@dataclass(slots=True)
class Followed:
    """What happened to the item an explain request follows, stage by stage."""

    source: str | None = None  # the first candidate source that brought it
    removed_by: str | None = None  # the filter that removed it
    prerank_rank: int | None = None  # its rank by the pre-rank score (1 = best)
    prerank_pool: int = 0
    prerank_keep: int = 0
    fetched: bool | None = None  # None: never reached fetch
    score: float | None = None
    model_rank: int | None = None  # its rank by the model's score among the scored
    served_rank: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Trace:
    request_id: str
    at: float  # wall clock, for the list
    request: dict[str, Any]
    began: float = field(default_factory=time.perf_counter)
    about: int = NOT_FOLLOWED  # the followed item's catalog position, in explain mode
    spans: list[Span] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    backfilled: int = 0
    prerank: dict[str, Any] = field(default_factory=dict)
    scored: list[dict[str, Any]] = field(default_factory=list)
    scored_total: int = 0
    rerank: dict[str, Any] = field(default_factory=dict)
    answer: list[dict[str, Any]] = field(default_factory=list)
    degraded: list[dict[str, str]] = field(default_factory=list)
    model: dict[str, str] = field(default_factory=dict)
    total_ms: float = 0.0
    followed: Followed = field(default_factory=Followed)

    def span(self, stage: str, started: float, elapsed_s: float) -> None:
        start_ms = (started - self.began) * 1000.0
        self.spans.append(Span(stage, round(start_ms, 3), round(elapsed_s * 1000.0, 3)))

    def counted(self, stage: str, candidates: int) -> None:
        for span in reversed(self.spans):
            if span.stage == stage:
                span.candidates = candidates
                return

    def fell_back(self, flag: str, cause: str) -> None:
        self.degraded.append({"flag": flag, "cause": cause[:300]})

    @property
    def follows(self) -> bool:
        return self.about != NOT_FOLLOWED

    # What each stage did: called by the stages only when the request is traced.

    def recalled(self, source: str, fresh: Positions, ids: npt.NDArray[np.str_]) -> None:
        self.sources.append({"source": source, "count": len(fresh), "first": first_ids(ids, fresh)})
        if self.followed.source is None and holds(fresh, self.about):
            self.followed.source = source

    def not_recalled(self, user_vector: npt.NDArray[np.float32], catalog: Catalog) -> None:
        """How near the user the followed item is, where no source brought it."""
        facts = self.followed.facts
        ann = next((s["count"] for s in self.sources if s["source"] == "ann"), 0)
        facts["ann_returned"] = ann
        facts["catalog_size"] = catalog.size
        if catalog.vectors is None or not user_vector.any():
            return
        similarity = catalog.vectors @ user_vector
        mine = similarity[self.about]
        facts["similarity"] = round(float(mine), 4)
        facts["similarity_rank"] = int(np.count_nonzero(similarity > mine)) + 1

    def filtered(self, reason: str, removed: Positions, ids: npt.NDArray[np.str_]) -> None:
        self.removed.append(
            {"reason": reason, "count": len(removed), "first": first_ids(ids, removed)}
        )
        if self.followed.removed_by is None and holds(removed, self.about):
            self.followed.removed_by = reason

    def preranked(self, positions: Positions, scores: npt.NDArray[np.floating], keep: int) -> None:
        order = np.argsort(-scores, kind="stable")
        self.prerank = {
            "pool": len(positions),
            "keep": keep,
            "cutoff_score": round(float(scores[order[min(keep, len(order)) - 1]]), 4),
        }
        self.followed.prerank_pool, self.followed.prerank_keep = len(positions), keep
        at = np.flatnonzero(positions[order] == self.about)
        if len(at):
            self.followed.prerank_rank = int(at[0]) + 1
            self.followed.facts["prerank_score"] = round(float(scores[order[at[0]]]), 4)

    def ranked(self, packed: Packed, ranked: Ranked, schema: FeatureSchema, ids: StrArray) -> None:
        scored = ranked.scored
        order = model_order(scored.scores)
        self.scored_total = int(np.count_nonzero(~np.isnan(scored.scores)))
        row_of = np.full(len(scored.positions), -1, dtype=np.int64)
        found = packed.hydrated.items.found
        row_of[found] = np.arange(len(found))
        top = order[:TOP_SCORED]
        # Every figure of the top rows at once, then as Python values: a trace costs a few
        # array operations, not one per feature and row.
        names, figures = _main_features(schema, packed.rows, row_of[top])
        top_ids = ids[scored.positions[top]].tolist()
        top_scores = np.round(scored.scores[top].astype(np.float64), 4).tolist()
        heads = None if scored.heads is None else np.round(scored.heads[top], 4).tolist()
        for k, item_id in enumerate(top_ids):
            entry: dict[str, Any] = {"rank": k + 1, "item_id": item_id, "score": top_scores[k]}
            if heads is not None:
                entry |= {f"p_{name}": p for name, p in zip(HEAD_NAMES, heads[k], strict=False)}
            figure = figures[k]
            if figure is not None:
                entry |= dict(zip(names, figure, strict=True))
            self.scored.append(entry)
        f = self.followed
        at = np.flatnonzero(scored.positions == self.about)
        if len(at):
            f.fetched = bool(row_of[at[0]] >= 0)
            if not np.isnan(scored.scores[at[0]]):
                f.score = round(float(scored.scores[at[0]]), 4)
                f.model_rank = int(np.flatnonzero(order == at[0])[0]) + 1
        self.model = {"variant": str(ranked.model.variant), "version": ranked.model.version}

    def reranked(self, ranked: Ranked, selection: Selection, catalog: Catalog) -> None:
        """The answer, and what rerank changed against the model's order: items boosted or
        moved, backfilled unscored, and those the model put in the top N that it left out,
        each with the selector that left it out."""
        scored = ranked.scored
        order = model_order(scored.scores)
        model_rank = np.zeros(len(scored.scores), dtype=np.int64)
        model_rank[order] = np.arange(1, len(order) + 1)
        chosen, final = selection.positions, selection.scores
        changes: list[dict[str, str]] = []
        for served, (j, score) in enumerate(zip(chosen.tolist(), final.tolist(), strict=True), 1):
            item_id = str(catalog.item_ids[scored.positions[j]])
            raw = float(scored.scores[j])
            self.answer.append(
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
                changes.append({"item_id": item_id, "change": change})
        served_at = set(chosen.tolist())
        wanted = ranked.asked.query.num_items
        for j in (j for j in order[:wanted].tolist() if j not in served_at):
            item_id = str(catalog.item_ids[scored.positions[j]])
            reason = selection.left_out.get(j, TIED)
            changes.append({"item_id": item_id, "change": f"model rank {model_rank[j]}: {reason}"})
        self.rerank = {"changes": changes}
        at = np.flatnonzero(scored.positions == self.about)
        if len(at):
            j = int(at[0])
            picked = np.flatnonzero(chosen == j)
            if len(picked):
                self.followed.served_rank = int(picked[0]) + 1
            elif not np.isnan(scored.scores[j]):
                self.followed.facts["rerank_rule"] = selection.left_out.get(j, TIED)


def model_order(scores: Scores) -> Indices:
    """Scored candidates best first by the model's own score (ties: the first listed)."""
    scored = np.flatnonzero(~np.isnan(scores))
    order: Indices = scored[np.argsort(-scores[scored], kind="stable")]
    return order


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


def first_ids(ids: npt.NDArray[np.str_], positions: Positions) -> list[str]:
    return [str(i) for i in ids[positions[:FIRST_IDS]].tolist()]


def holds(positions: Positions, position: int) -> bool:
    return position != NOT_FOLLOWED and bool(np.any(positions == position))


class TraceRing:
    """The latest traces of this process, at most `size`; sampling decides which are made."""

    def __init__(self, size: int, sample_percent: float, seed: int | None = None) -> None:
        self._kept: deque[Trace] = deque(maxlen=max(1, size))
        self._rate = sample_percent / 100.0
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def chosen(self, asked: bool) -> bool:
        """Whether to trace a request: asked for, or sampled."""
        return asked or (self._rate > 0.0 and self._random.random() < self._rate)

    def start(self, request_id: str, request: dict[str, Any], asked: bool) -> Trace | None:
        """A trace for this request, or None: unsampled and not asked for."""
        return Trace(request_id, time.time(), request) if self.chosen(asked) else None

    def keep(self, trace: Trace) -> None:
        trace.total_ms = round((time.perf_counter() - trace.began) * 1000.0, 3)
        with self._lock:
            self._kept.append(trace)

    def recent(self) -> list[Trace]:
        with self._lock:
            return list(reversed(self._kept))

    def find(self, request_id: str) -> Trace | None:
        with self._lock:
            return next((t for t in reversed(self._kept) if t.request_id == request_id), None)

    def __len__(self) -> int:
        return len(self._kept)
