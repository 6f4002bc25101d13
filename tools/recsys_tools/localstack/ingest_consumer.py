"""A real `recsys-ingest` process, for the demo and the tests, stopped by its pid."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import redis

from app.release.keyspace import KeySpace
from recsys_tools.localstack.processes import ManagedProcess, start_logging_module

# What the consumer logs once its groups exist and it reads (app.ingest.cli).
READY_LINE = "ingesting partitions"
# Below the API's CPU priority, as the deployment's CPUWeight puts it: events may wait tens
# of milliseconds longer on a busy host, a /recommend must not.
NICENESS = 10


def start_ingest(
    settings: Mapping[str, str],
    workdir: Path,
    niceness: int = NICENESS,
    *,
    metrics: bool = False,
) -> ManagedProcess:
    """`python -m app.ingest.cli` with these RECSYS_* variables; returns once it consumes.

    With `metrics`, it serves its metrics on a port of its own, its `ports["metrics"]`.
    """
    env = {**os.environ, **settings}
    return start_logging_module(
        "recsys-ingest",
        "app.ingest.cli",
        READY_LINE,
        env,
        workdir / "ingest.log",
        niceness,
        metrics_setting="RECSYS_INGEST_METRICS_PORT",
        metrics=metrics,
    )


def unapplied(client: redis.Redis, keys: KeySpace, partitions: int) -> int:
    """Entries the consumer group has not acknowledged, over every partition, and one more
    for each partition with entries still unread (Redis 6 tells no count of those). A
    partition holding entries before a consumer has made its group there is all unread."""
    group = keys.ingest_group
    return sum(group_behind(client, keys.events(p), group) for p in range(partitions))


def group_behind(client: redis.Redis, stream: str, group: str) -> int:
    """What `group` has left of `stream`: its pending entries, and one more when some are
    unread (all of a stream with entries and no such group yet count as one)."""
    if not client.exists(stream):
        return 0
    info = client.xinfo_stream(stream)
    found = [g for g in client.xinfo_groups(stream) if _text(g["name"]) == group]
    if not found:
        return int(int(info["length"]) > 0)
    unread = found[0]["last-delivered-id"] != info["last-generated-id"]
    return int(found[0]["pending"]) + int(unread)


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
