"""The archive's two tables, as Parquet holds them, and how stream entries become their rows.

events: one row per accepted event, as POST /events took it; unique by (user_id, event_id),
the same key the ingest consumer applies once by.
answers: one row per logged answer (RECSYS_ANSWER_LOG_SAMPLE of them): its items in the order
shown, with their scores; unique by answer_id.
Each row also keeps the stream entry it came from (`entry`), so a row can be traced back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa

from app.archive.quarantine import Quarantined, checks_of, raw_of, unfit
from app.clients.answer_log import ANSWERS_FIELD
from app.core.archive_metrics import Unfit
from app.core.events import EVENTS_FIELD, from_json

DAY_MS = 86_400_000


class Kind(StrEnum):
    EVENTS = "events"
    ANSWERS = "answers"


EVENTS_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.string()),
        ("item_id", pa.string()),
        ("type", pa.string()),
        ("ts_ms", pa.int64()),
        ("value", pa.float64()),
        ("answer_id", pa.string()),
        ("entry", pa.string()),
    ]
)
ANSWERS_SCHEMA = pa.schema(
    [
        ("answer_id", pa.string()),
        ("ts_ms", pa.int64()),
        ("user_id", pa.string()),
        ("page", pa.string()),
        ("variant", pa.string()),
        ("model_version", pa.string()),
        ("world_id", pa.string()),
        ("degraded", pa.bool_()),
        ("items", pa.list_(pa.string())),
        ("scores", pa.list_(pa.float32())),
        ("entry", pa.string()),
    ]
)
SCHEMAS = {Kind.EVENTS: EVENTS_SCHEMA, Kind.ANSWERS: ANSWERS_SCHEMA}
FIELDS = {Kind.EVENTS: EVENTS_FIELD, Kind.ANSWERS: ANSWERS_FIELD}
# Each column a row brings checked against its type; `entry` is the stream's id, made here.
CHECKS = {
    kind: checks_of(schema.remove(schema.get_field_index("entry")))
    for kind, schema in SCHEMAS.items()
}
# What makes a row the same row when it is archived twice (a flush retried, a kill between
# writing a file and acknowledging its entries).
UNIQUE_BY = {Kind.EVENTS: ("user_id", "event_id"), Kind.ANSWERS: ("answer_id",)}


@dataclass(slots=True)
class Rows:
    """Rows of one kind gathered column by column, until written; beside them, what could
    not be read (counted) and what read but does not fit its table (kept apart)."""

    kind: Kind
    columns: dict[str, list[Any]] = field(default_factory=dict)
    malformed: int = 0
    quarantined: list[Quarantined] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.columns = {name: [] for name in SCHEMAS[self.kind].names}

    def __len__(self) -> int:
        return len(self.columns["ts_ms"])

    def add_entry(
        self, stream: str, entry_id: bytes, fields: dict[bytes, bytes], latest_ms: int
    ) -> None:
        """The entry's rows, each checked on its own: one that does not fit is kept apart and
        the rest are gathered. `latest_ms`: the latest time a row may carry."""
        entry = entry_id.decode()
        try:
            batch = _batch(fields.get(FIELDS[self.kind]))
        except (ValueError, TypeError, RecursionError):  # JSON nested past the parser's depth
            self.malformed += 1
            return
        read = _event_row if self.kind is Kind.EVENTS else _answer_row
        checks, columns = CHECKS[self.kind], self.columns
        for raw in batch:
            try:
                row = read(raw)
                found = unfit(row, checks, latest_ms)
            except ArithmeticError:  # a number no float or int64 holds: it fits no column
                found = Unfit.OUT_OF_RANGE
            except (KeyError, ValueError, TypeError):
                self.malformed += 1
                continue
            if found is not None:
                self.quarantined.append(Quarantined(stream, entry, found, raw_of(raw)))
                continue
            for name, value in row.items():
                columns[name].append(value)
            columns["entry"].append(entry)

    def table(self) -> pa.Table:
        return pa.table(self.columns, schema=SCHEMAS[self.kind])


def _batch(body: bytes | None) -> list[Any]:
    if body is None:
        raise ValueError("the entry has no field of its kind")
    batch = json.loads(body)
    if not isinstance(batch, list):
        raise TypeError("the entry's field is not a list")
    return batch


def _event_row(raw: Any) -> dict[str, Any]:
    event = from_json(raw)
    return {
        "event_id": event.event_id,
        "user_id": event.user_id,
        "item_id": event.item_id,
        "type": event.type.value,
        "ts_ms": event.ts_ms,
        "value": event.value,
        "answer_id": event.answer_id,
    }


def _answer_row(raw: Any) -> dict[str, Any]:
    items, scores = raw["i"], raw["s"]
    if not isinstance(items, list) or not isinstance(scores, list) or len(items) != len(scores):
        raise ValueError("items and scores are not lists of one length")
    return {
        "answer_id": str(raw["a"]),
        "ts_ms": int(raw["ts"]),
        "user_id": str(raw["u"]),
        "page": str(raw["p"]),
        "variant": str(raw["v"]),
        "model_version": str(raw["m"]),
        "world_id": str(raw["w"]),
        "degraded": bool(raw["d"]),
        "items": [str(item) for item in items],
        "scores": [None if s is None else float(s) for s in scores],
    }


def day_of(ts_ms: int) -> str:
    """The UTC day a time falls on, as the archive's folders name it (2026-12-03)."""
    return str(np.datetime64(ts_ms // DAY_MS, "D"))


def by_day(table: pa.Table) -> dict[str, pa.Table]:
    """The table's rows split by the UTC day of their ts_ms."""
    if table.num_rows == 0:
        return {}
    days = table.column("ts_ms").to_numpy() // DAY_MS
    found = np.unique(days)
    if len(found) == 1:
        return {day_of(int(found[0]) * DAY_MS): table}
    return {day_of(int(d) * DAY_MS): table.filter(pa.array(days == d)) for d in found}


def unique_rows(table: pa.Table, kind: Kind) -> pa.Table:
    """Each row once (the first of its key), ordered by time."""
    if table.num_rows == 0:
        return table
    keys = list(UNIQUE_BY[kind])
    numbered = table.select(keys).append_column("__row", pa.array(np.arange(table.num_rows)))
    first = numbered.group_by(keys, use_threads=False).aggregate([("__row", "min")])
    kept = np.sort(first.column("__row_min").to_numpy())
    unique = table.take(pa.array(kept))
    order = np.argsort(unique.column("ts_ms").to_numpy(), kind="stable")
    return unique.take(pa.array(order))
