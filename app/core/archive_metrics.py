"""Prometheus metrics of the archive (recsys-archive). Every label takes values from a fixed,
small set: the two kinds of row, why a row was kept apart, and what became of a write."""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.core.collectors import Declared

ARCHIVE_KINDS = ("events", "answers")


class Unfit(StrEnum):
    """Why the archive kept a row apart (app/archive/quarantine.py): the `reason` label."""

    OUT_OF_RANGE = "out_of_range"  # a number past what its column's type holds
    NOT_UNICODE = "not_unicode"  # text with no UTF-8 for it: a lone surrogate
    FUTURE = "future"  # stamped further ahead of the archive's clock than it allows


ARCHIVE_DECLARED: dict[str, Declared] = {
    "rows": Declared(
        Counter,
        "recsys_archive_rows",
        "Rows written to the archive's files (durable, then acknowledged), by kind; a row "
        "written twice (a retried write) counts twice and is read once.",
        ("kind",),
    ),
    "malformed": Declared(
        Counter,
        "recsys_archive_malformed",
        "Stream entries or rows the archive could not read, by kind: acknowledged, not kept.",
        ("kind",),
    ),
    "quarantined": Declared(
        Counter,
        "recsys_archive_quarantined",
        "Rows the archive kept apart instead of archiving them, by kind and reason "
        "(out_of_range: a number past its column's type; not_unicode: text with a lone "
        "surrogate; future: stamped further ahead of the archive's clock than it allows): "
        "written raw under quarantine/ with their stream ids, acknowledged.",
        ("kind", "reason"),
    ),
    "writes": Declared(
        Counter,
        "recsys_archive_writes",
        "The archive's writes, by outcome (written; failed: the store refused, nothing was "
        "acknowledged, the rows are written again at the next try).",
        ("outcome",),
    ),
    "lag": Declared(
        Gauge,
        "recsys_archive_lag_seconds",
        "Age of the oldest entry read and not yet written and acknowledged, or of the last "
        "entry read when it came late (0 when caught up).",
    ),
    "buffered": Declared(
        Gauge,
        "recsys_archive_buffered_rows",
        "Rows read and waiting for the next write.",
    ),
    "last_write": Declared(
        Gauge,
        "recsys_archive_last_write_timestamp_seconds",
        "When the archive last wrote and acknowledged (its Unix time; 0: not yet).",
    ),
    "compactions": Declared(
        Counter,
        "recsys_archive_compactions",
        "Days merged into one file each, by outcome (compacted, failed).",
        ("outcome",),
    ),
}


class ArchiveMetrics:
    rows: Counter
    malformed: Counter
    quarantined: Counter
    writes: Counter
    lag: Gauge
    buffered: Gauge
    last_write: Gauge
    compactions: Counter

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for attribute, declared in ARCHIVE_DECLARED.items():
            setattr(self, attribute, declared.make(self.registry))
        self.row_count = {kind: self.rows.labels(kind) for kind in ARCHIVE_KINDS}
        self.malformed_count = {kind: self.malformed.labels(kind) for kind in ARCHIVE_KINDS}
        self.quarantine_count = {
            (kind, reason.value): self.quarantined.labels(kind, reason)
            for kind in ARCHIVE_KINDS
            for reason in Unfit
        }
        self.write_count = {o: self.writes.labels(o) for o in ("written", "failed")}
        self.compaction_count = {o: self.compactions.labels(o) for o in ("compacted", "failed")}
