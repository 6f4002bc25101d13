"""What the cascade costs: the highest open-loop rate inside a 50 ms p99, before and after.

`python -m loadtest.cascade_cost [--runs 3] [--out docs/benchmarks.json]` starts the local
stack on the demo world and two API processes on it: one as the service ran before the
cascade (1,000 nearest items + 100 popular, every one ranked: `RECSYS_CANDIDATE_COUNT=1000`,
`RECSYS_SIMILAR_CANDIDATES=0`, `RECSYS_PRERANK_KEEP=5000`) and one with the defaults (a
pool of about 2,600 here, 500 ranked). It sweeps each in turn, alternating, so both meet the
same machine, and reports each one's rate, their ratio per run and its median, and each
stage's p50 from the service's own histograms at a fixed rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
from pathlib import Path
from typing import Any

import httpx
from recsys_tools.demo import local_stack, stack_options

from loadtest.bench import max_rate
from loadtest.openloop import Load, demo_bodies
from loadtest.record import record
from loadtest.service import api_on
from loadtest.stage_latency import measure

BEFORE = {"candidate_count": "1000", "similar_candidates": "0", "prerank_keep": "5000"}


def _stages(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=10.0) as client:
        return measure(client, 300, 20_000, seed=1)


def measure_cost(world: Path, runs: int, start: float, step: float) -> dict[str, Any]:
    options = stack_options(world)
    rates: dict[str, list[float | None]] = {"before": [], "after": []}
    stages: dict[str, Any] = {}
    with (
        local_stack(options) as stack,
        api_on(stack, options.run_dir / "api-before.log", **BEFORE) as before,
        api_on(stack, options.run_dir / "api-after.log") as after,
    ):
        apis = {"before": before, "after": after}
        for name, api in apis.items():
            stages[name] = _stages(api.url)
        for _ in range(runs):
            for name, api in apis.items():
                load = Load(f"{api.url}/recommend", demo_bodies(20_000, 20), timeout_s=2.0)
                swept = asyncio.run(max_rate(load, start, step, 4.0, warmup_s=1.0))
                rates[name].append(swept["max_rate_at_p99"])
    ratios = [
        round(a / b, 3) for a, b in zip(rates["after"], rates["before"], strict=True) if a and b
    ]
    return {
        "command": "python -m loadtest.cascade_cost",
        "before": BEFORE,
        "max_rate_at_p99": rates,
        "ratios_after_over_before": ratios,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "stages": stages,
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--start-rate", type=float, default=100.0)
    parser.add_argument("--step", type=float, default=1.15)
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    figures = measure_cost(args.world, args.runs, args.start_rate, args.step)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "cascade_cost", figures)


if __name__ == "__main__":
    main()
