"""The local engine refuses a log past its process's own memory limit before reading it, and
names the Spark engine; without a limit, or for a log that fits, it builds as before."""

from __future__ import annotations

import gzip
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from recsys_tools.world.read.formats import FileLayout
from recsys_tools.world.recipes import capacity
from recsys_tools.world.recipes.capacity import check_fits, estimated_rows, memory_limit

from app.core.errors import ConfigError

ROWS = 20_000


def _log(folder: Path) -> Path:
    path = folder / "log.csv"
    lines = [f"{u % 97},{u % 13},{1_500_000_000 + u}" for u in range(ROWS)]
    path.write_text("user_id,item_id,timestamp\n" + "\n".join(lines) + "\n")
    return path


def test_rows_are_estimated_from_a_text_files_size_and_counted_in_parquet(tmp_path: Path) -> None:
    text = _log(tmp_path)
    assert abs((estimated_rows(text, FileLayout()) or 0) - ROWS) < ROWS * 0.05
    parquet = tmp_path / "log.parquet"
    pq.write_table(pa.table({"user_id": ["a"] * 7}), parquet)
    assert estimated_rows(parquet, FileLayout()) == 7
    packed = tmp_path / "log.csv.gz"
    packed.write_bytes(gzip.compress(text.read_bytes()))
    assert estimated_rows(packed, FileLayout()) is None  # its size says little


def test_a_log_past_the_limit_is_refused_naming_the_spark_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path)
    monkeypatch.setattr(capacity, "memory_limit", lambda: (2**30, "its address-space limit"))
    monkeypatch.setattr(capacity, "BYTES_PER_ROW", 2**30 // 1000)  # 20,000 rows: about 20 GiB
    with pytest.raises(ConfigError) as refused:
        check_fits(log, FileLayout())
    said = str(refused.value)
    assert "--engine spark" in said
    assert "1.0 GiB" in said
    assert "\n" not in said
    monkeypatch.setattr(capacity, "BYTES_PER_ROW", 10)
    check_fits(log, FileLayout())  # 200 kB fits


def test_without_a_limit_nothing_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(capacity, "memory_limit", lambda: None)
    monkeypatch.setattr(capacity, "BYTES_PER_ROW", 2**40)
    check_fits(_log(tmp_path), FileLayout())


def test_the_limit_is_read_from_ulimit_v() -> None:
    limit = 64 * 2**30
    code = "from recsys_tools.world.recipes.capacity import memory_limit; print(memory_limit())"
    shown = subprocess.run(
        ["prlimit", f"--as={limit}", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"({limit}, 'its address-space limit (ulimit -v)')" in shown
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        found = memory_limit()
        assert found is None or found[1] == "its cgroup's memory limit"
