"""Per-stage latency of /recommend, one request at a time, from the service's own histograms.

Starts the local stack (Redis, Triton, the demo world) and the API as its own process, sends
sequential requests for random users, and reports each stage's p50 and p99 from the deltas of
`recsys_stage_duration_seconds`, beside the client-side request latency.

    python -m loadtest.stage_latency --requests 500
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import time
from pathlib import Path

import httpx

from app.core.vocabulary import Stage
from loadtest.histograms import quantile, scrape_buckets, subtract
from loadtest.openloop import demo_users
from loadtest.service import local_service

log = logging.getLogger("loadtest")


def _body(user: int, rng: random.Random) -> dict[str, object]:
    return {
        "user_id": f"u{user}",
        "num_items": 20,
        "context": {"device": rng.choice(["mobile", "desktop"]), "page": "home"},
    }


def measure(client: httpx.Client, requests: int, users: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    for _ in range(20):  # warm the channels, pools and caches before measuring
        client.post("/recommend", json=_body(rng.randrange(users), rng))
    before = client.get("/metrics").text
    latencies: list[float] = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.post("/recommend", json=_body(rng.randrange(users), rng))
        latencies.append((time.perf_counter() - started) * 1000.0)
        response.raise_for_status()
        if response.json()["degraded"]:
            raise RuntimeError(f"degraded answer: {response.json()['degraded']}")
    after = client.get("/metrics").text
    name = "recsys_stage_duration_seconds"
    stages = subtract(scrape_buckets(after, name, "stage"), scrape_buckets(before, name, "stage"))
    latencies.sort()
    return {
        "requests": requests,
        "stage_p50_ms": {s: round(quantile(stages[s], 0.5) * 1000, 3) for s in Stage},
        "stage_p99_ms": {s: round(quantile(stages[s], 0.99) * 1000, 3) for s in Stage},
        "client_p50_ms": round(statistics.median(latencies), 3),
        "client_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--users", type=demo_users, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with local_service(args.world) as (api, _):
        report = _measure_at(api.url, args)
    print(json.dumps(report, indent=2))


def _measure_at(url: str, args: argparse.Namespace) -> dict[str, object]:
    with httpx.Client(base_url=url, timeout=10.0) as client:
        return measure(client, args.requests, args.users, args.seed)


if __name__ == "__main__":
    main()
