"""What the service and Triton say about a run: snapshots before and after, and the deltas.

- The service's per-stage latency histograms (GET /metrics): p50, p99 and mean per stage.
- Triton's statistics for the model (gRPC ModelStatistics): queue and compute time per
  request, and how many rows and requests each execution of the model took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import tritonclient.grpc as triton_grpc
from prometheus_client.parser import text_string_to_metric_families

from loadtest.histograms import Buckets, quantile, scrape_buckets, subtract

STAGE_HISTOGRAM = "recsys_stage_duration_seconds"


@dataclass(frozen=True, slots=True)
class StageSnapshot:
    buckets: Buckets
    sums: dict[str, float]


def stage_snapshot(api_url: str) -> StageSnapshot:
    text = httpx.get(f"{api_url}/metrics", timeout=5.0).text
    sums = {
        sample.labels["stage"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == STAGE_HISTOGRAM
        for sample in family.samples
        if sample.name == f"{STAGE_HISTOGRAM}_sum"
    }
    return StageSnapshot(scrape_buckets(text, STAGE_HISTOGRAM, "stage"), sums)


def stage_deltas(before: StageSnapshot, after: StageSnapshot) -> dict[str, dict[str, float]]:
    """Per stage, over the run: observations, p50/p99 (bucket interpolation) and mean, in ms."""
    delta = subtract(after.buckets, before.buckets)
    report = {}
    for stage, buckets in delta.items():
        count = buckets[-1][1] if buckets else 0.0
        if count <= 0:
            continue
        seconds = after.sums.get(stage, 0.0) - before.sums.get(stage, 0.0)
        report[stage] = {
            "count": count,
            "p50_ms": round(quantile(buckets, 0.5) * 1000.0, 3),
            "p99_ms": round(quantile(buckets, 0.99) * 1000.0, 3),
            "mean_ms": round(seconds / count * 1000.0, 3),
        }
    return report


def triton_snapshot(triton_url: str, model: str) -> dict[str, Any]:
    client = triton_grpc.InferenceServerClient(triton_url)
    try:
        stats: dict[str, Any] = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    return stats


def _model_totals(stats: dict[str, Any]) -> dict[str, float]:
    totals = {"requests": 0.0, "rows": 0.0, "executions": 0.0, "queue_ns": 0.0, "infer_ns": 0.0}
    for version in stats.get("model_stats", []):
        inference = version.get("inference_stats", {})
        totals["requests"] += float(inference.get("success", {}).get("count", 0))
        totals["queue_ns"] += float(inference.get("queue", {}).get("ns", 0))
        totals["infer_ns"] += float(inference.get("compute_infer", {}).get("ns", 0))
        totals["rows"] += float(version.get("inference_count", 0))
        totals["executions"] += float(version.get("execution_count", 0))
    return totals


def triton_deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float | None]:
    """Over the run: requests, executions, rows and requests per execution, queue and compute
    time per request in ms."""
    was, now = _model_totals(before), _model_totals(after)
    d = {name: now[name] - was[name] for name in now}

    def per(part: str, whole: str, scale: float = 1.0) -> float | None:
        return round(d[part] / d[whole] * scale, 3) if d[whole] > 0 else None

    return {
        "requests": d["requests"],
        "executions": d["executions"],
        "rows_per_execution": per("rows", "executions"),
        "requests_per_execution": per("requests", "executions"),
        "queue_ms_per_request": per("queue_ns", "requests", 1e-6),
        "compute_ms_per_request": per("infer_ns", "requests", 1e-6),
    }
