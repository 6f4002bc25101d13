"""`python -m loadtest.openloop`: one run at a rate, or a sweep of rates, printed as JSON."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from loadtest.openloop.request import Load
from loadtest.openloop.runner import run
from loadtest.openloop.stats import Summary, summarize
from loadtest.openloop.sweep import sweep


def demo_bodies(
    users: int, num_items: int, *, count: int = 4096, seed: int = 0, viewed_items: int = 0
) -> list[bytes]:
    """Random demo users u0..u{users-1} with a simple context, encoded once and cycled; with
    `viewed_items`, each on the product page of one of the demo items i0..i{viewed_items-1}."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(count):
        context = {"device": rng.choice(("mobile", "desktop", "tablet")), "page": "home"}
        if viewed_items:
            context |= {"page": "product", "item_id": f"i{rng.randrange(viewed_items)}"}
        body = {"user_id": f"u{rng.randrange(users)}", "num_items": num_items, "context": context}
        bodies.append(json.dumps(body, separators=(",", ":")).encode())
    return bodies


def parse_header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()


# Demo catalogs and user bases go to millions; past a billion an id is no demo one's.
MOST_ITEM_PAGES = 10**9
MOST_USERS = 10**9


def _whole(text: str, noun: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: a whole number of {noun}") from None


def _shown(value: int) -> str:
    """A refused count as given, cut short: a float would round 1,000,000,001 into the range
    it is refused from, and overflow on a few hundred digits."""
    digits = str(value)
    return digits if len(digits) <= 20 else f"{digits[:20]}... ({len(digits)} digits)"


def item_pages(text: str) -> int:
    """--item-pages: how many demo items i0..i{N-1} the product pages show, 0 for home feeds."""
    value = _whole(text, "demo items")
    if not 0 <= value <= MOST_ITEM_PAGES:
        raise argparse.ArgumentTypeError(
            f"give 0 (home feeds) to {MOST_ITEM_PAGES:,}, not {_shown(value)}"
        )
    return value


def demo_users(text: str) -> int:
    """--users: how many demo users u0..u{N-1} ask; at least one, or no body could be made."""
    value = _whole(text, "demo users")
    if not 1 <= value <= MOST_USERS:
        raise argparse.ArgumentTypeError(
            f"give 1 to {MOST_USERS:,} demo users, not {_shown(value)}"
        )
    return value


def _summary() -> str:
    import loadtest.openloop as package  # its docstring describes the generator

    return (package.__doc__ or "").split("\n\n")[0]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.openloop", description=_summary())
    p.add_argument("--url", required=True, help="http://host:port/path")
    p.add_argument("--unix-socket", help="connect here instead of the URL's host:port")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--duration", type=float, default=10.0, help="seconds (per rate in a sweep)")
    p.add_argument("--poisson", action="store_true", help="Poisson arrivals, not even spacing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--users", type=demo_users, default=20000)
    p.add_argument("--num-items", type=int, default=20)
    p.add_argument(
        "--item-pages",
        type=item_pages,
        default=0,
        metavar="N",
        help="ask for product pages of the demo items i0..i{N-1}, not home feeds",
    )
    p.add_argument("--header", type=parse_header, action="append", default=[], metavar="K:V")
    p.add_argument("--request-id-prefix", help="send X-Request-ID: <prefix><index>")
    p.add_argument("--timeout", type=float, default=5.0, help="per request, seconds")
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--window-ms", type=float, default=1000.0, help="time series window")
    p.add_argument("--windows", action="store_true", help="print the time series too")
    p.add_argument("--sweep", help="comma-separated rates; prints each and the best")
    p.add_argument("--p99-ms", type=float, default=50.0, help="sweep: p99 bound")
    p.add_argument("--max-degraded-pct", type=float, default=1.0, help="sweep: degraded bound")
    p.add_argument("--warmup", type=float, default=2.0, help="sweep: seconds left out per rate")
    return p


def _summary_json(summary: Summary, windows: bool) -> dict[str, Any]:
    out = dataclasses.asdict(summary)
    if not windows:
        del out["windows"]
    return out


async def _cli(args: argparse.Namespace) -> dict[str, Any]:
    load = Load(
        url=args.url,
        bodies=demo_bodies(
            args.users, args.num_items, seed=args.seed, viewed_items=args.item_pages
        ),
        headers=dict(args.header),
        request_id_prefix=args.request_id_prefix,
        unix_socket=args.unix_socket,
        max_connections=args.max_connections,
        timeout_s=args.timeout,
    )
    window_s = args.window_ms / 1000.0
    cpu = time.process_time()
    out: dict[str, Any]
    if args.sweep:
        rates = [float(rate) for rate in args.sweep.split(",") if rate.strip()]
        result = await sweep(
            load,
            rates,
            duration_s=args.duration,
            p99_ms=args.p99_ms,
            max_degraded_share=args.max_degraded_pct / 100.0,
            warmup_s=args.warmup,
            poisson=args.poisson,
            seed=args.seed,
            window_s=window_s,
        )
        sent = sum(p.sent for p in result.points)
        out = {
            "best_rate": result.best_rate,
            "p99_ms": result.p99_ms,
            "max_degraded_share": result.max_degraded_share,
            "points": [
                {"rate": p.rate, "passed": p.passed, **_summary_json(p.summary, args.windows)}
                for p in result.points
            ],
        }
    else:
        one = await run(load, args.rate, args.duration, poisson=args.poisson, seed=args.seed)
        sent = len(one.records)
        out = _summary_json(summarize(one, window_s=window_s), args.windows)
        out = {"url": args.url, "rate": args.rate, "poisson": args.poisson, **out}
    cpu = time.process_time() - cpu
    out["generator"] = {
        "loop": type(asyncio.get_running_loop()).__module__,
        "cpu_s": round(cpu, 3),
        "cpu_us_per_request": round(cpu / sent * 1e6, 1) if sent else None,
    }
    return out


def _run_loop(main: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    json.dump(_run_loop(_cli(args)), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
