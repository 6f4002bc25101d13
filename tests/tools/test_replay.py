"""The replay's walk and scores, and the drifting log it is measured on."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from recsys_tools.replay import Score, rows_in_time_order
from recsys_tools.world.generate.drift import DriftShape, write_drift_log
from recsys_tools.world.read.log import LogColumns, read_log

COLUMNS = LogColumns(weight="rating", min_weight=4.0)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_the_drifting_log_moves_tastes_after_the_history(tmp_path: Path) -> None:
    shape = DriftShape(groups=4, items_per_group=20, users=40, history_per_user=3, later_per_user=4)
    drift = write_drift_log(tmp_path, seed=1, shape=shape)
    history, later = _rows(drift.history), _rows(drift.later)
    assert max(int(r["timestamp"]) for r in history) < drift.since
    assert min(int(r["timestamp"]) for r in later) >= drift.since
    items = {r["item_id"] for r in history}
    assert items == {f"i{n}" for n in range(80)}  # every item in the catalog
    group = {}  # a known user's history group against the group they rate later
    for row in history:
        if row["user_id"].startswith("u") and float(row["rating"]) >= 4:
            group[row["user_id"]] = int(row["item_id"][1:]) // 20
    moved = {
        r["user_id"]
        for r in later
        if r["user_id"] in group and int(r["item_id"][1:]) // 20 != group[r["user_id"]]
    }
    newcomers = {r["user_id"] for r in later} - set(group)
    assert moved
    assert newcomers


def test_rows_come_in_time_order_from_the_given_second(tmp_path: Path) -> None:
    drift = write_drift_log(
        tmp_path, seed=2, shape=DriftShape(users=20, groups=3, items_per_group=20)
    )
    rows = rows_in_time_order(read_log(drift.later, COLUMNS), drift.since + 86_400)
    assert rows
    assert [r.ts_s for r in rows] == sorted(r.ts_s for r in rows)
    assert all(r.ts_s >= drift.since + 86_400 for r in rows)
    assert all(r.positive and r.rating in (4.0, 5.0) for r in rows)


def test_a_score_counts_hits_and_their_rank() -> None:
    score = Score()
    for rank in (1, None, 3, None):
        score.add(rank)
    report = score.report(10, events=True)
    assert report["hit@10"] == 0.5
    assert report["ndcg@10"] == pytest.approx((1.0 + 0.5) / 4, abs=1e-4)
