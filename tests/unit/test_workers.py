from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from app.process.workers import METRICS_DIR_ENV, exposition, forget_dead_workers, shared_metrics

GONE = 2**22 + 12345  # above the kernel's default pid_max: never a live process


def test_only_the_live_gauges_of_gone_workers_are_dropped(tmp_path: Path) -> None:
    mine = os.getpid()
    names = [
        f"gauge_livesum_{GONE}.db",
        f"gauge_livemax_{GONE}.db",
        f"gauge_livesum_{mine}.db",
        f"counter_{GONE}.db",  # counts of a gone worker still belong in the sums
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert forget_dead_workers(tmp_path) == [GONE]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"counter_{GONE}.db", f"gauge_livesum_{mine}.db"]
    )


def test_one_worker_needs_no_shared_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    with shared_metrics(1) as folder:
        assert folder is None
        assert METRICS_DIR_ENV not in os.environ


def test_several_workers_share_a_directory_removed_afterwards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    with shared_metrics(3) as folder:
        assert folder is not None
        assert folder.is_dir()
        assert os.environ[METRICS_DIR_ENV] == str(folder)
    assert not folder.exists()
    assert METRICS_DIR_ENV not in os.environ


def test_a_single_process_scrape_is_its_own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    registry = CollectorRegistry()
    Counter("demo_things", "Things.", registry=registry).inc(3)
    assert b"demo_things_total 3.0" in exposition(registry)
