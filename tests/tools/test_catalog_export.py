"""The catalog as served now, as an item table: the world's items and the log's changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recsys_tools.catalog_export import (
    ItemRow,
    built_without_times,
    published,
    replayed,
    write_table,
)
from recsys_tools.world.read.items import ItemColumns, read_items
from recsys_tools.world.read.times import NO_TIME

from app.world.layout import REPORT_FILE


def test_puts_withdrawals_and_refits_replay_into_the_table() -> None:
    rows = {"i1": ItemRow("One", "drama", 10), "i2": ItemRow("Two", "comedy", 20)}
    batches: list[dict[str, Any]] = [
        {"puts": [["n1", "New", ["drama", "war"], 0, 30, [], [0.1], False]], "withdrawals": []},
        {"puts": [["i2", "Two, again", ["comedy"], 1, 20, [], [0.2], False]], "withdrawals": []},
        {"puts": [], "withdrawals": ["i1"]},
        # A refit changes the vector only: no attribute of the table.
        {"puts": [["n1", "", [], 0, 0, [], [0.3], False, True]], "withdrawals": []},
    ]
    now = replayed(rows, batches)
    assert now == {"i2": ItemRow("Two, again", "comedy", 20), "n1": ItemRow("New", "drama|war", 30)}


def test_a_world_without_times_exports_blank_dates_the_next_build_reads_as_unknown(
    tmp_path: Path,
) -> None:
    world = tmp_path / "world"
    world.mkdir()
    assert not built_without_times(world)  # no report: taken as timed
    (world / REPORT_FILE).write_text(json.dumps({"times": {"column": "timestamp"}}))
    assert not built_without_times(world)
    assert published([0, 1_700_000_000, -86_400], False) == [0, 1_700_000_000, -86_400]
    (world / REPORT_FILE).write_text(json.dumps({"times": {"column": None}}))
    assert built_without_times(world)
    # 0 is the log's first time there, "never said"; a date the item table gave stays.
    dates = published([0, 1_700_000_000], True)
    assert dates == [None, 1_700_000_000]
    rows = {"a": ItemRow("A", "x", dates[0]), "b": ItemRow("B", "y", dates[1])}
    out = tmp_path / "items-now.csv"
    write_table(rows, out)
    back = read_items(out, ItemColumns(category="categories", published="published_at"))
    assert back.published is not None
    assert dict(zip(back.ids.tolist(), back.published.tolist(), strict=True)) == {
        "a": NO_TIME,
        "b": 1_700_000_000,
    }
