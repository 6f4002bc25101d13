"""The API's CPU per request, two checkouts side by side: did a change make requests dearer?

Starts one local stack on a world and the API of each checkout on it (each from its own
tree, one process each), then offers the same open-loop load to one and then the other,
round after round, reading each process's CPU time around its turn. The process started
second tends to run a little slower on a shared machine, so a run does it in both orders
and gives the ratio (B over A) of each order and their geometric mean, which cancels that.

    git worktree add /tmp/before <commit>
    python -m loadtest.compare_checkouts --a /tmp/before --b . [--item-pages 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recsys_tools.demo import LocalStack, local_stack, stack_options

from loadtest.cpu import tree_cpu_seconds
from loadtest.openloop import Load, demo_bodies, run, summarize
from loadtest.openloop.cli import item_pages
from loadtest.service import ApiProcess, start_api

WARMUP_S = 3.0


def _start(stack: LocalStack, checkout: Path, log_path: Path) -> ApiProcess:
    env = {
        "RECSYS_REDIS_URL": stack.settings.redis_url,
        "RECSYS_TRITON_URL": stack.settings.triton_url,
        "RECSYS_ARTIFACTS_DIR": str(stack.settings.artifacts_dir.resolve()),
    }
    return start_api(env, log_path, checkout=checkout.resolve())


async def api_cpu_ms(api: ApiProcess, bodies: list[bytes], rate: float, duration_s: float) -> float:
    """The API process's CPU milliseconds per answered request over one open-loop turn."""
    before = tree_cpu_seconds(api.pid)
    result = await run(Load(f"{api.url}/recommend", bodies), rate, duration_s)
    used = tree_cpu_seconds(api.pid) - before
    return used * 1000.0 / max(summarize(result).ok, 1)


async def one_order(
    stack: LocalStack,
    run_dir: Path,
    first: Path,
    second: Path,
    load: tuple[float, float, int],
    bodies: list[bytes],
) -> dict[str, list[float]]:
    """CPU ms per request of each checkout, round by round, `first` started first."""
    rate, duration_s, rounds = load
    apis = {"first": _start(stack, first, run_dir / "api-first.log")}
    apis["second"] = _start(stack, second, run_dir / "api-second.log")
    figures: dict[str, list[float]] = {name: [] for name in apis}
    try:
        for api in apis.values():
            await run(Load(f"{api.url}/recommend", bodies), rate, WARMUP_S)
        for round_number in range(rounds):
            turns = list(apis) if round_number % 2 == 0 else list(reversed(apis))
            for name in turns:
                figures[name].append(
                    round(await api_cpu_ms(apis[name], bodies, rate, duration_s), 3)
                )
    finally:
        for api in apis.values():
            api.stop()
    return figures


async def compare(
    world: Path,
    a: Path,
    b: Path,
    load: tuple[float, float, int],
    item_pages: int = 0,
) -> dict[str, Any]:
    """B's CPU per request over A's, in both orders (`load`: rate, seconds a turn, rounds);
    home feeds, or with `item_pages` product pages of the demo items i0..i{item_pages-1}."""
    options = stack_options(world)
    rate, duration_s, _ = load
    bodies = demo_bodies(1000, 20, viewed_items=item_pages)
    with local_stack(options) as stack:
        a_first = await one_order(stack, options.run_dir, a, b, load, bodies)
        b_first = await one_order(stack, options.run_dir, b, a, load, bodies)
    ratio_a_first = statistics.median(a_first["second"]) / statistics.median(a_first["first"])
    ratio_b_first = statistics.median(b_first["first"]) / statistics.median(b_first["second"])
    return {
        "rate": rate,
        "duration_s": duration_s,
        "page": "product" if item_pages else "home",
        "item_pages": item_pages,
        "a": str(a),
        "b": str(b),
        "a_started_first": {"a": a_first["first"], "b": a_first["second"]},
        "b_started_first": {"a": b_first["second"], "b": b_first["first"]},
        "b_over_a": {
            "a_started_first": round(ratio_a_first, 3),
            "b_started_first": round(ratio_b_first, 3),
            "both_orders": round(math.sqrt(ratio_a_first * ratio_b_first), 3),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="the checkout to compare against")
    parser.add_argument("--b", type=Path, default=Path("."), help="the changed checkout")
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s, open loop")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds a turn")
    parser.add_argument("--rounds", type=int, default=6, help="turns each, per order")
    parser.add_argument(
        "--item-pages",
        type=item_pages,
        default=0,
        metavar="N",
        help="ask product pages of the demo items i0..i{N-1} instead of the home feed",
    )
    args = parser.parse_args(argv)
    load = (args.rate, args.duration, args.rounds)
    report = asyncio.run(compare(args.world, args.a, args.b, load, args.item_pages))
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
