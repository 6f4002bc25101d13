"""The highest rate that meets a p99 bound, one rate after another."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.openloop.request import Load
from loadtest.openloop.runner import run
from loadtest.openloop.stats import Summary, summarize


@dataclass(frozen=True, slots=True)
class SweepPoint:
    rate: float
    passed: bool
    summary: Summary  # of the measured part, after the warm-up
    sent: int  # requests of the whole run, warm-up included


@dataclass(frozen=True, slots=True)
class SweepResult:
    p99_ms: float
    max_degraded_share: float
    best_rate: float | None  # highest passing rate; None when none passed
    points: list[SweepPoint]


def passes(summary: Summary, p99_ms: float, max_degraded_share: float) -> bool:
    """Every request a 200, p99 within the bound, and degraded answers within the share."""
    p99 = summary.latency.p99_ms
    return (
        summary.requests > 0
        and summary.ok == summary.requests
        and p99 is not None
        and p99 <= p99_ms
        and (summary.degraded_share or 0.0) <= max_degraded_share
    )


async def sweep(
    load: Load,
    rates: Sequence[float],
    *,
    duration_s: float,
    p99_ms: float,
    max_degraded_share: float = 0.01,
    warmup_s: float = 2.0,
    pause_s: float = 1.0,
    poisson: bool = False,
    seed: int = 0,
    window_s: float = 1.0,
) -> SweepResult:
    """Each rate in turn, as one run of warmup_s + duration_s with the warm-up left out."""
    points: list[SweepPoint] = []
    for number, rate in enumerate(rates):
        if number:
            await asyncio.sleep(pause_s)  # let the service drain what the last rate queued
        result = await run(load, rate, warmup_s + duration_s, poisson=poisson, seed=seed + number)
        summary = summarize(result, window_s=window_s, skip_s=warmup_s)
        passed = passes(summary, p99_ms, max_degraded_share)
        points.append(SweepPoint(rate, passed, summary, len(result.records)))
    best = max((p.rate for p in points if p.passed), default=None)
    return SweepResult(p99_ms, max_degraded_share, best, points)
