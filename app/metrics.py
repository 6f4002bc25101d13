"""Prometheus metrics of the service. Every label takes values from a fixed, small set."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

STAGES = ("features", "recall", "fetch", "pack", "rank", "rerank")
COUNTED_STAGES = ("recall", "fetch", "rank", "rerank")
OUTCOMES = ("ok", "degraded", "invalid", "error")

# Sub-millisecond resolution where the cheap stages live, up to 1 s for a stuck dependency.
LATENCY_BUCKETS = (
    0.0001,
    0.0002,
    0.0003,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
)
CANDIDATE_BUCKETS = (0, 10, 20, 50, 100, 200, 500, 1000, 1500, 2000, 3000, 5000)


class ServiceMetrics:
    """The service's collectors, on a registry of their own so several apps can coexist."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.stage_duration = Histogram(
            "recsys_stage_duration_seconds",
            "Time spent in each stage of /recommend.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "recsys_request_duration_seconds",
            "Time to answer /recommend, by outcome.",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "recsys_requests",
            "Requests to /recommend, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.candidates = Histogram(
            "recsys_stage_candidates",
            "Candidates coming out of each stage.",
            ["stage"],
            buckets=CANDIDATE_BUCKETS,
            registry=self.registry,
        )
        self.degraded = Counter(
            "recsys_degraded",
            "Stages that fell back instead of failing, by reason.",
            ["stage", "reason"],
            registry=self.registry,
        )
        self.cold_start = Counter(
            "recsys_cold_start_users",
            "Requests for users without stored features.",
            registry=self.registry,
        )
        self.ready = Gauge(
            "recsys_ready", "1 when the last readiness check passed.", registry=self.registry
        )
        # Children bound once, for the fixed label values only: every series exists from the
        # first scrape (so rate() and absent() behave), requests skip the label lookup, and a
        # label value outside the set fails loudly instead of creating a series.
        self.stage_timer = {stage: self.stage_duration.labels(stage) for stage in STAGES}
        self.stage_count = {stage: self.candidates.labels(stage) for stage in COUNTED_STAGES}
        self.request_timer = {o: self.request_duration.labels(o) for o in OUTCOMES}
        self.request_count = {o: self.requests.labels(o) for o in OUTCOMES}
