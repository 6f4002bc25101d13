"""From a catalog change's acknowledgement to the answers: how soon an added item is served,
and that a withdrawn one never is again, under load.

`python -m loadtest.catalog_latency [--world var/world] [--adds 100] [--rate 200]
[--duration 30] [--out docs/benchmarks.json]` serves the world on the local stack (real
Redis and Triton; the demo world by default) and, for `duration` seconds at once:

- offers `rate` /recommend a second, open loop, over the demo's users (the background);
- adds `adds` items a second, one a call: each the twin of the item some user's feed puts
  first (its vector, dense features and category), so it suits that user. From the call's
  acknowledgement on, that user's feed is asked every 50 ms until it holds the twin: the
  time to the first answer holding it is the figure (p50, p99);
- withdraws one twin in ten once it has been served, and asks that user's feed five times
  after the acknowledgement: any answer begun after it that holds the twin is a violation.

The probes are /recommend calls too: the API serves the background and them together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from recsys_tools.demo import local_stack, stack_options

from app.release.catalog import ITEMS_FILE
from app.release.item_prior import ITEM_PRIOR_FILE
from app.release.schema import load_schema
from loadtest.openloop import Load, demo_bodies, run, summarize
from loadtest.record import record
from loadtest.service import api_on

log = logging.getLogger("loadtest.catalog_latency")
PROBE_EVERY_S = 0.05
GIVE_UP_S = 10.0
CONTEXT = {"page": "home", "hour": 12, "weekday": 2}


@dataclass(slots=True)
class Tally:
    seen_after_s: list[float] = field(default_factory=list)
    never: int = 0
    add_failures: int = 0
    withdrawn: int = 0
    violations: int = 0
    probes: int = 0


class World:
    """The world's items as the catalog call takes them: twins of any of them."""

    def __init__(self, world: Path) -> None:
        schema = load_schema()
        with np.load(world / ITEMS_FILE) as stored:
            self.ids = stored["ids"].astype(str)
            self.vectors = stored["embeddings"].astype(np.float32)
            self.dense = stored["dense"].astype(np.float32)
            self.codes = stored["categories"].astype(np.int64)
        with np.load(world / ITEM_PRIOR_FILE) as stored:
            self.names = [str(name) for name in stored["category_names"].tolist()]
        self.at = {item: n for n, item in enumerate(self.ids.tolist())}
        self.dense_names = schema.item_dense

    def twin(self, item: str, new_id: str) -> dict[str, Any]:
        n = self.at[item]
        return {
            "item_id": new_id,
            "title": f"Twin of {item}",
            "categories": [self.names[self.codes[n]]],
            "embedding": [float(v) for v in self.vectors[n]],
            "dense": dict(zip(self.dense_names, map(float, self.dense[n]), strict=True)),
        }


async def _feed(client: httpx.AsyncClient, user: str) -> list[str]:
    body = {"user_id": user, "num_items": 10, "context": CONTEXT}
    answer = await client.post("/recommend", json=body)
    answer.raise_for_status()
    return [item["item_id"] for item in answer.json()["items"]]


async def _pairs(client: httpx.AsyncClient, count: int) -> list[tuple[str, str]]:
    """(user, the item their feed puts first), for the first `count` users."""
    pairs = []
    for n in range(count):
        user = f"u{n}"
        pairs.append((user, (await _feed(client, user))[0]))
    return pairs


async def _withdraw(client: httpx.AsyncClient, user: str, twin: str, tally: Tally) -> None:
    gone = await client.post("/catalog/withdrawals", json={"item_ids": [twin]})
    if gone.status_code != 200:
        tally.add_failures += 1
        return
    tally.withdrawn += 1
    for _ in range(5):
        tally.probes += 1
        if twin in await _feed(client, user):
            tally.violations += 1
        await asyncio.sleep(PROBE_EVERY_S)


async def _add_and_follow(
    client: httpx.AsyncClient, world: World, pair: tuple[str, str], n: int, tally: Tally
) -> None:
    user, top = pair
    twin = f"twin-{n}"
    put = await client.post("/catalog/items", json={"items": [world.twin(top, twin)]})
    acknowledged = time.monotonic()
    if put.status_code != 200:
        tally.add_failures += 1
        return
    while time.monotonic() - acknowledged < GIVE_UP_S:
        tally.probes += 1
        if twin in await _feed(client, user):
            tally.seen_after_s.append(time.monotonic() - acknowledged)
            if n % 10 == 0:
                await _withdraw(client, user, twin, tally)
            return
        await asyncio.sleep(PROBE_EVERY_S)
    tally.never += 1


async def _adding(
    url: str, world: World, pairs: list[tuple[str, str]], adds: float, duration_s: float
) -> Tally:
    tally = Tally()
    tasks = []
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=10.0, limits=limits) as client:
        started = time.monotonic()
        for n, pair in enumerate(pairs):
            due = started + n / adds
            if due - started >= duration_s:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            tasks.append(asyncio.create_task(_add_and_follow(client, world, pair, n, tally)))
        await asyncio.gather(*tasks)
    return tally


def _quantile(values: list[float], q: float) -> float | None:
    return round(float(np.quantile(values, q)) * 1000.0, 1) if values else None


async def _measure(url: str, world: World, adds: float, rate: float, duration_s: float) -> Any:
    count = int(adds * duration_s)
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        pairs = await _pairs(client, count)
    background = run(Load(f"{url}/recommend", demo_bodies(20_000, 20)), rate, duration_s)
    loaded, tally = await asyncio.gather(background, _adding(url, world, pairs, adds, duration_s))
    return summarize(loaded), tally


def measure(world_dir: Path, adds: float, rate: float, duration_s: float) -> dict[str, Any]:
    world = World(world_dir)
    options = stack_options(world_dir)
    headroom = str(int(adds * duration_s) + 1000)
    with (
        local_stack(options) as stack,
        api_on(stack, options.run_dir / "api-latency.log", catalog_headroom=headroom) as api,
    ):
        summary, tally = asyncio.run(_measure(api.url, world, adds, rate, duration_s))
    seen = tally.seen_after_s
    return {
        "adds_per_s": adds,
        "background_rate": rate,
        "duration_s": duration_s,
        "added": len(seen) + tally.never,
        "ack_to_answer_ms": {
            "p50": _quantile(seen, 0.5),
            "p99": _quantile(seen, 0.99),
            "max": _quantile(seen, 1.0),
        },
        "never_seen_within_10s": tally.never,
        "failed_calls": tally.add_failures,
        "withdrawn": tally.withdrawn,
        "answers_after_withdrawal_holding_it": tally.violations,
        "probes": tally.probes,
        "background": {
            "requests": summary.requests,
            "ok": summary.ok,
            "p50_ms": summary.latency.p50_ms,
            "p99_ms": summary.latency.p99_ms,
        },
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--adds", type=float, default=100.0, help="items added a second")
    parser.add_argument("--rate", type=float, default=200.0, help="background requests/s")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    figures = measure(args.world, args.adds, args.rate, args.duration)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "catalog_latency", figures)


if __name__ == "__main__":
    main()
