"""Reading an item table: the catalog's ids, categories (named, or one-hot columns),
publish times and titles."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from app.core.errors import ConfigError
from recsys_tools.world.read.formats import FileLayout
from recsys_tools.world.read.tables import (
    FLAGS,
    IntArray,
    StrArray,
    check_file,
    column_names,
    missing_ids,
    read_table,
    require_columns,
    strings,
)
from recsys_tools.world.read.times import unix_seconds


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


# What a one-hot category column holds where the item is not in that category.
_UNSET = ("", "0", "0.0", "false", "no", "n", "f")


def _listed(column: pa.ChunkedArray) -> tuple[IntArray, StrArray]:
    """Each 'A|B' cell's names, as (item index, name) pairs in the table's order."""
    lists = pc.split_pattern(pc.fill_null(column.combine_chunks(), ""), "|")
    names = pc.utf8_trim_whitespace(pc.list_flatten(lists))
    parents = np.asarray(pc.list_parent_indices(lists).to_numpy(), dtype=np.int64)
    named = np.asarray(pc.not_equal(names, "").to_numpy(zero_copy_only=False), dtype=bool)
    return parents[named], strings(names)[named]


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


def categories(
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
    kind = check_file(path, layout, FLAGS["items"])
    wanted = _item_wanted(columns)
    present = column_names(path, kind, layout, FLAGS["items"])
    require_columns(path, wanted, present, FLAGS["items"])
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
    table = read_table(path, kind, layout, reading, types, FLAGS["items"])
    id_column = table.column(columns.item_id)
    missing = missing_ids(id_column)
    if missing.any():
        raise ConfigError(
            f"{path.name}: {int(missing.sum())} rows have no {columns.item_id!r}; "
            f"every item needs an id (or name the id column with {FLAGS['item_id']})"
        )
    ids = strings(id_column)
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise ConfigError(
            f"{path.name} lists item {unique[counts > 1][0]!r} more than once "
            f"({int((counts > 1).sum())} ids repeat); keep one row per item"
        )
    pairs = [_one_hot(table, one_hot)]
    if columns.category is not None:
        pairs.insert(0, _listed(table.column(columns.category)))
    names, offsets, codes = categories(pairs, len(ids))
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
        titles = strings(pc.fill_null(table.column(columns.title), ""))
    return ItemInfo(ids, names, offsets, codes, published, titles)
