"""A run in figures: counts, rates, nearest-rank percentiles, windows, recovery after an event."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from recsys_tools.measure import percentile

from loadtest.openloop.request import Record, RunResult


@dataclass(frozen=True, slots=True)
class Latency:
    """Nearest-rank percentiles in milliseconds; None where there were no values."""

    count: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None


def latency_of(seconds: Sequence[float]) -> Latency:
    values = sorted(seconds)
    if not values:
        return Latency(0, None, None, None, None)

    def ms(q: float) -> float:
        return percentile(values, q) * 1000.0

    return Latency(len(values), ms(50), ms(90), ms(99), values[-1] * 1000.0)


@dataclass(frozen=True, slots=True)
class Window:
    """Requests due in [start_s, start_s + window): counts, and p99 over those answered."""

    start_s: float
    count: int
    ok: int  # 200s
    non_200: int  # every other outcome, errors included
    errors: int  # no response at all
    degraded: int
    degraded_share: float | None  # of the 200s
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    scheduled_s: float  # the span the requests were due in, after skip_s
    offered_rps: float  # requests / scheduled_s
    achieved_rps: float  # responses / time from the first due time to the last answer
    goodput_rps: float  # 200s over the same span as achieved_rps
    ok: int
    statuses: dict[str, int]  # HTTP status -> count, responses only
    errors: dict[str, int]  # error kind -> count, requests without a response
    degraded: int
    degraded_share: float | None  # of the 200s
    retry_after_503: int  # 503s that carried Retry-After
    latency: Latency  # every request that got a response
    latency_by_status: dict[str, Latency]
    send_lag: Latency  # how late requests went out: the generator's or the pool's own delay
    window_s: float
    windows: list[Window]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _window(start_s: float, records: Sequence[Record]) -> Window:
    ok = [r for r in records if r.status == 200]
    degraded = sum(r.degraded for r in ok)
    answered = sorted(r.latency for r in records if r.status)
    p99 = percentile(answered, 99) * 1000.0 if answered else None
    errors = sum(1 for r in records if not r.status)
    return Window(
        start_s=start_s,
        count=len(records),
        ok=len(ok),
        non_200=len(records) - len(ok),
        errors=errors,
        degraded=degraded,
        degraded_share=_share(degraded, len(ok)),
        p99_ms=p99,
    )


def windows_of(
    records: Sequence[Record], start_s: float, end_s: float, window_s: float
) -> list[Window]:
    """Fixed windows over [start_s, end_s) by due time; a window may be empty."""
    if not window_s > 0:
        raise ValueError("window_s must be > 0")
    count = max(0, math.ceil((end_s - start_s) / window_s - 1e-9))
    buckets: list[list[Record]] = [[] for _ in range(count)]
    for record in records:
        slot = int((record.scheduled - start_s) / window_s)
        if 0 <= slot < count:
            buckets[slot].append(record)
    return [_window(start_s + i * window_s, bucket) for i, bucket in enumerate(buckets)]


def summarize(result: RunResult, *, window_s: float = 0.1, skip_s: float = 0.0) -> Summary:
    """Counts, rates, latencies and windows of one run, leaving out requests due before skip_s."""
    records = [r for r in result.records if r.scheduled >= skip_s]
    span = max(result.scheduled_s - skip_s, 1e-9)
    answered = [r for r in records if r.status]
    ok = [r for r in answered if r.status == 200]
    last = max((r.end for r in records), default=result.scheduled_s)
    served_span = max(last, result.scheduled_s) - skip_s
    statuses: dict[int, list[float]] = {}
    for r in answered:
        statuses.setdefault(r.status, []).append(r.latency)
    errors: dict[str, int] = {}
    for r in records:
        if not r.status:
            errors[r.error] = errors.get(r.error, 0) + 1
    degraded = sum(r.degraded for r in ok)
    return Summary(
        requests=len(records),
        scheduled_s=span,
        offered_rps=len(records) / span,
        achieved_rps=len(answered) / served_span if served_span > 0 else 0.0,
        goodput_rps=len(ok) / served_span if served_span > 0 else 0.0,
        ok=len(ok),
        statuses={str(s): len(v) for s, v in sorted(statuses.items())},
        errors=dict(sorted(errors.items())),
        degraded=degraded,
        degraded_share=_share(degraded, len(ok)),
        retry_after_503=sum(1 for r in answered if r.status == 503 and r.retry_after),
        latency=latency_of([r.latency for r in answered]),
        latency_by_status={str(s): latency_of(v) for s, v in sorted(statuses.items())},
        send_lag=latency_of([max(0.0, r.sent - r.scheduled) for r in records if r.sent >= 0]),
        window_s=window_s,
        windows=windows_of(records, skip_s, skip_s + span, window_s),
    )


def is_good(record: Record) -> bool:
    """A 200 that was not degraded."""
    return record.status == 200 and not record.degraded


def recovery_time(
    records: Sequence[Record],
    since_s: float,
    good: Callable[[Record], bool] = is_good,
    hold_s: float = 0.5,
) -> float | None:
    """How long after since_s the service was clean again, judged by due time.

    Clean again means every request due for hold_s afterwards was good: R is the due time of
    the last bad request before the first such stretch, less since_s (0.0 when the stretch
    starts at since_s). A bad request after it is a relapse, not a later recovery: one slow
    read seconds afterwards on a busy machine says nothing about how long the fault lasted.
    None when no such stretch came before the run ended. For "slower than X" pass a
    predicate such as `lambda r: is_good(r) and r.latency <= X`.
    """
    last_bad = since_s
    for record in sorted(records, key=lambda r: r.scheduled):
        if record.scheduled < since_s:
            continue
        if not good(record):
            last_bad = record.scheduled
        elif record.scheduled - last_bad >= hold_s:
            return last_bad - since_s
    return None
