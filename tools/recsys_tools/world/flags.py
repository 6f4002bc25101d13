"""The flags the commands that read a log or an item table share: how a data file is laid out
(format, separator, header, columns, encoding) and the FileLayout they give, the log's and
the item table's columns, and where a build runs."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from app.core.errors import ConfigError
from recsys_tools.world.read.formats import FORMATS, FileLayout
from recsys_tools.world.read.items import ItemColumns
from recsys_tools.world.read.log import LogColumns

# What build-world --engine spark gathers on the driver by default, in rows.
SAMPLE_ROWS = 2_000_000
# What --time-col says of a log that has no times.
NO_TIMES = "none"
# What --sep accepts by name: a tab or a pipe is awkward to pass in a shell.
NAMED_SEPARATORS = {"tab": "\t", "\\t": "\t", "pipe": "|", "comma": ",", "semicolon": ";"}


def _separator(text: str) -> str:
    sep = NAMED_SEPARATORS.get(text.lower(), text)
    if len(sep) != 1:
        raise argparse.ArgumentTypeError(
            f"a separator is one character, or one of {', '.join(NAMED_SEPARATORS)}"
        )
    return sep


def positive_float(text: str) -> float:
    """A finite number above 0, for a flag that scales or regularises."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number above 0")
    return value


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


def item_columns(args: argparse.Namespace) -> ItemColumns:
    """The item table's columns, as add_item_table_flags' flags say."""
    return ItemColumns(
        item_id=args.item_id_col,
        category=args.category_col,
        category_cols=_listed(args.category_cols),
        published=args.published_col,
        published_format=args.published_format,
        title=args.title_col,
        layout=layout_from(args, "items", "--items"),
    )


def log_columns(args: argparse.Namespace) -> LogColumns:
    """The interaction log's columns as add_log_flags named them (build-world, replay)."""
    return LogColumns(
        user=args.user_col,
        item=args.item_col,
        time=None if args.time_col == NO_TIMES else args.time_col,
        weight=args.weight_col,
        min_weight=args.min_weight,
        time_format=args.time_format,
        layout=layout_from(args, "interactions", "--interactions"),
    )


def _listed(listed: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (listed or "").split(",") if n.strip())


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that name an interaction log's columns and lay-out (separator, header,
    encoding), the same for every command."""
    parser.add_argument("--user-col", default="user_id", help="default: user_id")
    parser.add_argument("--item-col", default="item_id", help="default: item_id")
    parser.add_argument(
        "--time-col",
        default="timestamp",
        help="unix seconds or ISO datetimes; default: timestamp; `none` for a log without "
        "times (each user's held-out part is then drawn at random, and the features of age "
        "and recency are left out)",
    )
    parser.add_argument(
        "--time-format",
        default=None,
        help="the time column's strptime format where it is neither unix seconds nor ISO "
        "text, such as %%d/%%m/%%Y %%H:%%M",
    )
    parser.add_argument("--weight-col", default=None, help="a rating or weight column")
    parser.add_argument(
        "--min-weight", type=float, default=None, help="rows at or above it are positives"
    )
    add_layout_flags(parser, "--interactions", "the log")


def add_engine_flags(built: argparse.ArgumentParser) -> None:
    """Where the build runs: in this process, or as Spark jobs on a cluster."""
    built.add_argument(
        "--engine",
        choices=("local", "spark"),
        default="local",
        help="local (the default): the whole log in this process's memory; spark: the heavy "
        "steps as Spark jobs, for a log past one host (README, Beyond one machine)",
    )
    built.add_argument(
        "--spark-master",
        default="local[*]",
        help="with --engine spark: local[*] (the default), spark://HOST:7077, yarn, k8s://...",
    )
    built.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, as many as needed (spark.driver.memory=8g, "
        "spark.executor.memory=16g, ...)",
    )
    built.add_argument(
        "--spark-sample-rows",
        type=int,
        default=SAMPLE_ROWS,
        help="with --engine spark: about this many rows (every row of a sample of users) are "
        "gathered on the driver to train the ranker and judge the world; default %(default)s",
    )


def add_item_table_flags(built: argparse.ArgumentParser) -> None:
    """The item table build-world may read beside the log, and its columns."""
    built.add_argument(
        "--items", type=Path, default=None, help="the item table: CSV, TSV or Parquet"
    )
    built.add_argument("--item-id-col", default="item_id", help="default: item_id")
    built.add_argument("--category-col", default=None, help="categories, several as A|B|C")
    built.add_argument(
        "--category-cols",
        default=None,
        metavar="A,B,C",
        help="one column per category, set (1, true) where the item is in it: names, or "
        "FIRST..LAST for every column between them; beside --category-col or alone",
    )
    built.add_argument("--published-col", default=None, help="when each item was published")
    built.add_argument(
        "--published-format",
        default=None,
        help="its strptime format where it is neither unix seconds nor ISO text, such as "
        "%%d-%%b-%%Y for 01-Jan-1995",
    )
    built.add_argument(
        "--title-col",
        default=None,
        help="a title kept in the catalog: /recommend returns it when asked "
        '(attributes: ["title"]) and the demo prints it',
    )
    add_layout_flags(built, "--items", "the item table")
