"""How a Prometheus collector is declared, and the buckets the service's histograms share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
    0.125,
    0.15,
    0.25,
    0.5,
    1.0,
)
AGREEMENT_BUCKETS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
CANDIDATE_BUCKETS = (0, 10, 20, 50, 100, 200, 500, 1000, 1500, 2000, 3000, 5000)


Collector = Counter | Gauge | Histogram


@dataclass(frozen=True, slots=True)
class Declared:
    """One collector: its kind, name, help and labels, and its buckets or, for a gauge, how
    the workers' values combine (Prometheus multiprocess mode)."""

    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    mode: str | None = None

    def make(self, registry: CollectorRegistry) -> Collector:
        options: dict[str, Any] = {"registry": registry}
        if self.buckets is not None:
            options["buckets"] = self.buckets
        if self.mode is not None:
            options["multiprocess_mode"] = self.mode
        return self.kind(self.name, self.doc, list(self.labels), **options)
