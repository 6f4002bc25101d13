"""How a data file is laid out, as published: format, separator, header, encoding.

Public datasets come as they were first published: a tab-separated ratings file named
`u.data` with no header, a pipe-separated latin-1 item table named `u.item`, a gzipped
CSV. The suffix says the format only when it is one of ours; otherwise the flags do, and a
compressed file (`.gz`, `.bz2`) is read through, its format taken from the suffix before.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow.csv as pa_csv

from app.core.errors import ConfigError

log = logging.getLogger("recsys.build")

FORMATS = ("csv", "tsv", "parquet")
COMPRESSED = (".gz", ".bz2")
SEPARATORS = {"csv": ",", "tsv": "\t"}
# What --sep accepts by name: a tab or a pipe is awkward to pass in a shell.
NAMED_SEPARATORS = {"tab": "\t", "\\t": "\t", "pipe": "|", "comma": ",", "semicolon": ";"}


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


def _separator(text: str) -> str:
    sep = NAMED_SEPARATORS.get(text.lower(), text)
    if len(sep) != 1:
        raise argparse.ArgumentTypeError(
            f"a separator is one character, or one of {', '.join(NAMED_SEPARATORS)}"
        )
    return sep


def _names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError("give each column a name once, as NAME,NAME,...")
    return names


def add_layout_flags(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    """`flag`-format, -sep, -no-header, -columns, -encoding for the file `flag` names."""
    parser.add_argument(
        f"{flag}-format", choices=FORMATS, default=None, help=f"{what}'s format, if not its suffix"
    )
    parser.add_argument(
        f"{flag}-sep",
        type=_separator,
        default=None,
        help=f"{what}'s separator: a character, or tab, pipe, comma, semicolon",
    )
    parser.add_argument(
        f"{flag}-no-header",
        action="store_true",
        help=f"{what} has no header row: name its columns with {flag}-columns",
    )
    parser.add_argument(
        f"{flag}-columns", type=_names, default=(), help=f"{what}'s column names, NAME,NAME,..."
    )
    parser.add_argument(
        f"{flag}-encoding", default="utf8", help=f"{what}'s text encoding (latin-1...)"
    )


def layout_from(args: argparse.Namespace, dest: str, flag: str) -> FileLayout:
    """The FileLayout the flags of add_layout_flags(parser, flag) gave."""
    header = not getattr(args, f"{dest}_no_header")
    columns: tuple[str, ...] = getattr(args, f"{dest}_columns")
    if not header and not columns:
        raise ConfigError(f"{flag}-no-header needs {flag}-columns NAME,... to name the columns")
    if header and columns:
        raise ConfigError(
            f"{flag}-columns names the columns of a file without a header: add {flag}-no-header"
        )
    return FileLayout(
        format=getattr(args, f"{dest}_format"),
        sep=getattr(args, f"{dest}_sep"),
        header=header,
        columns=columns,
        encoding=getattr(args, f"{dest}_encoding"),
    )
