"""The replay's walk and scores, its arrivals, and the logs it is measured on."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from recsys_tools.replay import ReplayRow, Score, rows_in_time_order
from recsys_tools.replay_arrivals import WorldItems, arrivals
from recsys_tools.world.generate.arrivals import ArrivalShape, write_arrival_log
from recsys_tools.world.generate.drift import DriftShape, write_drift_log
from recsys_tools.world.read.items import ItemColumns, ItemInfo, read_items
from recsys_tools.world.read.log import LogColumns, read_log

from loadtest.replay_arrivals import untouched_share

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


def _table(tmp_path: Path) -> ItemInfo:
    path = tmp_path / "items.csv"
    path.write_text(
        "item_id,genre,title\na,drama,Old One\nn1,drama|western,New One\nn2,opera,Unheard Of\n"
    )
    return read_items(path, ItemColumns(category="genre", title="title"))


def test_an_item_the_world_lacks_is_put_once_just_before_its_first_row(tmp_path: Path) -> None:
    world = WorldItems(frozenset({"a"}), ("drama", "comedy"))
    items = ["a", "n1", "a", "n1", "n2", "n3"]
    found = arrivals(items, [10, 20, 30, 40, 50, 60], world, _table(tmp_path))
    assert found.before == {
        1: [{"item_id": "n1", "published_at": 20, "categories": ["drama"], "title": "New One"}]
    }
    # n2's only category is one the world lacks, n3 is not in the table: neither can be put.
    assert found.unplaced == ("n2", "n3")
    assert found.new == {"n1", "n2", "n3"}


def test_a_score_tells_the_hits_on_new_items_apart() -> None:
    score = Score()
    for rank, new in ((1, True), (None, True), (2, False), (None, False)):
        score.add(rank, new)
    report = score.report(10, events=True)
    assert report["new_item_positives"] == 2
    assert report["new_item_hits"] == 1
    assert report["hits_on_new_items_share"] == 0.5


def test_the_arrival_log_brings_items_the_world_before_the_cut_lacks(tmp_path: Path) -> None:
    shape = ArrivalShape(genres=3, days=20, users=60, cut_day=15)
    made = write_arrival_log(tmp_path, seed=2, shape=shape)
    rows = _rows(made.log)
    before = {r["item_id"] for r in _rows(made.items_before)}
    later = [r for r in rows if int(r["timestamp"]) >= made.since]
    assert later
    assert all(r["item_id"] in before for r in rows if int(r["timestamp"]) < made.since)
    new = [r for r in later if r["item_id"] not in before]
    assert len(new) > len(later) / 2  # most of what users choose later came out later
    assert len(_rows(made.items)) == shape.items


def test_positives_on_new_items_nobody_else_had_touched_are_told_apart() -> None:
    rows = [
        ReplayRow("u1", "new", 1, True, 5.0),  # nobody before: untouched
        ReplayRow("u1", "new", 2, True, 5.0),  # only the same user before: still untouched
        ReplayRow("u2", "new", 3, False, 1.0),  # not a positive
        ReplayRow("u3", "new", 4, True, 4.0),  # u1 and u2 before it
        ReplayRow("u3", "old", 5, True, 4.0),  # not new
    ]
    assert untouched_share(rows, frozenset({"new"})) == pytest.approx(2 / 3, abs=1e-3)
    assert untouched_share(rows, frozenset()) == 0.0
