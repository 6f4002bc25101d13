"""From a catalog change's acknowledgement to the answers: how soon an added item is served,
and that a withdrawn one never is again, under load.

`python -m loadtest.catalog_latency [--world var/world] [--adds 100] [--rate 200]
[--probes 100] [--out docs/benchmarks.json]` serves the world on the local stack (real Redis
and Triton; the demo world by default) and, at once:

- offers `rate` /recommend a second, open loop, over the demo's users (the background);
- adds `adds` items a second, open loop, ten a call: twins of the world's items, new ids;
- probes, one at a time: adds the twin of the item some user's feed puts first (its vector,
  dense features and category: it suits that user), then, from the call's acknowledgement
  on, asks that user's feed every 20 ms until it holds the twin: the time to the first
  answer holding it is the figure (p50, p99). One probe in five then withdraws the twin and
  asks that feed five times: any answer begun after the acknowledgement holding it is a
  violation.

The background and the additions go through the open-loop runner (raw HTTP/1.1), so the
load generator costs little of the two cores the stack shares with it.
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

from app.world.layout import ITEM_PRIOR_FILE, ITEMS_FILE
from app.world.schema import load_schema
from loadtest.openloop import Load, Summary, demo_bodies, run, summarize
from loadtest.record import record
from loadtest.service import api_on

log = logging.getLogger("loadtest.catalog_latency")
PROBE_EVERY_S = 0.02
PER_CALL = 10
GIVE_UP_S = 10.0
CONTEXT = {"page": "home", "hour": 12, "weekday": 2}


@dataclass(slots=True)
class Tally:
    seen_after_s: list[float] = field(default_factory=list)
    never: int = 0
    withdrawn: int = 0
    violations: int = 0
    shed: int = 0  # probe answers the service refused (503): asked again


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

    def additions(self, calls: int, per_call: int) -> list[bytes]:
        """`calls` bodies of `per_call` new twins each, of items in turn."""
        bodies = []
        for call in range(calls):
            items = [
                self.twin(str(self.ids[(call * per_call + k) % len(self.ids)]), f"load-{call}-{k}")
                for k in range(per_call)
            ]
            bodies.append(json.dumps({"items": items}).encode())
        return bodies


async def _feed(client: httpx.AsyncClient, user: str) -> list[str] | None:
    """The user's feed; None where the service shed the request (503)."""
    body = {"user_id": user, "num_items": 10, "context": CONTEXT}
    answer = await client.post("/recommend", json=body)
    if answer.status_code == 503:
        return None
    answer.raise_for_status()
    return [item["item_id"] for item in answer.json()["items"]]


async def _holds(client: httpx.AsyncClient, user: str, item: str, tally: Tally) -> bool | None:
    answer = await _feed(client, user)
    if answer is None:
        tally.shed += 1
        return None
    return item in answer


async def _probe(client: httpx.AsyncClient, world: World, n: int, tally: Tally) -> None:
    user = f"u{n}"
    first = await _feed(client, user)
    # The feed's first world item (an item added before may lead it): the twin suits them.
    top = next((item for item in first or [] if item in world.at), None)
    if top is None:
        return
    twin = f"probe-{n}"
    put = await client.post("/catalog/items", json={"items": [world.twin(top, twin)]})
    put.raise_for_status()
    acknowledged = time.monotonic()
    while not await _holds(client, user, twin, tally):
        if time.monotonic() - acknowledged > GIVE_UP_S:
            tally.never += 1
            return
        await asyncio.sleep(PROBE_EVERY_S)
    tally.seen_after_s.append(time.monotonic() - acknowledged)
    if n % 5:
        return
    gone = await client.post("/catalog/withdrawals", json={"item_ids": [twin]})
    gone.raise_for_status()
    tally.withdrawn += 1
    for _ in range(5):
        tally.violations += bool(await _holds(client, user, twin, tally))


async def _probes(url: str, world: World, count: int) -> Tally:
    tally = Tally()
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        for n in range(count):
            await _probe(client, world, n, tally)
            await asyncio.sleep(0.1)
    return tally


async def _measure(
    url: str, world: World, adds: float, rate: float, probes: int
) -> tuple[Summary, Summary, Tally]:
    stop = asyncio.Event()
    background = Load(f"{url}/recommend", demo_bodies(20_000, 20), timeout_s=2.0)
    additions = Load(f"{url}/catalog/items", world.additions(int(adds / PER_CALL * 120), PER_CALL))
    loads = [
        asyncio.create_task(run(background, rate, 600, stop=stop)),
        asyncio.create_task(run(additions, adds / PER_CALL, 600, stop=stop)),
    ]
    await asyncio.sleep(2.0)
    try:
        tally = await _probes(url, world, probes)
    finally:
        stop.set()
        loaded, added = await asyncio.gather(*loads)
    return summarize(loaded), summarize(added), tally


def _quantile(values: list[float], q: float) -> float | None:
    return round(float(np.quantile(values, q)) * 1000.0, 1) if values else None


def measure(world_dir: Path, adds: float, rate: float, probes: int) -> dict[str, Any]:
    world = World(world_dir)
    options = stack_options(world_dir)
    # Ten minutes of additions at most, and the probes'.
    headroom = str(int(adds * 120) + probes + 1000)
    with (
        local_stack(options) as stack,
        api_on(stack, options.run_dir / "api-latency.log", catalog_headroom=headroom) as api,
    ):
        loaded, added, tally = asyncio.run(_measure(api.url, world, adds, rate, probes))
    seen = tally.seen_after_s
    return {
        "adds_per_s": adds,
        "items_a_call": PER_CALL,
        "background_rate": rate,
        "probes": probes,
        "ack_to_answer_ms": {
            "p50": _quantile(seen, 0.5),
            "p99": _quantile(seen, 0.99),
            "max": _quantile(seen, 1.0),
        },
        "never_seen_within_10s": tally.never,
        "withdrawn": tally.withdrawn,
        "answers_after_withdrawal_holding_it": tally.violations,
        "probe_answers_shed": tally.shed,
        "background": _summary(loaded),
        "additions": _summary(added),
    }


def _summary(summary: Summary) -> dict[str, Any]:
    return {
        "requests": summary.requests,
        "ok": summary.ok,
        "p50_ms": summary.latency.p50_ms,
        "p99_ms": summary.latency.p99_ms,
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--adds", type=float, default=100.0, help="items added a second")
    parser.add_argument("--rate", type=float, default=200.0, help="background requests/s")
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    figures = measure(args.world, args.adds, args.rate, args.probes)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "catalog_latency", figures)


if __name__ == "__main__":
    main()
