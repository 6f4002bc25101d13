"""The flags that say how a data file is laid out (format, separator, header, columns,
encoding), and the FileLayout they give."""

from __future__ import annotations

import argparse

from app.core.errors import ConfigError
from recsys_tools.world.read.formats import FORMATS, FileLayout

# What --sep accepts by name: a tab or a pipe is awkward to pass in a shell.
NAMED_SEPARATORS = {"tab": "\t", "\\t": "\t", "pipe": "|", "comma": ",", "semicolon": ";"}


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
