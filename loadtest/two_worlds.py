"""Two worlds on one API under steady load: what loading, rolling back and promoting a
candidate world cost the answers, and what the second world takes in memory against the
estimate the service checks before loading it.

    python -m loadtest.two_worlds [--rate 100] [--out docs/benchmarks.json]

The demo world (100,000 items) serves; a second demo world of the same size (another seed)
is loaded into the same Redis under `recsys-b` and into the same Triton under its own model
name. While an open-loop client offers `--rate` requests a second, the candidate is loaded
for 10% of users, rolled back, loaded again and promoted, through /admin/worlds. Per phase:
answers, failures (anything but a 200), degraded answers, p50 and p99; and the API's
resident memory before and after the candidate loaded, beside the estimate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from recsys_tools.demo import StackOptions, ensure_world, prepare_model_repository
from recsys_tools.localstack import default_triton_env, project_root, start_redis, start_triton
from recsys_tools.world.recipes.demo import DEMO, build_demo_world
from recsys_tools.world.store.identity import install_model, model_beside
from recsys_tools.world.store.redis_loader import load_world_into_redis

from app.release.keyspace import KeySpace
from app.world.schema import load_schema
from loadtest.openloop import Load, demo_bodies, run
from loadtest.openloop.request import Record
from loadtest.openloop.stats import latency_of
from loadtest.record import record
from loadtest.service import ApiProcess, start_api

TOKEN = "two-worlds-benchmark-token"
MODEL_B = "ranking_model_b"
# Seconds into the run of each change, and the run's length.
PLAN = (("load", 10.0), ("rollback", 25.0), ("load", 35.0), ("promote", 50.0))
DURATION_S = 65.0


def _repository(folder: Path, world_a: Path, world_b: Path, model: str) -> Path:
    options = StackOptions(world_a, project_root() / "model_repository", folder)
    repository = prepare_model_repository(options, model)
    model_beside(repository, model, MODEL_B)
    install_model(world_b, repository, MODEL_B)
    return repository


async def _changes(api: ApiProcess, world_b: Path, started: float) -> list[dict[str, Any]]:
    """The plan's changes at their times; each one's answer, time taken and the RSS after."""
    done = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    candidate = {"artifacts_dir": str(world_b), "key_prefix": "recsys-b", "model_name": MODEL_B}
    async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=120.0) as client:
        for verb, at in PLAN:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            rss_before = api.rss_bytes()
            began = time.monotonic()
            if verb == "load":
                response = await client.post(
                    "/admin/worlds/candidate", json={**candidate, "percent": 10.0}
                )
            else:
                response = await client.post(f"/admin/worlds/{verb}")
            took = time.monotonic() - began
            response.raise_for_status()
            await asyncio.sleep(3.0)  # a retired world closes after its requests' budget
            done.append(
                {
                    "change": verb,
                    "at_s": round(began - started, 1),
                    "took_s": round(took, 2),
                    "state": response.json(),
                    "rss_before_mb": round(rss_before / 2**20, 1),
                    "rss_after_mb": round(api.rss_bytes() / 2**20, 1),
                }
            )
    return done


def _phase(records: list[Record], start: float, end: float) -> dict[str, Any]:
    mine = [r for r in records if start <= r.scheduled < end]
    ok = [r for r in mine if r.status == 200]
    latency = latency_of([r.latency for r in mine if r.status])
    return {
        "from_s": round(start, 1),
        "to_s": round(end, 1),
        "requests": len(mine),
        "failed": len(mine) - len(ok),
        "degraded": sum(r.degraded for r in ok),
        "p50_ms": latency.p50_ms,
        "p99_ms": latency.p99_ms,
    }


async def _measure(api: ApiProcess, world_b: Path, rate: float) -> dict[str, Any]:
    load = Load(f"{api.url}/recommend", demo_bodies(20_000, 20), timeout_s=5.0)
    await run(load, rate, 3.0)  # warm
    started = time.monotonic() + 0.5
    changes = asyncio.create_task(_changes(api, world_b, started))
    result = await run(load, rate, DURATION_S, start_at=started)
    done = await changes
    bounds = [0.0, *(change["at_s"] for change in done), DURATION_S]
    names = ["one world", *(f"after {change['change']}" for change in done)]
    phases = {
        f"{n}. {name}": _phase(result.records, bounds[n], bounds[n + 1])
        for n, name in enumerate(names)
    }
    return {"changes": done, "phases": phases}


def measure(folder: Path, rate: float) -> dict[str, Any]:
    world_a = project_root() / "var" / "world"
    ensure_world(world_a)
    world_b = folder / "world-b"
    started = time.perf_counter()
    build_demo_world(world_b, load_schema(), DEMO, seed=8)
    build_b_s = time.perf_counter() - started
    schema = load_schema()
    repository = _repository(folder, world_a, world_b, schema.model_name)
    redis_process, redis_url = start_redis(folder / "redis")
    try:
        client = redis.Redis.from_url(redis_url)
        load_world_into_redis(world_a, client, schema, KeySpace("recsys"))
        load_world_into_redis(world_b, client, schema, KeySpace("recsys-b"))
        client.close()
        triton, triton_url = start_triton(
            default_triton_env(), repository, folder / "triton", [schema.model_name, MODEL_B]
        )
        try:
            env = {
                "RECSYS_REDIS_URL": redis_url,
                "RECSYS_TRITON_URL": triton_url,
                "RECSYS_ARTIFACTS_DIR": str(world_a),
                "RECSYS_WORLDS_FILE": str(folder / "worlds.toml"),
                "RECSYS_ADMIN_TOKEN": TOKEN,
            }
            api = start_api(env, folder / "api.log")
            try:
                figures = asyncio.run(_measure(api, world_b, rate))
            finally:
                api.stop()
        finally:
            triton.stop()
    finally:
        redis_process.stop()
    first = figures["changes"][0]
    grown = first["rss_after_mb"] - first["rss_before_mb"]
    estimate = first["state"]["memory_bytes"] / 2**20
    return {
        "command": "python -m loadtest.two_worlds",
        "rate": rate,
        "duration_s": DURATION_S,
        "world_b_build_s": round(build_b_s, 1),
        "candidate_memory": {
            "estimate_mb": round(estimate, 1),
            "rss_growth_mb": round(grown, 1),
            "growth_over_estimate": round(grown / estimate, 2) if estimate else None,
        },
        **figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=None, help="merge the figures into this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(Path(folder), args.rate)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "two_worlds", figures)


if __name__ == "__main__":
    main()
