"""What tracing costs: the API's CPU per request with the debug pages off, and on with 1%
and with 100% of requests traced, side by side on one local stack.

Each setting runs its own API process in turn at the same steady open-loop rate; the rounds
interleave the settings and rotate which goes first, so neither a machine that slows down
mid-run nor the order favours one; the figures are each setting's median over the rounds,
and the ratios against off.

    python -m loadtest.trace_cost [--rounds 3] [--out docs/benchmarks.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
from pathlib import Path
from typing import Any

from recsys_tools.demo import LocalStack, local_stack, stack_options

from loadtest.cpu import Processes, cpu_per_request
from loadtest.openloop import Load, demo_bodies, demo_users, run
from loadtest.record import record
from loadtest.service import api_on

SETTINGS: dict[str, dict[str, str]] = {
    "off": {},
    "1%": {"debug_pages": "true", "trace_sample_percent": "1"},
    "100%": {"debug_pages": "true", "trace_sample_percent": "100"},
}
NUM_ITEMS = 20


async def _api_cpu_ms(load: Load, processes: Processes, rate: float, duration_s: float) -> float:
    await run(load, rate, 2.0)  # warm the pools, channels and model
    figures = await cpu_per_request(load, processes, rate, duration_s)
    cpu_ms: float = figures["cpu_ms_per_request"]["api"]
    return cpu_ms


def measure_trace_cost(
    stack: LocalStack, log_dir: Path, rate: float, duration_s: float, users: int, rounds: int
) -> dict[str, Any]:
    runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for turn in range(rounds):
        # Each round starts with another setting: none is always first, or always last.
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            settings = SETTINGS[name]
            with api_on(stack, log_dir / f"api-trace-{turn}.log", **settings) as api:
                load = Load(f"{api.url}/recommend", demo_bodies(users, NUM_ITEMS), timeout_s=2.0)
                processes = Processes(api.pid, stack.redis.pid, stack.triton.pid)
                runs[name].append(asyncio.run(_api_cpu_ms(load, processes, rate, duration_s)))
    medians = {name: round(statistics.median(values), 3) for name, values in runs.items()}
    off = medians["off"] or 1.0
    return {
        "command": "python -m loadtest.trace_cost",
        "rate": rate,
        "duration_s": duration_s,
        "rounds": rounds,
        "api_cpu_ms_per_request": medians,
        "over_off": {name: round(value / off, 3) for name, value in medians.items()},
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--users", type=demo_users, default=20_000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="merge the figures into this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    options = stack_options(args.world)
    with local_stack(options) as stack:
        figures = measure_trace_cost(
            stack, options.run_dir, args.rate, args.duration, args.users, args.rounds
        )
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "trace_cost", figures)


if __name__ == "__main__":
    main()
