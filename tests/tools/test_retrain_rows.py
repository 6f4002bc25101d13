"""What the retrain learns from the archive: events as interaction rows, the window (the
whole days before today by the run's own clock, whatever the rows' times say), and the
held-out day."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from recsys_tools.retrain_rows import (
    RetrainPlan,
    Window,
    archive_rows,
    as_of,
    gather,
    split_latest_day,
)
from recsys_tools.world.read.log import LogColumns

from app.archive.rows import EVENTS_SCHEMA, Kind
from app.archive.store import ArchiveStore
from app.core.errors import ConfigError

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


NOW_S = START_MS // 1000 + 10 * 86_400 + 3_600  # 2025-12-11T01:00:00Z
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01


def _event(event_id: str, ts_ms: int, kind: str = "rating") -> dict[str, object]:
    return {
        "event_id": event_id,
        "user_id": "u1",
        "item_id": event_id,
        "type": kind,
        "ts_ms": ts_ms,
        "value": 5.0,
        "answer_id": None,
        "entry": "1-0",
    }


def _plan(tmp_path: Path, base_times_s: list[int]) -> RetrainPlan:
    base = tmp_path / "base.csv"
    lines = ["user_id,item_id,rating,timestamp"]
    lines += [f"u{n},b{n},5,{ts}" for n, ts in enumerate(base_times_s)]
    base.write_text("\n".join(lines) + "\n")
    return RetrainPlan(
        interactions=base,
        columns=LogColumns(weight="rating", min_weight=4.0),
        archive=str(tmp_path / "archive"),
        serving=tmp_path / "serving",
        worlds=tmp_path / "worlds",
        window_days=3,
        now_s=NOW_S,
    )


def test_the_window_is_the_whole_days_before_today_by_the_runs_clock(tmp_path: Path) -> None:
    day_s = 86_400
    today_s = NOW_S // day_s * day_s
    plan = _plan(tmp_path, [today_s - 20 * day_s, today_s - day_s, today_s + 60, 4_102_444_800])
    store = ArchiveStore(plan.archive)
    events = [
        _event("too-old", (today_s - 4 * day_s) * 1000),
        _event("first-day", (today_s - 3 * day_s) * 1000),
        _event("yesterday", (today_s - 1) * 1000),
        _event("today", today_s * 1000 + 1000),
        _event("after-now", (NOW_S + 60) * 1000),
        # One far-future row: its folder is the archive's newest, and the base log's latest.
        _event("far-future", FAR_FUTURE_MS),
    ]
    store.write(Kind.EVENTS, pa.Table.from_pylist(events, schema=EVENTS_SCHEMA))
    window = Window.ending_before_today(plan.now_s or 0.0, plan.window_days)
    assert (window.first, window.last) == ("2025-12-08", "2025-12-10")
    gathered = gather(plan, window)
    assert gathered.archived.column("item_id").to_pylist() == ["first-day", "yesterday"]
    assert gathered.base.column("item_id").to_pylist() == ["b0", "b1"]
    assert gathered.left_out["future"] == {"base": 1, "archive": 2, "answers": 0}
    assert gathered.left_out["today"] == {"base": 1, "archive": 1, "answers": 0}
    # The held-out day is yesterday, by the clock: not 2100, not today's first hour.
    history, held, day = split_latest_day(pa.concat_tables([gathered.base, gathered.archived]))
    assert day == "2025-12-10"
    assert sorted(held.column("item_id").to_pylist()) == ["b1", "yesterday"]
    assert history.num_rows == 2


def test_a_run_told_a_past_day_runs_as_at_its_end_and_never_ahead_of_the_clock() -> None:
    assert as_of("2025-12-10", clock_s=NOW_S) == NOW_S - 3_600 - 0.001
    assert as_of("2025-12-11", clock_s=NOW_S) == NOW_S  # today: the clock, not tonight
    assert as_of("2099-01-01", clock_s=NOW_S) == NOW_S
    window = Window.ending_before_today(as_of("2025-12-10", NOW_S), 7)
    assert (window.first, window.last) == ("2025-12-03", "2025-12-09")


def test_nothing_before_today_is_said_plainly() -> None:
    empty = pa.table({"timestamp": pa.array([], pa.int64())})
    with pytest.raises(ConfigError, match="no rows before today"):
        split_latest_day(empty)
