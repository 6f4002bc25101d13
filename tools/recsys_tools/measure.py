"""The measuring both open-loop generators share: when requests are due, and percentiles.

The HTTP benchmark (loadtest/openloop) and the batching tuner (tune/load.py) offer load on a
schedule fixed before the run and report nearest-rank percentiles; both take them from here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence


def schedule(rate: float, duration_s: float, *, poisson: bool, seed: int = 0) -> Iterator[float]:
    """Due offsets in [0, duration_s): evenly spaced, or a seeded Poisson process."""
    if not rate > 0 or not duration_s >= 0:
        raise ValueError("rate must be > 0 and duration_s >= 0")
    if poisson:
        rng = random.Random(seed)
        offset = rng.expovariate(rate)
        while offset < duration_s:
            yield offset
            offset += rng.expovariate(rate)
        return
    index = 0
    # Multiplying rather than adding keeps the 100,000th offset as exact as the first.
    while (offset := index / rate) < duration_s:
        yield offset
        index += 1


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    if not sorted_values:
        raise ValueError("no values")
    rank = math.ceil(q / 100.0 * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]
