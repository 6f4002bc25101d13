"""The rows the archive keeps apart: each row read is checked against the types its table
stores it in, and against the archive's clock, before it is gathered.

One row that Parquet cannot hold (a time past int64, text with a lone surrogate) would make
every write of the rows gathered with it fail, and the archive retry them for ever while the
streams' caps trimmed what it stopped reading; one row stamped days ahead would open a day
folder that every later reader takes for the newest day. Such a row is kept apart instead:
written raw, as the stream carried it, with its stream and entry id and why
(`{root}/quarantine/{kind}/date={day the archive kept it}/`), counted, and acknowledged with
the rest.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from app.core.archive_metrics import Unfit
from app.core.storable import fits_float32, fits_int64, unicode_problem

QUARANTINE_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("entry", pa.string()),
        ("reason", pa.string()),
        ("kept_ms", pa.int64()),
        ("raw", pa.binary()),  # the row's JSON as the stream carried it, escapes kept
    ]
)


@dataclass(frozen=True, slots=True)
class Quarantined:
    stream: str
    entry: str
    reason: Unfit
    raw: bytes


def raw_of(raw: Any) -> bytes:
    """A row as JSON again, ASCII only: a lone surrogate stays the escape it came as."""
    try:
        return json.dumps(raw, separators=(",", ":")).encode("ascii")
    except (ValueError, TypeError, RecursionError):
        return repr(raw).encode("ascii", "backslashreplace")


def table_of(quarantined: list[Quarantined], kept_ms: int) -> pa.Table:
    return pa.table(
        {
            "stream": [q.stream for q in quarantined],
            "entry": [q.entry for q in quarantined],
            "reason": [q.reason.value for q in quarantined],
            "kept_ms": [kept_ms] * len(quarantined),
            "raw": [q.raw for q in quarantined],
        },
        schema=QUARANTINE_SCHEMA,
    )


Check = Callable[[Any], Unfit | None]


def _int64(value: Any) -> Unfit | None:
    if isinstance(value, int) and not fits_int64(value):
        return Unfit.OUT_OF_RANGE
    return None


def _float32(value: Any) -> Unfit | None:
    # A finite number past float32's range would be stored as infinity without a word.
    if isinstance(value, float) and math.isfinite(value) and not fits_float32((value,)):
        return Unfit.OUT_OF_RANGE
    return None


def _text(value: Any) -> Unfit | None:
    if isinstance(value, str) and unicode_problem(value) is not None:
        return Unfit.NOT_UNICODE
    return None


def _each(check: Check) -> Check:
    def every(values: Any) -> Unfit | None:
        for value in values or ():
            unfit = check(value)
            if unfit is not None:
                return unfit
        return None

    return every


def _check_of(kind: pa.DataType) -> Check | None:
    """What a value must be for a column of this type to hold it; None: any value the
    rows give it fits (a Python float is a float64, a bool a bool)."""
    if pa.types.is_list(kind):
        inner = _check_of(kind.value_type)
        return None if inner is None else _each(inner)
    if pa.types.is_int64(kind):
        return _int64
    if pa.types.is_float32(kind):
        return _float32
    if pa.types.is_string(kind):
        return _text
    return None


def checks_of(schema: pa.Schema) -> list[tuple[str, Check]]:
    """The checks of a table's columns, each once per row."""
    found = [(column.name, _check_of(column.type)) for column in schema]
    return [(name, check) for name, check in found if check is not None]


def unfit(row: Mapping[str, Any], checks: list[tuple[str, Check]], latest_ms: int) -> Unfit | None:
    """Why the row cannot be archived as it is, or None. `latest_ms`: the latest time a row
    may carry by the archive's clock."""
    for name, check in checks:
        found = check(row[name])
        if found is not None:
            return found
    if row["ts_ms"] > latest_ms:
        return Unfit.FUTURE
    return None
