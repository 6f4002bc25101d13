"""Prometheus metrics of the ingest consumer (recsys-ingest). Every label takes values from a
fixed, small set, as the service's do (metrics.py)."""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.core.collectors import LATENCY_BUCKETS, Declared
from app.core.events import EventType, IngestOutcome
from app.core.vocabulary import Variant

# The ingest consumer's collectors (its own process, its own /metrics).
INGEST_DECLARED: dict[str, Declared] = {
    "events": Declared(
        Counter,
        "recsys_ingest_events",
        "Events the consumer read, by what became of them.",
        ("outcome",),
    ),
    "dead_letters": Declared(
        Counter,
        "recsys_ingest_dead_letters",
        "Events moved to the dead-letter stream, by reason.",
        ("reason",),
    ),
    "lag": Declared(
        Gauge,
        "recsys_ingest_lag_seconds",
        "Age of the oldest event not yet applied (0 when caught up), over this consumer's "
        "partitions.",
    ),
    "batch_duration": Declared(
        Histogram,
        "recsys_ingest_batch_duration_seconds",
        "Time to apply one batch read from a partition.",
        buckets=LATENCY_BUCKETS,
    ),
    "outcomes": Declared(
        Counter,
        "recsys_outcomes",
        "Clicks, likes and purchases on an answer, credited to the variant that made it.",
        ("variant", "type"),
    ),
    "credits": Declared(
        Counter,
        "recsys_ingest_credits",
        "Positives naming an answer: credited to its variant, or unknown (no such answer "
        "was given, or it is older than RECSYS_ANSWER_TTL_S).",
        ("result",),
    ),
    "pending": Declared(
        Gauge,
        "recsys_ingest_pending",
        "Entries read and not yet acknowledged, over this consumer's partitions: stays above "
        "0 only while batches fail.",
    ),
    "batch_failures": Declared(
        Counter,
        "recsys_ingest_batch_failures",
        "Batches that could not be applied whole, by kind (transient: Redis unreachable, "
        "busy or full, retried as it was; error: retried user by user).",
        ("kind",),
    ),
    "trending_skipped": Declared(
        Counter,
        "recsys_ingest_trending_skipped",
        "Positives applied to their user but kept out of trending: the user was past "
        "RECSYS_TRENDING_USER_PER_MINUTE.",
    ),
    "world_changes": Declared(
        Counter,
        "recsys_ingest_world_changes",
        "Times the consumer found another world in Redis, by outcome (followed: it now "
        "applies events in that world; waiting: its files are not the world Redis holds yet).",
        ("outcome",),
    ),
    "catalog_skipped": Declared(
        Counter,
        "recsys_catalog_batches_skipped",
        "Batches of the catalog's change log the consumer could not apply and passed over "
        "(as the API's processes do): each is logged with its number.",
    ),
    "redis_memory": Declared(
        Gauge,
        "recsys_redis_memory_bytes",
        "Redis memory as the consumer last read it: used, and maxmemory (0: no limit).",
        ("kind",),
    ),
}


class DeadLetter(StrEnum):
    """Why an event could not be applied (a metric label: a fixed set)."""

    MALFORMED = "malformed"  # not an event this service wrote
    UNKNOWN_ITEM = "unknown_item"  # the world being served has no such item
    BAD_STATE = "bad_state"  # the user's stored state is damaged (a blob of the wrong size...)
    BAD_USER_ID = "bad_user_id"  # a user id no key can carry as its hash tag ({ or })
    FAILED = "failed"  # applying it failed RECSYS_INGEST_MAX_DELIVERIES times
    STALE = "stale"  # pending longer than the dedupe window: it may have applied already


class IngestMetrics:
    events: Counter
    dead_letters: Counter
    lag: Gauge
    batch_duration: Histogram
    outcomes: Counter
    credits: Counter
    pending: Gauge
    batch_failures: Counter
    trending_skipped: Counter
    world_changes: Counter
    catalog_skipped: Counter
    redis_memory: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for attribute, declared in INGEST_DECLARED.items():
            setattr(self, attribute, declared.make(self.registry))
        self.event_count = {o: self.events.labels(o) for o in IngestOutcome}
        self.dead_letter_count = {r: self.dead_letters.labels(r) for r in DeadLetter}
        self.outcome_count = {
            (variant, kind): self.outcomes.labels(variant, kind)
            for variant in Variant
            for kind in (EventType.CLICK, EventType.LIKE, EventType.PURCHASE)
        }
        self.credit_count = {r: self.credits.labels(r) for r in ("credited", "unknown")}
        self.failure_count = {k: self.batch_failures.labels(k) for k in ("transient", "error")}
        self.world_change_count = {o: self.world_changes.labels(o) for o in ("followed", "waiting")}
        self.memory = {k: self.redis_memory.labels(k) for k in ("used", "max")}
