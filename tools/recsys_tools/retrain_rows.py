"""The rows a retrain learns and is judged on (recsys retrain's gather and split steps): the
base log and the archive's events over its window, which follows the clock of the machine
running it (never the newest row or folder: one far-future row, or one API host's clock run
ahead, would carry the window into the future until that date came), and the latest day held
out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from app.archive.rows import DAY_MS, Kind, day_of
from app.archive.store import ArchiveStore
from app.core.errors import ConfigError
from app.core.events import POSITIVE_RATING
from recsys_tools.world.read.log import LogColumns, read_log

DAY_S = 86_400


@dataclass(frozen=True, slots=True)
class RetrainPlan:
    interactions: Path
    columns: LogColumns
    archive: str
    serving: Path
    worlds: Path
    window_days: int = 7
    margin: float = 0.02
    k: int = 10
    seed: int = 7
    network: str = "auto"
    ranker: str = "better"  # one of RANKERS
    schema: Path | None = None
    metrics_file: Path | None = None
    now_s: float | None = None  # the run's clock; None: this machine's


@dataclass(frozen=True, slots=True)
class Window:
    """The days a retrain learns and judges on, from its own clock: `days` whole UTC days
    before today."""

    first: str
    last: str
    today_s: int  # today's first second: no row from it on is used
    now_s: int

    @classmethod
    def ending_before_today(cls, now_s: float, days: int) -> Window:
        today_s = int(now_s) // DAY_S * DAY_S
        first = day_of((today_s - days * DAY_S) * 1000)
        return cls(first, day_of((today_s - DAY_S) * 1000), today_s, int(now_s))


def as_of(day: str, clock_s: float) -> float:
    """The clock of a run on `day`: its last moment, or now when that is earlier (a run can
    be told a past day, never a day to come)."""
    end_s = int(np.datetime64(day, "D").astype("datetime64[s]").astype(np.int64)) + DAY_S
    return min(clock_s, end_s - 0.001)


@dataclass(frozen=True, slots=True)
class Gathered:
    base: pa.Table  # interaction rows (seconds), before today
    archived: pa.Table
    events: pa.Table  # the archive's events, as kept, before today
    answers: pa.Table
    left_out: dict[str, dict[str, int]]  # rows stamped today, and after now, by source


def _before(times: np.ndarray, window: Window, scale: int) -> tuple[np.ndarray, int, int]:
    """Which of these times (in 1/scale seconds) fall before today; how many fall today,
    how many after now."""
    kept = times < window.today_s * scale
    future = int(np.count_nonzero(times > window.now_s * scale))
    return kept, len(times) - int(np.count_nonzero(kept)) - future, future


def gather(plan: RetrainPlan, window: Window) -> Gathered:
    """The base log and the archive's window, each row stamped before today."""
    base = base_rows(plan)
    base_kept, base_today, base_future = _before(base.column("timestamp").to_numpy(), window, 1)
    store = ArchiveStore(plan.archive)
    # Read to the end, not to the window's last day: what lies beyond it is counted.
    events = store.read(Kind.EVENTS, window.first)
    events_kept, events_today, events_future = _before(
        events.column("ts_ms").to_numpy(), window, 1000
    )
    events = events.filter(pa.array(events_kept))
    answers = store.read(Kind.ANSWERS, window.first)
    answers_kept, answers_today, answers_future = _before(
        answers.column("ts_ms").to_numpy(), window, 1000
    )
    return Gathered(
        base=base.filter(pa.array(base_kept)),
        archived=archive_rows(events, plan.columns),
        events=events,
        answers=answers.filter(pa.array(answers_kept)),
        left_out={
            "today": {"base": base_today, "archive": events_today, "answers": answers_today},
            "future": {"base": base_future, "archive": events_future, "answers": answers_future},
        },
    )


def archive_rows(events: pa.Table, columns: LogColumns) -> pa.Table:
    """The archive's events as interaction rows (user_id, item_id, timestamp in seconds,
    weight): what a world learns from."""
    positive = columns.min_weight if columns.min_weight is not None else POSITIVE_RATING
    kind = events.column("type")
    value = events.column("value")
    is_positive = pc.is_in(kind, value_set=pa.array(["click", "like", "purchase"]))
    weight = pc.if_else(
        pc.equal(kind, "rating"),
        value,
        pc.if_else(is_positive, pa.scalar(positive), pa.scalar(positive - 1.0)),
    )
    kept = pc.invert(pc.equal(kind, "impression"))
    if columns.weight is None:  # a log without weights holds positives only, each as 1
        kept = pc.and_(kept, pc.greater_equal(weight, positive))
        weight = pc.if_else(kept, pa.scalar(1.0), weight)
    rows = pa.table(
        {
            "user_id": events.column("user_id"),
            "item_id": events.column("item_id"),
            "timestamp": pc.divide(events.column("ts_ms"), 1000),
            "weight": pc.cast(weight, pa.float64()),
        }
    )
    return rows.filter(kept)


def base_rows(plan: RetrainPlan) -> pa.Table:
    base = read_log(plan.interactions, plan.columns)
    weight = base.weight if base.weight is not None else np.ones(len(base.user))
    return pa.table(
        {
            "user_id": pa.array(base.user_ids[base.user].astype(str)),
            "item_id": pa.array(base.items.ids[base.item].astype(str)),
            "timestamp": pa.array(base.time.astype(np.int64)),
            "weight": pa.array(weight.astype(np.float64)),
        }
    )


def split_latest_day(rows: pa.Table) -> tuple[pa.Table, pa.Table, str]:
    """The rows before the latest day, that day's rows, and the day."""
    if rows.num_rows == 0:
        raise ConfigError("no rows before today in the base log or the archive's window")
    times = rows.column("timestamp").to_numpy()
    last = int(times.max()) // DAY_S
    held = times // DAY_S == last
    return rows.filter(pa.array(~held)), rows.filter(pa.array(held)), day_of(last * DAY_MS)
