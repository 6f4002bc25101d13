"""What the retrain learns from the archive: events as interaction rows, and the held-out
day."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from recsys_tools.retrain import archive_rows, split_latest_day
from recsys_tools.world.read.log import LogColumns

from app.archive.rows import EVENTS_SCHEMA, Kind
from app.archive.store import ArchiveStore

DAY_MS = 86_400_000
START_MS = 1_764_547_200_000


def _store(tmp_path: Path) -> ArchiveStore:
    kinds = [
        ("click", None),
        ("like", None),
        ("rating", 2.0),
        ("rating", 5.0),
        ("dislike", None),
        ("impression", None),
    ]
    rows = [
        {
            "event_id": f"e{n}",
            "user_id": "u1",
            "item_id": f"i{n}",
            "type": kind,
            "ts_ms": START_MS + n * DAY_MS,
            "value": value,
            "answer_id": None,
            "entry": "1-0",
        }
        for n, (kind, value) in enumerate(kinds)
    ]
    store = ArchiveStore(str(tmp_path))
    store.write(Kind.EVENTS, pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA))
    return store


def test_events_become_weighted_rows_at_the_logs_scale(tmp_path: Path) -> None:
    rows = archive_rows(
        _store(tmp_path).read(Kind.EVENTS), LogColumns(weight="rating", min_weight=4.0)
    )
    weights = dict(
        zip(rows.column("item_id").to_pylist(), rows.column("weight").to_pylist(), strict=True)
    )
    # Positives at the log's threshold, a rating as given, a dislike below; no impression.
    assert weights == {"i0": 4.0, "i1": 4.0, "i2": 2.0, "i3": 5.0, "i4": 3.0}
    assert rows.column("timestamp").to_pylist()[0] == START_MS // 1000


def test_a_log_without_weights_takes_the_positives_only_each_as_one(tmp_path: Path) -> None:
    rows = archive_rows(_store(tmp_path).read(Kind.EVENTS), LogColumns())
    assert rows.column("item_id").to_pylist() == ["i0", "i1", "i3"]
    assert set(rows.column("weight").to_pylist()) == {1.0}


def test_the_latest_day_is_held_out(tmp_path: Path) -> None:
    rows = archive_rows(
        _store(tmp_path).read(Kind.EVENTS), LogColumns(weight="rating", min_weight=4.0)
    )
    history, held, day = split_latest_day(rows)
    assert held.column("item_id").to_pylist() == ["i4"]
    assert history.num_rows == 4
    assert day == "2025-12-05"
