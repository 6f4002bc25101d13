"""What one setting measured: Triton's statistics over the window and the client's figures.

Pure: the statistics come in as get_inference_statistics(as_json=True) gives them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recsys_tools.measure import percentile
from recsys_tools.tune.config import Setting, TuneError


@dataclass(frozen=True, slots=True)
class TritonDelta:
    """What Triton counted over one measured window (`requests` are the chunks it received)."""

    executions: int
    inferences: int  # rows
    requests: int
    rows_per_execution: float | None
    requests_per_execution: float | None
    queue_ms_per_request: float | None
    compute_ms_per_request: float | None
    busy_s: float  # the instances' time in executions: input, inference and output
    batch_sizes: dict[int, int]  # rows in an execution: how many executions had that many


@dataclass(slots=True)
class _Totals:
    requests: int = 0
    inferences: int = 0
    executions: int = 0
    queue_ns: int = 0
    infer_ns: int = 0
    busy_ns: int = 0
    batches: Counter[int] = field(default_factory=Counter)


def _ns(stat: Mapping[str, Any], name: str, key: str = "ns") -> int:
    return int((stat.get(name) or {}).get(key, 0))


def _totals(stats: Mapping[str, Any], model: str) -> _Totals:
    """Every version's counters summed; the JSON leaves zero counters out."""
    totals = _Totals()
    for version in stats.get("model_stats", []):
        if version.get("name") != model:
            continue
        inference = version.get("inference_stats", {})
        totals.requests += _ns(inference, "success", "count")
        totals.queue_ns += _ns(inference, "queue")
        totals.infer_ns += _ns(inference, "compute_infer")
        totals.inferences += int(version.get("inference_count", 0))
        totals.executions += int(version.get("execution_count", 0))
        for batch in version.get("batch_stats", []):
            totals.batches[int(batch["batch_size"])] += _ns(batch, "compute_infer", "count")
            parts = ("compute_input", "compute_infer", "compute_output")
            totals.busy_ns += sum(_ns(batch, part) for part in parts)
    return totals


def _per(part: float, whole: float, scale: float = 1.0) -> float | None:
    return round(part / whole * scale, 3) if whole > 0 else None


def stats_delta(before: Mapping[str, Any], after: Mapping[str, Any], model: str) -> TritonDelta:
    """get_inference_statistics(as_json=True) after the window less before it."""
    was, now = _totals(before, model), _totals(after, model)
    counts = {
        "requests": now.requests - was.requests,
        "inferences": now.inferences - was.inferences,
        "executions": now.executions - was.executions,
    }
    if min(counts.values()) < 0:
        raise TuneError(
            f"Triton's statistics for {model} went back during a window: the model was "
            "reloaded meanwhile; run the sweep while nothing else loads models"
        )
    requests, executions = counts["requests"], counts["executions"]
    batches = now.batches.copy()
    batches.subtract(was.batches)
    return TritonDelta(
        executions=executions,
        inferences=counts["inferences"],
        requests=requests,
        rows_per_execution=_per(counts["inferences"], executions),
        requests_per_execution=_per(requests, executions),
        queue_ms_per_request=_per(now.queue_ns - was.queue_ns, requests, 1e-6),
        compute_ms_per_request=_per(now.infer_ns - was.infer_ns, requests, 1e-6),
        busy_s=(now.busy_ns - was.busy_ns) / 1e9,
        batch_sizes={size: n for size, n in sorted(batches.items()) if n > 0},
    )


# One setting's figures -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadRun:
    """One open-loop window as the client saw it; latencies are seconds from each due time."""

    requests: int
    latencies_s: tuple[float, ...]  # the answered requests', sorted
    errors: dict[str, int]  # by gRPC status
    rows_sent: int
    chunks_sent: int
    duration_s: float  # the schedule's length: requests / rate
    span_s: float  # from the first due time to the last answer or error


@dataclass(frozen=True, slots=True)
class SettingResult:
    setting: Setting
    loaded: Setting  # read back from Triton after loading the setting
    offered_rps: float
    throughput_rps: float
    requests: int
    answered: int
    errors: int
    error_kinds: dict[str, int]
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    rows_sent: int
    chunks_sent: int
    window_s: float
    triton: TritonDelta
    busy_share: float | None  # of the instances' time over the window
    config: dict[str, Any]  # the whole config Triton reported with the setting loaded


def measured(
    setting: Setting, loaded: Setting, run: LoadRun, triton: TritonDelta, config: dict[str, Any]
) -> SettingResult:
    """The setting's figures; throughput is over the window until the last answer came."""
    window = max(run.duration_s, run.span_s)
    ms = [1000.0 * value for value in run.latencies_s]

    def rank(q: float) -> float | None:
        return round(percentile(ms, q), 3) if ms else None

    busy = triton.busy_s / (window * loaded.instances) if window > 0 else None
    return SettingResult(
        setting=setting,
        loaded=loaded,
        offered_rps=round(run.requests / run.duration_s, 3),
        throughput_rps=round(len(ms) / window, 3),
        requests=run.requests,
        answered=len(ms),
        errors=sum(run.errors.values()),
        error_kinds=dict(run.errors),
        p50_ms=rank(50),
        p99_ms=rank(99),
        max_ms=round(ms[-1], 3) if ms else None,
        rows_sent=run.rows_sent,
        chunks_sent=run.chunks_sent,
        window_s=round(window, 3),
        triton=triton,
        busy_share=None if busy is None else round(busy, 4),
        config=config,
    )
