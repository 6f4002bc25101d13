"""Quantiles from Prometheus histograms scraped before and after a run."""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

# {label value: [(upper bound, cumulative count), ...]} for one histogram and one label
Buckets = dict[str, list[tuple[float, float]]]


def scrape_buckets(text: str, histogram: str, label: str) -> Buckets:
    found: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        if family.name != histogram:
            continue
        for sample in family.samples:
            if sample.name == f"{histogram}_bucket":
                bound = float(sample.labels["le"])
                found[sample.labels[label]].append((bound, sample.value))
    return {key: sorted(values) for key, values in found.items()}


def subtract(after: Buckets, before: Buckets) -> Buckets:
    """The observations made between two scrapes."""
    delta: Buckets = {}
    for key, buckets in after.items():
        earlier = dict(before.get(key, []))
        delta[key] = [(bound, count - earlier.get(bound, 0.0)) for bound, count in buckets]
    return delta


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Linear interpolation inside the bucket holding the quantile, as histogram_quantile."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            width = count - lower_count
            fraction = (rank - lower_count) / width if width else 1.0
            return lower_bound + (bound - lower_bound) * fraction
        lower_bound, lower_count = bound, count
    return lower_bound
