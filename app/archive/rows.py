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

from app.clients.answer_log import ANSWERS_FIELD
from app.core.events import MalformedEventError, decode_entry

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
# What makes a row the same row when it is archived twice (a flush retried, a kill between
# writing a file and acknowledging its entries).
UNIQUE_BY = {Kind.EVENTS: ("user_id", "event_id"), Kind.ANSWERS: ("answer_id",)}


@dataclass(slots=True)
class Rows:
    """Rows of one kind gathered column by column, until written."""

    kind: Kind
    columns: dict[str, list[Any]] = field(default_factory=dict)
    malformed: int = 0

    def __post_init__(self) -> None:
        self.columns = {name: [] for name in SCHEMAS[self.kind].names}

    def __len__(self) -> int:
        return len(self.columns["ts_ms"])

    def add_entry(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        if self.kind is Kind.EVENTS:
            self._add_events(entry_id.decode(), fields)
        else:
            self._add_answers(entry_id.decode(), fields)

    def _add_events(self, entry: str, fields: dict[bytes, bytes]) -> None:
        try:
            events = decode_entry(fields)
        except MalformedEventError:
            self.malformed += 1
            return
        columns = self.columns
        for event in events:
            if isinstance(event, MalformedEventError):
                self.malformed += 1
                continue
            columns["event_id"].append(event.event_id)
            columns["user_id"].append(event.user_id)
            columns["item_id"].append(event.item_id)
            columns["type"].append(event.type.value)
            columns["ts_ms"].append(event.ts_ms)
            columns["value"].append(event.value)
            columns["answer_id"].append(event.answer_id)
            columns["entry"].append(entry)

    def _add_answers(self, entry: str, fields: dict[bytes, bytes]) -> None:
        try:
            answers = json.loads(fields[ANSWERS_FIELD])
            if not isinstance(answers, list):
                raise TypeError("answers is not a list")
        except (KeyError, ValueError, TypeError):
            self.malformed += 1
            return
        for answer in answers:
            try:
                row = _answer_row(answer)
            except (KeyError, ValueError, TypeError):
                self.malformed += 1
                continue
            for name, value in row.items():
                self.columns[name].append(value)
            self.columns["entry"].append(entry)

    def table(self) -> pa.Table:
        return pa.table(self.columns, schema=SCHEMAS[self.kind])


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
