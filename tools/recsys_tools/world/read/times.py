"""Times as a log or a catalog writes them, read as unix seconds; and the clock's hour and
weekday as the service reads them."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from app.core.errors import ConfigError
from recsys_tools.world.read.tables import FLAGS, IntArray

# Where a table gives no time for a row.
NO_TIME = np.iinfo(np.int64).min
HOURS, WEEKDAYS = 24, 7
# 1970-01-01 was a Thursday: Python's weekday 3.
EPOCH_WEEKDAY = 3


def _parse_text_time(value: str, fmt: str | None) -> int | None:
    text = value.strip()
    if fmt is not None:
        try:
            moment = datetime.strptime(text, fmt)
        except ValueError:
            return None
        return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())
    for parse in (int, float):
        try:
            number = parse(text)
        except ValueError:
            continue
        return math.floor(number) if math.isfinite(number) else None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    # A datetime without a zone is taken as UTC, as a log's clock usually is.
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


def _text_times(column: pa.Array, fmt: str | None) -> tuple[IntArray, str | None]:
    """Parse each distinct string once; returns the seconds and the first unreadable value."""
    encoded = pc.dictionary_encode(column)
    texts = [str(value) for value in encoded.dictionary.to_pylist()]
    parsed = [_parse_text_time(text, fmt) for text in texts]
    bad = next((t for t, p in zip(texts, parsed, strict=True) if p is None), None)
    lookup = np.array([0 if p is None else p for p in parsed], dtype=np.int64)
    return lookup[np.asarray(encoded.indices.to_numpy(zero_copy_only=False))], bad


def _seconds(column: pa.Array, fmt: str | None) -> tuple[IntArray, str | None]:
    kind = column.type
    if fmt is not None:
        return _text_times(pc.cast(column, pa.string()), fmt)
    if pa.types.is_integer(kind):
        return np.asarray(column.to_numpy(), dtype=np.int64), None
    if pa.types.is_floating(kind):
        values = np.asarray(column.to_numpy(), dtype=np.float64)
        finite = np.isfinite(values)
        bad = None if finite.all() else str(values[~finite][0])
        return np.floor(np.where(finite, values, 0.0)).astype(np.int64), bad
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        as_seconds = pc.cast(column, pa.timestamp("s", getattr(kind, "tz", None)), safe=False)
        return np.asarray(pc.cast(as_seconds, pa.int64()).to_numpy(), dtype=np.int64), None
    return _text_times(pc.cast(column, pa.string()), None)


def unix_seconds(
    column: pa.ChunkedArray, path: Path, name: str, role: str, fmt: str | None = None
) -> IntArray:
    """Unix seconds from integers, floats, timestamps or ISO text (or text in `fmt`, a
    strptime format); NO_TIME where blank.

    A datetime without a zone is taken as UTC, as a log's clock usually is.
    """
    values = column.combine_chunks()
    valid = pc.is_valid(values)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        valid = pc.and_(valid, pc.not_equal(pc.utf8_trim_whitespace(values), ""))
    present = np.asarray(pc.fill_null(valid, False).to_numpy(zero_copy_only=False), dtype=bool)
    result = np.full(len(values), NO_TIME, dtype=np.int64)
    seconds, bad = _seconds(values.filter(pa.array(present)), fmt)
    if bad is not None:
        format_flag = FLAGS[f"{role}_format"]
        if fmt is not None:
            raise ConfigError(
                f"{path.name}: {bad!r} in column {name!r} does not match {format_flag} "
                f"{fmt!r}; fix the format (strptime codes, such as %d-%b-%Y for 01-Jan-1995)"
            )
        raise ConfigError(
            f"{path.name}: {bad!r} in column {name!r} is neither unix seconds nor an ISO "
            f"datetime; name its format with {format_flag} (strptime codes, such as "
            f"%d-%b-%Y for 01-Jan-1995), fix the file or name another column with "
            f"{FLAGS[role]}"
        )
    result[present] = seconds
    return result


def utc_hour_weekday(times: IntArray) -> tuple[IntArray, IntArray]:
    """The UTC hour and weekday (Monday 0) of unix seconds, as the service reads its clock."""
    return (times // 3600) % HOURS, (times // 86_400 + EPOCH_WEEKDAY) % WEEKDAYS
