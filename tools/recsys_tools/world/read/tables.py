"""What reading any table needs: its file checked, its columns found and read with their
types, and errors that name the flag that fixes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from app.core.errors import ConfigError
from recsys_tools.world.read.formats import (
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


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def check_file(path: Path, layout: FileLayout, flag: str) -> str:
    """The file's format, once it is known to exist and to be one this reads."""
    kind = file_format(path, layout, flag)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; check the path given to {flag}")
    return kind


def column_names(path: Path, kind: str, layout: FileLayout, flag: str) -> list[str]:
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


def require_columns(path: Path, wanted: dict[str, str], present: list[str], file_flag: str) -> None:
    """wanted maps a role (user, item...) to the column name that should hold it."""
    for role, name in wanted.items():
        if name in present:
            continue
        fix = f"name the {role.replace('_', ' ')} column with {FLAGS[role]}"
        if role == "time":
            fix += f", or give {FLAGS['time']} none for a log without times"
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


def read_table(
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


def strings(column: pa.ChunkedArray) -> StrArray:
    values: StrArray = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.str_)
    return values


def missing_ids(column: pa.ChunkedArray) -> BoolArray:
    missing = pc.or_kleene(pc.is_null(column), pc.equal(pc.utf8_trim_whitespace(column), ""))
    filled: BoolArray = np.asarray(pc.fill_null(missing, True).to_numpy(zero_copy_only=False))
    return filled
