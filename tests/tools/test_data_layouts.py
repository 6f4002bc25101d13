"""Logs and item tables as public datasets publish them: headerless TSV with a `.data`
suffix, pipe-separated latin-1 tables, gzipped CSV; each read without glue, or refused in
one line that names the flag to fix it."""

from __future__ import annotations

import gzip
import logging
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from recsys_tools.cli import main
from recsys_tools.world.read.formats import FileLayout
from recsys_tools.world.read.items import ItemColumns, read_items
from recsys_tools.world.read.log import LogColumns, read_log

from app.core.errors import ConfigError
from app.world.attributes import load_attributes

# user, item, rating, unix seconds: the 100k ratings set's u.data, tab-separated, no header.
RATINGS = [
    ("196", "242", 3, 881250949),
    ("186", "302", 3, 891717742),
    ("22", "377", 1, 878887116),
    ("196", "51", 2, 880606923),
    ("186", "346", 1, 886397596),
    ("22", "474", 4, 884182806),
]
NAMES = ("user_id", "item_id", "rating", "timestamp")
HEADERLESS = FileLayout(format="tsv", header=False, columns=NAMES)
COLUMNS = LogColumns(weight="rating", layout=HEADERLESS)


def _u_data(folder: Path, name: str = "u.data") -> Path:
    path = folder / name
    path.write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in RATINGS))
    return path


def test_a_headerless_tsv_with_any_suffix_keeps_its_first_row(tmp_path: Path) -> None:
    log = read_log(_u_data(tmp_path), COLUMNS)
    assert log.counts.rows_read == len(RATINGS)
    assert sorted(log.user_ids.tolist()) == ["186", "196", "22"]
    assert len(log.item) == len(RATINGS)


def test_a_suffix_that_says_nothing_names_the_format_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--interactions-format csv\|tsv\|parquet"):
        read_log(_u_data(tmp_path), LogColumns())


def test_a_first_row_of_data_is_no_header(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _u_data(tmp_path, "u.tsv")
    with pytest.raises(ConfigError, match="--interactions-no-header and --interactions-columns"):
        read_log(path, LogColumns())
    # Named after the first row's values, the columns are found, and the row's loss is said.
    named = LogColumns(user="196", item="242", time="881250949")
    with caplog.at_level(logging.WARNING, logger="recsys.build"):
        log = read_log(path, named)
    assert log.counts.rows_read == len(RATINGS) - 1
    assert "looks like data" in caplog.text
    assert "--interactions-no-header" in caplog.text


def test_a_gzipped_csv_reads_as_the_csv(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv.gz"
    lines = [",".join(NAMES)] + [f"{u},{i},{r},{t}" for u, i, r, t in RATINGS]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    log = read_log(path, LogColumns(weight="rating"))
    assert log.counts.rows_read == len(RATINGS)


def _u_item(folder: Path) -> Path:
    """The item table as published: pipe-separated, latin-1, no header."""
    rows = [
        "242|Kolya (1996)|24-Jan-1997||http://x|0|0|1",
        "302|L.A. Confidential (1997)|01-Jan-1997||http://x|0|1|0",
        "377|Heavyweights (1994)|01-Jan-1994||http://x|1|0|0",
        "51|Légende (1995)|01-Jan-1995||http://x|0|0|1",
        "346|Jackie Brown (1997)|01-Jan-1997||http://x|0|1|0",
        "474|Dr. Strangelove (1963)|01-Jan-1963||http://x|0|0|1",
    ]
    path = folder / "u.item"
    path.write_bytes(("\n".join(rows) + "\n").encode("latin-1"))
    return path


ITEM_NAMES = ("item_id", "title", "released", "video", "url", "action", "crime", "drama")


def test_a_pipe_separated_latin1_item_table(tmp_path: Path) -> None:
    layout = FileLayout(format="csv", sep="|", header=False, columns=ITEM_NAMES, encoding="latin-1")
    items = read_items(_u_item(tmp_path), ItemColumns(layout=layout))
    assert items.ids.tolist() == ["242", "302", "377", "51", "346", "474"]
    # Read as UTF-8 the é is refused, and the message names the flag that reads it.
    utf8 = FileLayout(format="csv", sep="|", header=False, columns=ITEM_NAMES)
    with pytest.raises(ConfigError, match="--items-encoding"):
        read_items(_u_item(tmp_path), ItemColumns(layout=utf8, category="title"))


ONE_HOT = FileLayout(format="csv", sep="|", header=False, columns=ITEM_NAMES, encoding="latin-1")


def test_one_hot_genres_dates_as_published_and_titles(tmp_path: Path) -> None:
    columns = ItemColumns(
        category_cols=("action..drama",),
        published="released",
        published_format="%d-%b-%Y",
        title="title",
        layout=ONE_HOT,
    )
    items = read_items(_u_item(tmp_path), columns)
    assert items.category_names == ("action", "crime", "drama")
    offsets, codes = items.category_offsets, items.category_codes
    listed = [
        [items.category_names[c] for c in codes[offsets[i] : offsets[i + 1]]]
        for i in range(items.size)
    ]
    assert listed == [["drama"], ["crime"], ["action"], ["drama"], ["crime"], ["drama"]]
    assert items.published is not None
    assert items.published[0] == datetime(1997, 1, 24, tzinfo=UTC).timestamp()
    assert items.titles is not None
    assert items.titles[3] == "Légende (1995)"
    # Named one by one, beside an A|B column: each item's categories, the column's first.
    both = replace(columns, category="title", category_cols=("drama", "action"))
    assert len(read_items(_u_item(tmp_path), both).category_names) == 6 + 2


def test_category_columns_and_date_formats_are_refused_in_one_line(tmp_path: Path) -> None:
    table = _u_item(tmp_path)
    with pytest.raises(ConfigError, match=r"no column 'comedy'.*--category-cols"):
        read_items(table, ItemColumns(category_cols=("action..comedy",), layout=ONE_HOT))
    with pytest.raises(ConfigError, match="'action' comes before 'drama'"):
        read_items(table, ItemColumns(category_cols=("drama..action",), layout=ONE_HOT))
    unnamed = ItemColumns(published="released", layout=ONE_HOT)
    with pytest.raises(ConfigError, match=r"'24-Jan-1997'.*--published-format"):
        read_items(table, unnamed)
    wrong = replace(unnamed, published_format="%Y-%m-%d")
    with pytest.raises(ConfigError, match="does not match --published-format '%Y-%m-%d'"):
        read_items(table, wrong)


def test_a_log_time_in_a_format_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("user_id,item_id,timestamp\nu1,a,03/02/2024 10:00\nu1,b,01/02/2024 09:30\n")
    log = read_log(path, LogColumns(time_format="%d/%m/%Y %H:%M"))
    # Ordered by time: 1 February before 3 February.
    assert log.items.ids[log.item].tolist() == ["b", "a"]
    with pytest.raises(ConfigError, match="--time-format"):
        read_log(path, LogColumns())


def test_build_world_reads_the_published_files_with_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    ratings = tmp_path / "u.data"
    lines = []
    for user in range(40):
        for k in range(8):
            item = (user * 3 + k * 7) % 30
            lines.append(f"u{user}\t{item}\t{1 + (user + k) % 5}\t{880000000 + user * 100 + k}")
    ratings.write_text("\n".join(lines) + "\n")
    argv = [
        "build-world",
        *("--world", str(tmp_path / "world"), "--interactions", str(ratings)),
        *("--interactions-format", "tsv", "--interactions-no-header"),
        *("--interactions-columns", ",".join(NAMES), "--weight-col", "rating"),
        *("--network", "mlp"),
    ]
    items = tmp_path / "u.item"
    items.write_bytes(
        "".join(
            f"{i}|Film {i} (199{i % 10})|0{1 + i % 9}-Jan-199{i % 10}||http://x"
            f"|{int(i % 3 == 0)}|{int(i % 3 == 1)}|{int(i % 3 == 2)}\n"
            for i in range(30)
        ).encode("latin-1")
    )
    with_items = [
        *argv,
        *("--items", str(items), "--items-sep", "pipe", "--items-no-header"),
        *("--items-columns", ",".join(ITEM_NAMES), "--items-encoding", "latin-1"),
        *("--category-cols", "action..drama", "--title-col", "title"),
        *("--published-col", "released", "--published-format", "%d-%b-%Y"),
    ]
    assert main(with_items) == 0
    assert "The world is in" in capsys.readouterr().out
    attributes = load_attributes(tmp_path / "world", 30)
    assert attributes.columns["title"][7] == "Film 7 (1997)"
    assert attributes.columns["categories"][7] == "crime"
    # A headerless file needs its names, and names need a headerless file.
    columns_at = argv.index("--interactions-columns")
    unnamed = argv[:columns_at] + argv[columns_at + 2 :]
    assert main(unnamed) != 0
    assert "--interactions-no-header needs --interactions-columns" in caplog.text
    with_header = [a for a in argv if a != "--interactions-no-header"]
    assert main(with_header) != 0
    assert "add --interactions-no-header" in caplog.text
