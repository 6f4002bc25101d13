"""The trace recorder: a bounded ring, sampling, what a stage records; and the sentences
`explain` makes of what a trace followed."""

from __future__ import annotations

import numpy as np

from app.core.vocabulary import Removal, Stage
from app.pipeline.explain import explain
from app.pipeline.stages.filter import _filtered
from app.pipeline.stages.prerank import _preranked
from app.pipeline.stages.recall import _recalled
from app.pipeline.trace import FIRST_IDS, Trace, TraceRing
from app.pipeline.types import Filtered

IDS_ARRAY = np.array([f"i{n}" for n in range(100)])


class _Ids:
    def ids_at(self, positions: np.ndarray) -> np.ndarray:
        ids: np.ndarray = IDS_ARRAY[positions]
        return ids


IDS = _Ids()


def test_the_ring_keeps_the_latest_only() -> None:
    ring = TraceRing(size=3, sample_percent=100.0)
    for n in range(10):
        trace = ring.start(f"r{n}", {"user_id": "u1"}, asked=False)
        assert trace is not None
        ring.keep(trace)
    assert len(ring) == 3
    assert [t.request_id for t in ring.recent()] == ["r9", "r8", "r7"]
    assert ring.find("r8") is not None
    assert ring.find("r1") is None


def test_sampling_traces_its_share_and_always_what_asks() -> None:
    never = TraceRing(size=10, sample_percent=0.0)
    assert never.start("a", {}, asked=False) is None
    assert never.start("b", {}, asked=True) is not None
    some = TraceRing(size=10, sample_percent=10.0, seed=3)
    made = sum(some.start(str(n), {}, asked=False) is not None for n in range(4000))
    assert 250 < made < 550  # 400 expected


def _removed(trace: Trace, reason: Removal, removed: list[int] | np.ndarray) -> None:
    positions = np.asarray(removed, dtype=np.int64)
    _filtered(trace, Filtered(np.empty(0, np.int64), positions, reason), IDS)


def test_a_stage_records_counts_and_the_first_ids_only() -> None:
    trace = Trace("r", 0.0, {})
    _recalled(trace, "ann", np.arange(40), IDS)
    _removed(trace, Removal.SEEN, np.arange(5, 30))
    first = list(IDS_ARRAY[:FIRST_IDS])
    assert trace.rows(Stage.RECALL, "sources") == [{"source": "ann", "count": 40, "first": first}]
    removed = trace.records[Stage.FILTER].removed
    assert removed[0]["count"] == 25
    assert len(removed[0]["first"]) == FIRST_IDS
    # Records come in the order the stages wrote them; a stage's table is found by name only.
    assert list(trace.records) == [Stage.RECALL, Stage.FILTER]
    assert trace.rows(Stage.RANK, "scored") == []
    trace.span("recall", trace.began + 0.002, 0.001)
    trace.counted("recall", 40)
    assert trace.spans[0].start_ms == 2.0
    assert trace.spans[0].duration_ms == 1.0
    assert trace.spans[0].candidates == 40
    # Nothing is followed outside explain mode: no id is looked for.
    assert trace.followed.source is None


def test_a_followed_item_is_found_where_it_leaves() -> None:
    trace = Trace("r", 0.0, {}, about=7)
    _recalled(trace, "ann", np.array([1, 2]), IDS)
    _recalled(trace, "popular", np.array([7, 9]), IDS)
    _removed(trace, Removal.BLOCKED, [9])
    _preranked(trace, np.array([1, 2, 7]), np.array([0.9, 0.5, 0.1]), keep=2)
    followed = trace.followed
    assert followed.source == "popular"
    assert followed.removed_by is None
    assert followed.prerank_rank == 3
    said = explain(trace, "i7")
    assert said.verdict == "not_preranked"
    assert said.stage == "prerank"
    assert "rank 3 of 3 and keeps the best 2" in said.because


def test_explain_names_the_stage_and_the_figure() -> None:
    trace = Trace("r", 0.0, {}, about=4)
    followed = trace.followed
    followed.facts |= {"similarity_rank": 900, "catalog_size": 1000, "ann_returned": 250}
    assert explain(trace, "i4").verdict == "not_recalled"
    assert "ranks 900 of 1,000" in explain(trace, "i4").because
    followed.source = "ann"
    followed.removed_by = "seen"
    assert explain(trace, "i4").because == "recalled by ann, then removed by the seen filter"
    followed.removed_by = None
    followed.fetched, followed.score, followed.model_rank = True, 0.2, 31
    trace.record(Stage.RANK).facts["scored_total"] = 500
    answer = trace.record(Stage.RERANK).table("answer", "The answer", ["rank", "item_id"])
    answer.rows.append({"rank": 1, "item_id": "i1", "score": 0.9, "model_score": 0.8})
    outranked = explain(trace, "i4")
    assert outranked.verdict == "outranked"
    assert "rank 31 of 500" in outranked.because
    assert "the last served scored 0.8000" in outranked.because
    followed.model_rank = 1
    followed.facts["rerank_rule"] = (
        "the category cap (4 per category, [diversity] max_per_category)"
    )
    assert explain(trace, "i4").verdict == "reranked_out"
    assert "category cap" in explain(trace, "i4").because
    followed.served_rank = 1
    assert explain(trace, "i4").verdict == "served"
    assert explain(Trace("r", 0.0, {}), "nope").verdict == "unknown"
