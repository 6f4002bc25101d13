"""Every benchmark writes into one JSON file; none may drop another's figures."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.record import record, record_top


def test_a_benchmark_keeps_the_others_figures(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.json"
    record(path, "cascade", {"rank": 0.23})
    # make bench's own record is the file's top level: its keys replace theirs, no others.
    record_top(path, {"max_rate_at_p99": 120.0, "model": {"rows_per_request": 500}})
    record(path, "cascade_cost", {"median_ratio": 1.0})
    record_top(path, {"max_rate_at_p99": 130.0})
    assert json.loads(path.read_text()) == {
        "cascade": {"rank": 0.23},
        "max_rate_at_p99": 130.0,
        "model": {"rows_per_request": 500},
        "cascade_cost": {"median_ratio": 1.0},
    }
