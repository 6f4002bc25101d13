"""Several worker processes on one port, with one set of metrics between them.

uvicorn starts the workers; each is a whole service (its own clients, artifacts and
admission). Prometheus's multiprocess mode keeps every worker's metrics in files under one
directory, so a scrape that reaches any worker reports the sum over all of them: counters
and histograms add up, and each gauge says how it combines (app.core.metrics).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from app.core.processes import alive

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A live gauge's file names the process that wrote it: gauge_livesum_1234.db
_LIVE_GAUGE_FILE = re.compile(r"^gauge_live\w+?_(\d+)\.db$")


def metrics_dir() -> Path | None:
    """The shared metrics directory, when this process is one of several workers."""
    value = os.environ.get(METRICS_DIR_ENV)
    return Path(value) if value else None


@contextlib.contextmanager
def shared_metrics(workers: int) -> Iterator[Path | None]:
    """For more than one worker: a fresh metrics directory the workers inherit, then removed.

    Set before uvicorn spawns the workers, since prometheus_client reads it on import.
    """
    if workers <= 1:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="recsys-metrics-"))
    os.environ[METRICS_DIR_ENV] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop(METRICS_DIR_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def forget_dead_workers(folder: Path) -> list[int]:
    """Drop the live gauges of workers that are gone (a crash, then a restart); their pids."""
    gone = {
        int(found.group(1))
        for path in folder.iterdir()
        if (found := _LIVE_GAUGE_FILE.match(path.name)) and not alive(int(found.group(1)))
    }
    for pid in sorted(gone):
        multiprocess.mark_process_dead(pid, str(folder))  # type: ignore[no-untyped-call]
    return sorted(gone)


def retire_this_worker(folder: Path) -> None:
    """A worker stopping: its live gauges stop counting; its counters stay in the sums."""
    multiprocess.mark_process_dead(os.getpid(), str(folder))  # type: ignore[no-untyped-call]


def exposition(registry: CollectorRegistry) -> bytes:
    """The text a scrape gets: this process's registry, or every worker's metrics combined."""
    folder = metrics_dir()
    if folder is None:
        return generate_latest(registry)
    combined = CollectorRegistry()
    multiprocess.MultiProcessCollector(combined, str(folder))  # type: ignore[no-untyped-call]
    return generate_latest(combined)
