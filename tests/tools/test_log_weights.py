"""A log's weights: a blank one drops its row (counted), an infinite one refuses the log with a
line naming the column, before ALS meets it as NaN in a library's traceback."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from recsys_tools.world.read.log import LogColumns, read_log

from app.core.errors import ConfigError

COLUMNS = LogColumns("userId", "movieId", "timestamp", "rating", min_weight=3.0)


def _csv(tmp_path: Path, third: str) -> Path:
    path = tmp_path / "ratings.csv"
    rows = ["1,10,4.0,100", "1,11,5.0,200", f"2,10,{third},300", "2,12,2.0,400"]
    path.write_text("userId,movieId,rating,timestamp\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("value", ["inf", "-inf", "Infinity"])
def test_an_infinite_weight_is_refused_naming_the_column_and_the_row(
    tmp_path: Path, value: str
) -> None:
    with pytest.raises(ConfigError, match=r"ratings\.csv: 'rating' is infinite in 1 of its rows"):
        read_log(_csv(tmp_path, value), COLUMNS)
    with pytest.raises(ConfigError, match="data row 3"):
        read_log(_csv(tmp_path, value), COLUMNS)


def test_an_infinite_weight_in_parquet_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "ratings.parquet"
    table = {
        "userId": ["1", "1", "2"],
        "movieId": ["10", "11", "10"],
        "rating": [4.0, float("inf"), 5.0],
        "timestamp": [100, 200, 300],
    }
    pq.write_table(pa.table(table), path)
    with pytest.raises(ConfigError, match="'rating' is infinite"):
        read_log(path, COLUMNS)


def test_a_blank_weight_still_drops_its_row_and_is_counted(tmp_path: Path) -> None:
    log = read_log(_csv(tmp_path, ""), COLUMNS)
    assert log.counts.dropped["missing_weight"] == 1
    assert len(log.user) == 3
