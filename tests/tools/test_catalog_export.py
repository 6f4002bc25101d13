"""The catalog as served now, as an item table: the world's items and the log's changes."""

from __future__ import annotations

from typing import Any

from recsys_tools.catalog_export import Row, replayed


def test_puts_withdrawals_and_refits_replay_into_the_table() -> None:
    rows = {"i1": Row("One", "drama", 10), "i2": Row("Two", "comedy", 20)}
    batches: list[dict[str, Any]] = [
        {"puts": [["n1", "New", ["drama", "war"], 0, 30, [], [0.1], False]], "withdrawals": []},
        {"puts": [["i2", "Two, again", ["comedy"], 1, 20, [], [0.2], False]], "withdrawals": []},
        {"puts": [], "withdrawals": ["i1"]},
        # A refit changes the vector only: no attribute of the table.
        {"puts": [["n1", "", [], 0, 0, [], [0.3], False, True]], "withdrawals": []},
    ]
    now = replayed(rows, batches)
    assert now == {"i2": Row("Two, again", "comedy", 20), "n1": Row("New", "drama|war", 30)}
