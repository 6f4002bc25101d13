"""A real `recsys-archive` process, for the demo and the tests, stopped by its pid."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import redis

from app.clients.archive_stream import ARCHIVE_GROUP
from app.release.keyspace import KeySpace
from recsys_tools.localstack.ingest_consumer import group_behind
from recsys_tools.localstack.processes import ManagedProcess, start_logging_module

# What the archive logs once its groups exist and it reads (app.archive.cli).
READY_LINE = "archiving"
# Below the API's CPU priority, as the deployment's CPUWeight puts it.
NICENESS = 10


def start_archive(
    settings: Mapping[str, str],
    workdir: Path,
    niceness: int = NICENESS,
    *,
    metrics: bool = False,
) -> ManagedProcess:
    """`python -m app.archive.cli` with these RECSYS_* variables; returns once it reads.

    With `metrics`, it serves its metrics on a port of its own, its `ports["metrics"]`.
    """
    env = {**os.environ, **settings}
    return start_logging_module(
        "recsys-archive",
        "app.archive.cli",
        READY_LINE,
        env,
        workdir / "archive.log",
        niceness,
        metrics_setting="RECSYS_ARCHIVE_METRICS_PORT",
        metrics=metrics,
    )


def unarchived(client: redis.Redis, keys: KeySpace, partitions: int) -> int:
    """What the archive has not written and acknowledged, over every event partition and the
    answer log (as `unapplied` counts it for the ingest consumer)."""
    streams = [keys.events(p) for p in range(partitions)] + [keys.shown]
    return sum(group_behind(client, stream, ARCHIVE_GROUP) for stream in streams)
