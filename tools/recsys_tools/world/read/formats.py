"""How a data file is laid out, as published: format, separator, header, encoding.

Public datasets come as they were first published: a tab-separated ratings file named
`u.data` with no header, a pipe-separated latin-1 item table named `u.item`, a gzipped
CSV. The suffix says the format only when it is one of ours; otherwise the flags do, and a
compressed file (`.gz`, `.bz2`) is read through, its format taken from the suffix before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow.csv as pa_csv

from app.core.errors import ConfigError

log = logging.getLogger("recsys.build")

FORMATS = ("csv", "tsv", "parquet")
COMPRESSED = (".gz", ".bz2")
SEPARATORS = {"csv": ",", "tsv": "\t"}


@dataclass(frozen=True, slots=True)
class FileLayout:
    format: str | None = None  # one of FORMATS; None: from the suffix
    sep: str | None = None  # None: the format's own
    header: bool = True
    columns: tuple[str, ...] = ()  # the column names of a file without a header
    encoding: str = "utf8"


def file_format(path: Path, layout: FileLayout, flag: str) -> str:
    """The file's format: named by the layout, else by its suffix (under a compression
    suffix), else delimited text where a separator is named; any other file is refused
    with the flag that names its format."""
    if layout.format is not None:
        return layout.format
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes = suffixes[:-1]
    found = suffixes[-1].lstrip(".") if suffixes else ""
    if found in FORMATS:
        return found
    if layout.sep is not None:
        return "csv"  # a separator named: delimited text, whatever the suffix
    shown = f".{found} file" if found else "suffix-less file"
    raise ConfigError(
        f"{path}: cannot tell the format of a {shown}; give {flag} a .csv, .tsv or .parquet "
        f"file (gzipped too), or name its format with {flag}-format csv|tsv|parquet (and "
        f"{flag}-sep for another separator)"
    )


def parse_options(kind: str, layout: FileLayout) -> pa_csv.ParseOptions:
    return pa_csv.ParseOptions(delimiter=layout.sep or SEPARATORS.get(kind, ","))


def read_options(layout: FileLayout) -> pa_csv.ReadOptions:
    """A file without a header has its names given; its first row is data like the rest."""
    if layout.header:
        return pa_csv.ReadOptions(encoding=layout.encoding)
    return pa_csv.ReadOptions(column_names=list(layout.columns), encoding=layout.encoding)


def looks_like_data(names: list[str]) -> bool:
    """A header whose every name is a number is the file's first row of data."""

    def numeric(name: str) -> bool:
        try:
            float(name)
        except ValueError:
            return False
        return True

    return bool(names) and all(numeric(name) for name in names)


def warn_of_data_header(path: Path, names: list[str], flag: str) -> None:
    log.warning(
        "%s: its first row (%s) looks like data, not a header; if the file has none, give "
        "%s-no-header and %s-columns NAME,... or that row is lost",
        path.name,
        ", ".join(names),
        flag,
        flag,
    )
