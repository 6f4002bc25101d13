"""What each input buys: columns the ranker is told to ignore are never seen, and the
build keeps the item table's features only where the evaluation says they help."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import onnxruntime as ort
from recsys_tools.world.judge.ablation import (
    FEATURE_GROUPS,
    ITEM_TABLE,
    ignored_columns,
    ignored_signals,
    item_table_columns,
    weigh_inputs,
)
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.learn.ranker.export import export_net
from recsys_tools.world.learn.ranker.fit import fit_net
from recsys_tools.world.learn.ranker.net import MLP
from recsys_tools.world.read.items import ItemInfo
from recsys_tools.world.read.log import InteractionLog, ReadCounts

from app.world.schema import load_schema
from tests.unit.tiny_schema import tiny_sequence_schema

WIDTH = 6


def test_an_ignored_column_is_never_seen_in_training_or_in_the_graph() -> None:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((3000, WIDTH)).astype(np.float32)
    labels = (rows[:, 0] + 0.3 * rng.standard_normal(3000) > 0).astype(np.int8)
    ignored = np.zeros(WIDTH, dtype=bool)
    ignored[0] = True
    shape = replace(MLP, epochs=4, patience=2)
    blind = fit_net(rows, labels, None, shape, seed=1, ignored=ignored)
    seeing = fit_net(rows, labels, None, shape, seed=1)
    moved = rows.copy()
    moved[:, 0] = rng.standard_normal(3000).astype(np.float32) * 10
    np.testing.assert_allclose(blind.scores(rows), blind.scores(moved), rtol=1e-5)
    assert not np.allclose(seeing.scores(rows), seeing.scores(moved), rtol=1e-3)
    session = ort.InferenceSession(
        export_net(blind, "x", "score", WIDTH), providers=["CPUExecutionProvider"]
    )
    served = [session.run(["score"], {"x": r})[0].ravel() for r in (rows[:50], moved[:50])]
    np.testing.assert_allclose(served[0], served[1], rtol=1e-5)
    np.testing.assert_allclose(served[0], blind.scores(rows[:50]), rtol=1e-4, atol=1e-6)


def test_each_group_ignores_its_own_block_and_the_item_table_its_columns() -> None:
    schema = tiny_sequence_schema()
    log = _log(with_table=True)
    assert ignored_columns(schema, frozenset(), log) is None
    for group in FEATURE_GROUPS:
        if group not in schema.blocks:
            continue
        mask = ignored_columns(schema, frozenset({group}), log)
        assert mask is not None
        block = schema.blocks[group]
        assert mask[block].all()
        assert mask.sum() == block.stop - block.start
    # The interactions schema derives all four columns the item table feeds.
    schema = load_schema(interactions_schema_path())
    table = item_table_columns(schema, log)
    assert len(table) == 4
    named = {
        ("item_dense", schema.item_dense),
        ("user_dense", schema.user_dense),
        ("sequence", schema.sequence),
    }
    expected = [
        schema.blocks[block].start + names.index(name)
        for block, names in named
        for name in ("category_share", "category_breadth", "recent_category", "freshness")
        if name in names
    ]
    assert sorted(table) == sorted(expected)
    mask = ignored_columns(schema, frozenset({ITEM_TABLE}), log)
    assert mask is not None
    assert sorted(np.flatnonzero(mask).tolist()) == sorted(expected)
    # A log whose item table gives neither categories nor dates: nothing of it to leave out.
    assert item_table_columns(schema, _log(with_table=False)) == []
    signals = ignored_signals(schema, frozenset({ITEM_TABLE}), log)
    assert signals.tolist() == [name == "recent_category" for name in schema.sequence]


def _log(with_table: bool) -> InteractionLog:
    items = ItemInfo(
        ids=np.array(["a", "b"]),
        category_names=("drama",) if with_table else (),
        category_offsets=np.array([0, 1, 1] if with_table else [0, 0, 0], dtype=np.int64),
        category_codes=np.array([0] if with_table else [], dtype=np.int64),
        published=np.array([10, 20], dtype=np.int64) if with_table else None,
        titles=np.array(["A", "B"]),
    )
    return InteractionLog(
        source="log.csv",
        user_ids=np.array(["u"]),
        items=items,
        user=np.zeros(2, dtype=np.int64),
        item=np.arange(2, dtype=np.int64),
        time=np.arange(2, dtype=np.int64),
        weight=None,
        positive=np.ones(2, dtype=bool),
        counts=ReadCounts(2, {}, 0),
    )


def _evaluation(ndcg: float) -> dict[str, Any]:
    return {"stages": {"rank": {"recall@10": ndcg, "ndcg@10": ndcg}}}


class _Learner:
    """Stands in for training: the NDCG each variant would reach, and what was left out."""

    def __init__(self, bare: float, groups: float = 0.1) -> None:
        self.bare, self.groups = bare, groups
        self.asked: list[frozenset[str]] = []

    def __call__(self, without: frozenset[str]) -> tuple[str, dict[str, Any]]:
        self.asked.append(without)
        ndcg = self.groups if without - {ITEM_TABLE} else self.bare
        return f"learnt without {sorted(without)}", _evaluation(ndcg)


def test_auto_keeps_the_item_table_unless_it_lowers_ndcg() -> None:
    train = _log(with_table=True)
    helps = weigh_inputs(train, ("first", _evaluation(0.3)), _Learner(bare=0.2), "auto", False)
    assert helps.without == frozenset()
    assert helps.learnt == "first"
    assert helps.report["item_features"] == "used"
    assert [row["change"] for row in helps.report["compared"]] == [0.0, -0.1]
    hurts = weigh_inputs(train, ("first", _evaluation(0.2)), _Learner(bare=0.25), "auto", False)
    assert hurts.without == {ITEM_TABLE}
    assert hurts.learnt == "learnt without ['item_table']"
    assert hurts.evaluation == _evaluation(0.25)
    assert hurts.report["item_features"] == "left out of the ranker: they lowered NDCG@10"
    assert [row["used"] for row in hurts.report["compared"]] == [False, True]
    assert [row["change"] for row in hurts.report["compared"]] == [-0.05, 0.0]


def test_on_and_off_are_taken_as_said_and_compare_trains_once_per_group() -> None:
    train = _log(with_table=True)
    learner = _Learner(bare=0.9)
    kept = weigh_inputs(train, ("first", _evaluation(0.2)), learner, "on", False)
    assert kept.without == frozenset()
    assert learner.asked == []
    off = weigh_inputs(train, ("first", _evaluation(0.2)), learner, "off", True)
    assert off.without == {ITEM_TABLE}
    assert off.report["item_features"] == "left out of the ranker (--item-features off)"
    # Compared without each group, beside what the served world already leaves out.
    assert learner.asked == [frozenset({ITEM_TABLE, g}) for g in FEATURE_GROUPS]
    none = weigh_inputs(
        _log(with_table=False), ("f", _evaluation(0.2)), _Learner(0.9), "auto", False
    )
    assert none.report == {
        "item_features": "none given",
        "compared": [
            {"input": "everything", "used": True, "recall@10": 0.2, "ndcg@10": 0.2, "change": 0.0}
        ],
    }
