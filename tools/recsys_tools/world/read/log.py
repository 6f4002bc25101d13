"""Reading an interaction log from CSV, TSV or Parquet, laid out as published (formats.py:
separator, header, encoding, compression).

Ids are kept as strings exactly as written: "296" stays "296", never "296.0". Rows are
ordered by user, then time, so each user's history is one contiguous, time-ordered run.

A log may have no time column (play or purchase counts per user and item, as many are
published): with `time=None` every time reads 0 and the log says it is not `timed`, so what
needs times (the holdout by time, the features of age and recency) is done another way or
left out, and said so. Each user's rows are then in an order drawn from a hash of the user's
and the item's ids, not the file's: what reads a history's order as time (the latest
positives, their decay) would otherwise read how the file was sorted (by item id, or by
plays) as recency for every user alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from hashlib import blake2b
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from app.core.errors import ConfigError
from recsys_tools.world.read.formats import FileLayout
from recsys_tools.world.read.items import ItemInfo, categories
from recsys_tools.world.read.tables import (
    FLAGS,
    BoolArray,
    FloatArray,
    IntArray,
    StrArray,
    check_file,
    column_names,
    missing_ids,
    read_table,
    require_columns,
    strings,
)
from recsys_tools.world.read.times import NO_TIME, unix_seconds


@dataclass(frozen=True, slots=True)
class LogColumns:
    user: str = "user_id"
    item: str = "item_id"
    time: str | None = "timestamp"  # None: the log has no times
    weight: str | None = None
    min_weight: float | None = None
    # A strptime format for the time column, where it is neither numbers nor ISO text.
    time_format: str | None = None
    layout: FileLayout = field(default_factory=FileLayout)


def _no_times(source: str, needs: str) -> ConfigError:
    return ConfigError(f"{source} has no times ({FLAGS['time']} none): {needs}")


def require_times(timed: bool, source: str, needs: str) -> None:
    """The one refusal of a log without times by what cannot do without them: `needs` says
    what needs them and what to do instead."""
    if not timed:
        raise _no_times(source, needs)


def time_column(columns: LogColumns, source: str, needs: str) -> str:
    """The log's time column, refused as require_times refuses where it has none."""
    if columns.time is None:
        raise _no_times(source, needs)
    return columns.time


@dataclass(frozen=True, slots=True)
class ReadCounts:
    rows_read: int
    dropped: dict[str, int]
    below_min_weight: int


@dataclass(frozen=True, slots=True)
class InteractionLog:
    """One row per kept interaction, as indexes into user_ids and items.ids.

    Rows below min_weight stay (an item's mean weight counts them) but are not positives.
    Subsets keep both vocabularies, so indexes mean the same items and users in every part.
    """

    source: str
    user_ids: StrArray
    items: ItemInfo
    user: IntArray
    item: IntArray
    time: IntArray
    weight: FloatArray | None
    positive: BoolArray
    counts: ReadCounts = field(compare=False)
    # False for a log read without a time column: its times are all 0, its order the file's.
    timed: bool = True

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_items(self) -> int:
        return self.items.size

    def subset(self, rows: BoolArray) -> InteractionLog:
        return replace(
            self,
            user=self.user[rows],
            item=self.item[rows],
            time=self.time[rows],
            weight=None if self.weight is None else self.weight[rows],
            positive=self.positive[rows],
        )


def _in_catalog(column: pa.ChunkedArray, items: ItemInfo | None) -> BoolArray:
    if items is None:
        return np.ones(len(column), dtype=bool)
    found = pc.is_in(column, value_set=pa.array(items.ids.tolist(), pa.string()))
    return np.asarray(pc.fill_null(found, False).to_numpy(zero_copy_only=False), dtype=bool)


def _item_index(column: pa.ChunkedArray, items: ItemInfo | None) -> tuple[ItemInfo, IntArray]:
    """Each row's item index; without an item table the catalog is the log's items."""
    if items is None:
        encoded = pc.dictionary_encode(column.combine_chunks())
        ids = strings(encoded.dictionary)
        names, offsets, codes = categories([], len(ids))
        index = np.asarray(encoded.indices.to_numpy(), dtype=np.int64)
        return ItemInfo(ids, names, offsets, codes, None), index
    found = pc.index_in(column, value_set=pa.array(items.ids.tolist(), pa.string()))
    return items, np.asarray(found.to_numpy(), dtype=np.int64)


def _weights(path: Path, table: pa.Table, columns: LogColumns) -> FloatArray | None:
    """The weight column, NaN where blank (its row is dropped, and counted). An infinite one
    is refused: it is a value the file says, and ALS and the mean weight would meet it as a
    NaN far from here, in a library's traceback."""
    if columns.weight is None:
        return None
    values = table.column(columns.weight).combine_chunks()
    weights: FloatArray = np.asarray(
        pc.fill_null(values, np.nan).to_numpy(zero_copy_only=False), dtype=np.float64
    )
    infinite = np.flatnonzero(np.isinf(weights))
    if len(infinite):
        raise ConfigError(
            f"{path.name}: {columns.weight!r} is infinite in {len(infinite):,} of its rows (the "
            f"first, data row {infinite[0] + 1:,}, holds {weights[infinite[0]]:g}); a weight "
            "must be a finite number: fix those rows or drop them"
        )
    return weights


def _log_table(path: Path, columns: LogColumns) -> pa.Table:
    layout = columns.layout
    kind = check_file(path, layout, FLAGS["log"])
    if columns.min_weight is not None and columns.weight is None:
        raise ConfigError(
            f"{FLAGS['min_weight']} needs a weight column; name it with {FLAGS['weight']}"
        )
    wanted = {"user": columns.user, "item": columns.item}
    types = {columns.user: pa.string(), columns.item: pa.string()}
    if columns.time is not None:
        wanted["time"] = columns.time
    if columns.time_format is not None:
        if columns.time is None:
            raise ConfigError(f"{FLAGS['time_format']} needs a time column; the log has none")
        types[columns.time] = pa.string()
    if columns.weight is not None:
        wanted["weight"] = columns.weight
        types[columns.weight] = pa.float64()
    require_columns(path, wanted, column_names(path, kind, layout, FLAGS["log"]), FLAGS["log"])
    reading = list(dict.fromkeys(wanted.values()))
    return read_table(path, kind, layout, reading, types, FLAGS["log"])


def _nothing_left(path: Path, rows_read: int, dropped: dict[str, int]) -> ConfigError:
    reasons = ", ".join(f"{rows:,} {reason.replace('_', ' ')}" for reason, rows in dropped.items())
    return ConfigError(
        f"{path.name}: none of its {rows_read:,} rows is usable (dropped: {reasons}); "
        f"check the id columns ({FLAGS['user']}, {FLAGS['item']}) and the item table"
    )


def _no_positives(path: Path, columns: LogColumns, weights: FloatArray) -> ConfigError:
    return ConfigError(
        f"{path.name}: no row has {columns.weight} >= {columns.min_weight} (weights run from "
        f"{weights.min():g} to {weights.max():g}); lower {FLAGS['min_weight']}"
    )


def read_log(path: Path, columns: LogColumns, items: ItemInfo | None = None) -> InteractionLog:
    """The log's rows, ordered by user then time; rows that cannot be used are counted."""
    table = _log_table(path, columns)
    rows_read = table.num_rows
    if rows_read == 0:
        raise ConfigError(f"{path.name} has no rows; give {FLAGS['log']} a log with interactions")
    no_id = missing_ids(table.column(columns.user)) | missing_ids(table.column(columns.item))
    weights = _weights(path, table, columns)
    no_weight = np.zeros(rows_read, bool) if weights is None else np.isnan(weights)
    known = _in_catalog(table.column(columns.item), items)
    dropped = {
        "missing_id": int(no_id.sum()),
        "missing_weight": int((no_weight & ~no_id).sum()),
        "item_not_in_table": int((~known & ~no_id & ~no_weight).sum()),
    }
    keep = ~no_id & ~no_weight & known
    if not keep.any():
        raise _nothing_left(path, rows_read, dropped)
    table = table.filter(pa.array(keep))
    catalog, item = _item_index(table.column(columns.item), items)
    time = _times(path, table, columns)
    users = pc.dictionary_encode(table.column(columns.user).combine_chunks())
    user = np.asarray(users.indices.to_numpy(), dtype=np.int64)
    weight = None if weights is None else weights[keep]
    positive = np.ones(len(user), bool)
    if weight is not None and columns.min_weight is not None:
        positive = weight >= columns.min_weight
        if not positive.any():
            raise _no_positives(path, columns, weight)
    if columns.time is None:
        order = np.lexsort((row_keys(users.dictionary, catalog.ids, user, item, 0), user))
    else:
        order = np.lexsort((time, user))  # stable: equal times keep the file's order
    counts = ReadCounts(rows_read, dropped, int((~positive).sum()))
    return InteractionLog(
        source=path.name,
        user_ids=strings(users.dictionary),
        items=catalog,
        user=user[order],
        item=item[order],
        time=time[order],
        weight=None if weight is None else weight[order],
        positive=positive[order],
        counts=counts,
        timed=columns.time is not None,
    )


def _id_hashes(ids: pa.Array | StrArray) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of each id's text: the same on every read, whatever the file's order."""
    texts = ids.to_pylist() if isinstance(ids, pa.Array) else ids.tolist()
    digests = b"".join(blake2b(str(text).encode(), digest_size=8).digest() for text in texts)
    return np.frombuffer(digests, dtype=np.uint64)


def row_keys(
    user_ids: pa.Array | StrArray, item_ids: StrArray, user: IntArray, item: IntArray, salt: int
) -> npt.NDArray[np.uint64]:
    """A pseudo-random key per row from its user's and item's ids and `salt` alone (mixed by
    splitmix64's finaliser): every user's order of their rows is their own, and no row's key
    moves when other rows are added, dropped or sorted otherwise in the file."""
    key = _id_hashes(user_ids)[user] * np.uint64(0x9E3779B97F4A7C15) ^ _id_hashes(item_ids)[item]
    key ^= np.uint64(salt * 0xD6E8FEB86659FD93 % 2**64)  # Python ints: numpy's scalars warn
    key ^= key >> np.uint64(31)
    key *= np.uint64(0xBF58476D1CE4E5B9)
    key ^= key >> np.uint64(27)
    return key


def _times(path: Path, table: pa.Table, columns: LogColumns) -> IntArray:
    """Each kept row's unix seconds; all 0 for a log without a time column."""
    if columns.time is None:
        return np.zeros(table.num_rows, dtype=np.int64)
    time = unix_seconds(table.column(columns.time), path, columns.time, "time", columns.time_format)
    if (time == NO_TIME).any():
        raise ConfigError(
            f"{path.name}: {int((time == NO_TIME).sum()):,} rows have no {columns.time!r}; "
            f"fill them in, name another column with {FLAGS['time']}, or build without "
            f"times ({FLAGS['time']} none)"
        )
    return time
