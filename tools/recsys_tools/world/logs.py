"""Reading an interaction log (and optionally an item table) from CSV, TSV or Parquet, laid
out as published (layout.py: separator, header, encoding, compression).

Ids are kept as strings exactly as written: "296" stays "296", never "296.0". Rows are
ordered by user, then time, so each user's history is one contiguous, time-ordered run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from app.core.errors import ConfigError
from recsys_tools.world.layout import (
    SEPARATORS,
    FileLayout,
    file_format,
    looks_like_data,
    parse_options,
    read_options,
    warn_of_data_header,
)

StrArray = npt.NDArray[np.str_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# Where the item table gives no publish time for an item.
NO_TIME = np.iinfo(np.int64).min

# The command-line flag that names each column, so an error can say how to fix it.
FLAGS = {
    "log": "--interactions",
    "items": "--items",
    "user": "--user-col",
    "item": "--item-col",
    "time": "--time-col",
    "weight": "--weight-col",
    "min_weight": "--min-weight",
    "item_id": "--item-id-col",
    "category": "--category-col",
    "category_cols": "--category-cols",
    "published": "--published-col",
    "published_format": "--published-format",
    "time_format": "--time-format",
    "title": "--title-col",
}


@dataclass(frozen=True, slots=True)
class LogColumns:
    user: str = "user_id"
    item: str = "item_id"
    time: str = "timestamp"
    weight: str | None = None
    min_weight: float | None = None
    # A strptime format for the time column, where it is neither numbers nor ISO text.
    time_format: str | None = None
    layout: FileLayout = field(default_factory=FileLayout)


@dataclass(frozen=True, slots=True)
class ItemColumns:
    item_id: str = "item_id"
    category: str | None = None  # names, several as A|B|C
    # One column per category, set (1, true, yes) where the item is in it; an entry
    # FIRST..LAST names every column from FIRST to LAST, as the file orders them.
    category_cols: tuple[str, ...] = ()
    published: str | None = None
    published_format: str | None = None  # strptime, as time_format
    title: str | None = None
    layout: FileLayout = field(default_factory=FileLayout)


@dataclass(frozen=True, slots=True)
class ItemInfo:
    """The catalog: every item the world serves, with its categories and publish time.

    Item i's category codes are category_codes[category_offsets[i]:category_offsets[i + 1]],
    indexes into category_names, in the order the table lists them.
    """

    ids: StrArray
    category_names: tuple[str, ...]
    category_offsets: IntArray
    category_codes: IntArray
    published: IntArray | None
    titles: StrArray | None = None

    @property
    def size(self) -> int:
        return len(self.ids)


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


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _check_file(path: Path, layout: FileLayout, flag: str) -> str:
    """The file's format, once it is known to exist and to be one this reads."""
    kind = file_format(path, layout, flag)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; check the path given to {flag}")
    return kind


def _column_names(path: Path, kind: str, layout: FileLayout, flag: str) -> list[str]:
    try:
        if kind == "parquet":
            return list(pq.read_schema(path).names)
        options = parse_options(kind, layout)
        with pa_csv.open_csv(
            path, read_options=read_options(layout), parse_options=options
        ) as reader:
            names = list(reader.schema.names)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read {path}: {_one_line(exc)}{_hint(kind, layout, flag)}"
        ) from exc
    if layout.header and looks_like_data(names):
        warn_of_data_header(path, names, flag)
    return names


def _require_columns(
    path: Path, wanted: dict[str, str], present: list[str], file_flag: str
) -> None:
    """wanted maps a role (user, item...) to the column name that should hold it."""
    for role, name in wanted.items():
        if name in present:
            continue
        fix = f"name the {role.replace('_', ' ')} column with {FLAGS[role]}"
        if looks_like_data(present):
            # Naming a column after a value of the first row would lose that row.
            fix = (
                f"its first row looks like data, not a header: give {file_flag}-no-header "
                f"and {file_flag}-columns NAME,... (then {FLAGS[role]} one of those names)"
            )
        raise ConfigError(
            f"{path.name} has no column {name!r} (it has {', '.join(present)}); {fix}"
        )


def _hint(kind: str, layout: FileLayout, flag: str) -> str:
    """How the file was read, and the flags that read it otherwise."""
    if kind == "parquet":
        return ""
    sep = layout.sep or SEPARATORS.get(kind, ",")
    return (
        f" (read as {kind}, separator {sep!r}, encoding {layout.encoding}: {flag}-sep, "
        f"{flag}-encoding and {flag}-format change them)"
    )


def _read_table(
    path: Path,
    kind: str,
    layout: FileLayout,
    columns: list[str],
    types: dict[str, pa.DataType],
    flag: str,
) -> pa.Table:
    """Read only `columns`, with `types` forced; everything else keeps its inferred type."""
    try:
        if kind == "parquet":
            table = pq.read_table(path, columns=columns)
            return table.cast(
                pa.schema([pa.field(n, types.get(n, table.schema.field(n).type)) for n in columns])
            )
        options = pa_csv.ConvertOptions(column_types=types, include_columns=columns)
        return pa_csv.read_csv(
            path,
            read_options=read_options(layout),
            parse_options=parse_options(kind, layout),
            convert_options=options,
        )
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        hint = _hint(kind, layout, flag)
        raise ConfigError(f"cannot read {path.name}: {_one_line(exc)}{hint}") from exc


def _strings(column: pa.ChunkedArray) -> StrArray:
    values: StrArray = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.str_)
    return values


def _missing_ids(column: pa.ChunkedArray) -> BoolArray:
    missing = pc.or_kleene(pc.is_null(column), pc.equal(pc.utf8_trim_whitespace(column), ""))
    filled: BoolArray = np.asarray(pc.fill_null(missing, True).to_numpy(zero_copy_only=False))
    return filled


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


# What a one-hot category column holds where the item is not in that category.
_UNSET = ("", "0", "0.0", "false", "no", "n", "f")


def _listed(column: pa.ChunkedArray) -> tuple[IntArray, StrArray]:
    """Each 'A|B' cell's names, as (item index, name) pairs in the table's order."""
    lists = pc.split_pattern(pc.fill_null(column.combine_chunks(), ""), "|")
    names = pc.utf8_trim_whitespace(pc.list_flatten(lists))
    parents = np.asarray(pc.list_parent_indices(lists).to_numpy(), dtype=np.int64)
    named = np.asarray(pc.not_equal(names, "").to_numpy(zero_copy_only=False), dtype=bool)
    return parents[named], _strings(names)[named]


def _one_hot(table: pa.Table, names: tuple[str, ...]) -> tuple[IntArray, StrArray]:
    """(item index, column name) for each set cell of the one-hot columns."""
    parents: list[IntArray] = []
    labels: list[StrArray] = []
    for name in names:
        text = pc.utf8_lower(pc.utf8_trim_whitespace(pc.cast(table.column(name), pa.string())))
        unset = pc.fill_null(pc.is_in(text, value_set=pa.array(_UNSET)), True)
        rows = np.flatnonzero(~np.asarray(unset.to_numpy(zero_copy_only=False), dtype=bool))
        parents.append(rows.astype(np.int64))
        labels.append(np.full(len(rows), name))
    if not parents:
        return np.zeros(0, np.int64), np.zeros(0, np.str_)
    return np.concatenate(parents), np.concatenate(labels)


def _categories(
    pairs: list[tuple[IntArray, StrArray]], n_items: int
) -> tuple[tuple[str, ...], IntArray, IntArray]:
    """Each item's categories from (item index, name) pairs, in the order first given;
    an item named in no pair has none."""
    parents = np.concatenate([p for p, _ in pairs]) if pairs else np.zeros(0, np.int64)
    names = np.concatenate([n for _, n in pairs]) if pairs else np.zeros(0, np.str_)
    vocabulary, codes = np.unique(names, return_inverse=True)
    # One entry per (item, category), the first given; then grouped by item, stably.
    _, first = np.unique(parents * max(len(vocabulary), 1) + codes, return_index=True)
    first = np.sort(first)
    first = first[np.argsort(parents[first], kind="stable")]
    counts = np.bincount(parents[first], minlength=n_items)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return tuple(vocabulary.tolist()), offsets, codes[first].astype(np.int64)


def category_columns(spec: tuple[str, ...], present: list[str], path: Path) -> tuple[str, ...]:
    """The one-hot columns `spec` names, a FIRST..LAST entry spanning the file's order."""
    chosen: list[str] = []
    for entry in spec:
        first, dots, last = entry.partition("..")
        ends = [first, last] if dots else [entry]
        for end in ends:
            if end not in present:
                raise ConfigError(
                    f"{path.name} has no column {end!r} (it has {', '.join(present)}); "
                    f"{FLAGS['category_cols']} names columns, or FIRST..LAST"
                )
        if not dots:
            chosen.append(entry)
            continue
        start, stop = present.index(first), present.index(last)
        if stop < start:
            raise ConfigError(
                f"{FLAGS['category_cols']} {entry}: {last!r} comes before {first!r} in "
                f"{path.name}; name the range first column first"
            )
        chosen.extend(present[start : stop + 1])
    return tuple(dict.fromkeys(chosen))


def _item_wanted(columns: ItemColumns) -> dict[str, str]:
    wanted = {"item_id": columns.item_id}
    for role in ("category", "published", "title"):
        name = getattr(columns, role)
        if name is not None:
            wanted[role] = name
    return wanted


def read_items(path: Path, columns: ItemColumns) -> ItemInfo:
    """The catalog in table order; every listed item stays, with or without interactions."""
    layout = columns.layout
    kind = _check_file(path, layout, FLAGS["items"])
    wanted = _item_wanted(columns)
    present = _column_names(path, kind, layout, FLAGS["items"])
    _require_columns(path, wanted, present, FLAGS["items"])
    one_hot = category_columns(columns.category_cols, present, path)
    types = {columns.item_id: pa.string()}
    for role in ("category", "title"):
        if role in wanted:
            types[wanted[role]] = pa.string()
    if columns.published is not None and columns.published_format is not None:
        types[columns.published] = pa.string()
    for name in one_hot:
        types.setdefault(name, pa.string())
    reading = list(dict.fromkeys([*wanted.values(), *one_hot]))
    table = _read_table(path, kind, layout, reading, types, FLAGS["items"])
    id_column = table.column(columns.item_id)
    missing = _missing_ids(id_column)
    if missing.any():
        raise ConfigError(
            f"{path.name}: {int(missing.sum())} rows have no {columns.item_id!r}; "
            f"every item needs an id (or name the id column with {FLAGS['item_id']})"
        )
    ids = _strings(id_column)
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise ConfigError(
            f"{path.name} lists item {unique[counts > 1][0]!r} more than once "
            f"({int((counts > 1).sum())} ids repeat); keep one row per item"
        )
    pairs = [_one_hot(table, one_hot)]
    if columns.category is not None:
        pairs.insert(0, _listed(table.column(columns.category)))
    names, offsets, codes = _categories(pairs, len(ids))
    published = None
    if columns.published is not None:
        published = unix_seconds(
            table.column(columns.published),
            path,
            columns.published,
            "published",
            columns.published_format,
        )
    titles = None
    if columns.title is not None:
        titles = _strings(pc.fill_null(table.column(columns.title), ""))
    return ItemInfo(ids, names, offsets, codes, published, titles)


def _in_catalog(column: pa.ChunkedArray, items: ItemInfo | None) -> BoolArray:
    if items is None:
        return np.ones(len(column), dtype=bool)
    found = pc.is_in(column, value_set=pa.array(items.ids.tolist(), pa.string()))
    return np.asarray(pc.fill_null(found, False).to_numpy(zero_copy_only=False), dtype=bool)


def _item_index(column: pa.ChunkedArray, items: ItemInfo | None) -> tuple[ItemInfo, IntArray]:
    """Each row's item index; without an item table the catalog is the log's items."""
    if items is None:
        encoded = pc.dictionary_encode(column.combine_chunks())
        ids = _strings(encoded.dictionary)
        names, offsets, codes = _categories([], len(ids))
        index = np.asarray(encoded.indices.to_numpy(), dtype=np.int64)
        return ItemInfo(ids, names, offsets, codes, None), index
    found = pc.index_in(column, value_set=pa.array(items.ids.tolist(), pa.string()))
    return items, np.asarray(found.to_numpy(), dtype=np.int64)


def _weights(table: pa.Table, columns: LogColumns) -> FloatArray | None:
    if columns.weight is None:
        return None
    values = table.column(columns.weight).combine_chunks()
    weights: FloatArray = np.asarray(
        pc.fill_null(values, np.nan).to_numpy(zero_copy_only=False), dtype=np.float64
    )
    return weights


def _log_table(path: Path, columns: LogColumns) -> pa.Table:
    layout = columns.layout
    kind = _check_file(path, layout, FLAGS["log"])
    if columns.min_weight is not None and columns.weight is None:
        raise ConfigError(
            f"{FLAGS['min_weight']} needs a weight column; name it with {FLAGS['weight']}"
        )
    wanted = {"user": columns.user, "item": columns.item, "time": columns.time}
    types = {columns.user: pa.string(), columns.item: pa.string()}
    if columns.time_format is not None:
        types[columns.time] = pa.string()
    if columns.weight is not None:
        wanted["weight"] = columns.weight
        types[columns.weight] = pa.float64()
    _require_columns(path, wanted, _column_names(path, kind, layout, FLAGS["log"]), FLAGS["log"])
    reading = list(dict.fromkeys(wanted.values()))
    return _read_table(path, kind, layout, reading, types, FLAGS["log"])


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
    no_id = _missing_ids(table.column(columns.user)) | _missing_ids(table.column(columns.item))
    weights = _weights(table, columns)
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
    time = unix_seconds(table.column(columns.time), path, columns.time, "time", columns.time_format)
    if (time == NO_TIME).any():
        raise ConfigError(
            f"{path.name}: {int((time == NO_TIME).sum()):,} rows have no {columns.time!r}; "
            f"fill them in or name another column with {FLAGS['time']}"
        )
    users = pc.dictionary_encode(table.column(columns.user).combine_chunks())
    user = np.asarray(users.indices.to_numpy(), dtype=np.int64)
    weight = None if weights is None else weights[keep]
    positive = np.ones(len(user), bool)
    if weight is not None and columns.min_weight is not None:
        positive = weight >= columns.min_weight
        if not positive.any():
            raise _no_positives(path, columns, weight)
    order = np.lexsort((time, user))  # stable: equal times keep the file's order
    counts = ReadCounts(rows_read, dropped, int((~positive).sum()))
    return InteractionLog(
        source=path.name,
        user_ids=_strings(users.dictionary),
        items=catalog,
        user=user[order],
        item=item[order],
        time=time[order],
        weight=None if weight is None else weight[order],
        positive=positive[order],
        counts=counts,
    )
