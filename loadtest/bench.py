"""The request path's cost against the model's own: `make bench`.

Starts the local stack on a world (Redis, Triton, the API as its own process) and measures,
side by side in one run:
- CPU milliseconds per request of the API, Redis and Triton (with its backend stubs), at a
  steady open-loop rate;
- the highest open-loop rate whose p99 stays within the bound with every answer a 200 and at
  most 1% degraded, stepping the rate up;
- the orchestration overhead: a request's own latency minus its recall and rank stages
  (sequential requests, from the answers' debug timings), p50;
- Triton alone on the same model with as many rows per request (perf_analyzer, fetched by
  loadtest/tools/perf-analyzer), and the ratio of the two rates;
- during the steady run, each stage's latency (the service's histograms) and Triton's own
  statistics (queue and compute time, rows and requests per execution);
- the API's resident memory against the data it holds;
- at 100 candidates, requests/s with 4 connections in a closed loop (a second API process
  on the same stack).
- with 4 connections in a closed loop, requests/s (the form peers publish figures in);
- what tracing costs: the API's CPU per request with the debug pages off, at 1% and at 100%
  of requests traced (loadtest/trace_cost.py), each its own API process, rounds interleaved.
With --out X.json, the JSON goes there and the plots into the folder X (loadtest/plots.py).

    python -m loadtest.bench                     # the demo world in var/world
    python -m loadtest.bench --settings item_features=off
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from app.release.artifacts import serving_artifacts
from app.release.catalog import load_catalog
from app.release.keyspace import KeySpace
from app.release.plan import ModelRouting, Routed
from app.release.rules import RerankRules
from app.world.layout import INDEX_FILE, ITEMS_FILE, MODEL_FILE
from app.world.schema import ModelSignature, world_schema
from loadtest.closedloop import closed_loop
from loadtest.cpu import Processes, cpu_per_request
from loadtest.observe import stage_deltas, stage_snapshot, triton_deltas, triton_snapshot
from loadtest.openloop import Load, demo_bodies, demo_users, run, sweep
from loadtest.plots import write_plots
from loadtest.record import record_top
from loadtest.service import ApiProcess, api_on, local_service
from loadtest.trace_cost import measure_trace_cost

log = logging.getLogger("loadtest.bench")
P99_BOUND_MS = 50.0
NUM_ITEMS = 20
SMALL_CANDIDATES = 100
CLOSED_LOOP_CONNECTIONS = 4


async def max_rate(
    load: Load,
    start: float,
    step: float,
    duration_s: float,
    *,
    max_steps: int = 30,
    warmup_s: float = 2.0,
) -> dict[str, Any]:
    """Raise the rate by `step` (a factor) while it passes; report the highest that did."""
    rate, points, best = start, [], None
    for _ in range(max_steps):
        result = await sweep(
            load, [rate], duration_s=duration_s, p99_ms=P99_BOUND_MS, warmup_s=warmup_s
        )
        point = result.points[0]
        points.append(
            {
                "rate": round(rate, 1),
                "passed": point.passed,
                "p50_ms": point.summary.latency.p50_ms,
                "p99_ms": point.summary.latency.p99_ms,
                "degraded_share": point.summary.degraded_share,
                "statuses": point.summary.statuses,
            }
        )
        if not point.passed:
            break
        best = rate
        rate *= step
    return {"max_rate_at_p99": round(best, 1) if best else None, "points": points}


PERF_ANALYZER = Path(__file__).parent / "tools" / "perf-analyzer"


def triton_alone(
    triton_url: str,
    model: str,
    rows: int,
    max_concurrency: int = 4,
    interval_ms: int = 2000,
    stability_percent: int = 10,
) -> dict[str, Any]:
    """Triton's own rate for requests of `rows` rows, by perf_analyzer, inside the p99 bound.

    perf_analyzer keeps `concurrency` requests in flight (a closed loop) at 1, 2, ...; the
    best rate among the levels whose p99 is within the bound is Triton alone's rate. The
    report has the same keys whatever happened: `points` is empty, and `error` says why,
    when perf_analyzer measured nothing (on a busy machine it may find no stable window).
    """
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "perf.csv"
        argv = [
            str(PERF_ANALYZER),
            *("-m", model, "-u", triton_url, "-i", "grpc", "-b", str(rows)),
            *("--concurrency-range", f"1:{max_concurrency}"),
            *("--measurement-interval", str(interval_ms), "--percentile", "99"),
            *("--max-trials", "20", "--stability-percentage", str(stability_percent)),
            *("-f", str(report)),
        ]
        env = {**os.environ, "PYTHON": sys.executable}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0 or not report.exists():
            # On a busy machine it may find no stable window; the rest of the run still
            # stands, so this figure is reported missing rather than the run lost.
            why = (done.stdout + done.stderr).strip().splitlines()[-2:]
            log.warning("perf_analyzer measured nothing: %s", " / ".join(why))
            return {"triton_alone_max_rate_at_p99": None, "rows": rows, "points": [], "error": why}
        levels = list(csv.DictReader(report.open()))
    if len(levels) < max_concurrency:
        log.warning("perf_analyzer measured %d levels only:\n%s", len(levels), done.stdout[-3000:])
    points = [
        {
            "concurrency": int(level["Concurrency"]),
            "requests_per_s": round(float(level["Inferences/Second"]) / rows, 1),
            "p99_ms": round(float(level["p99 latency"]) / 1000.0, 2),
        }
        for level in levels
    ]
    inside = [point["requests_per_s"] for point in points if point["p99_ms"] <= P99_BOUND_MS]
    return {
        "triton_alone_max_rate_at_p99": max(inside, default=None),
        "rows": rows,
        "points": points,
        "error": None,
    }


async def overhead_p50(url: str, requests: int, users: int, seed: int = 0) -> dict[str, float]:
    """Latency minus recall minus rank, per sequential request, from debug timings.

    Sent on one keep-alive connection by the loop's own lean client: a general-purpose
    HTTP client spends about as long per request as the overhead being measured.
    """
    rng = random.Random(seed)
    bodies = [
        json.dumps(
            {"user_id": f"u{rng.randrange(users)}", "num_items": NUM_ITEMS, "debug": True}
        ).encode()
        for _ in range(requests)
    ]
    load = Load(f"{url}/recommend", bodies, timeout_s=5.0)
    result = await closed_loop(load, 1, 3600.0, max_requests=requests, keep_answers=True)
    overheads, latencies = [], []
    for seconds, body in result.answers:
        timings = json.loads(body)["timings_ms"]
        latencies.append(seconds * 1000.0)
        overheads.append(seconds * 1000.0 - timings["recall"] - timings["rank"])
    return {
        "overhead_p50_ms": round(statistics.median(overheads), 3),
        "sequential_p50_ms": round(statistics.median(latencies), 3),
    }


def model_flops_per_row(model: Path) -> int:
    """Multiply-adds times two of the model's dense layers (MatMul and Gemm on a weight
    matrix), per row: what one candidate costs the model, whatever it runs on."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(model)).graph
    weights = {init.name: numpy_helper.to_array(init).shape for init in graph.initializer}
    flops = 0
    for node in graph.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1:
            shape = weights.get(node.input[1])
            if shape is not None and len(shape) == 2:
                flops += 2 * int(shape[0]) * int(shape[1])
    return flops


def held_data_bytes(world: Path) -> int:
    """What the API holds of the world: the catalog's arrays, the index and item features.

    Built the way the service builds them, so the count follows the service's own layout.
    """
    schema = world_schema(world, None)
    catalog = load_catalog(world, schema, nprobe=1)
    signature = ModelSignature("m", "1", "x", "FP32", (-1, schema.width), "y", "FP32", 1)
    routing = ModelRouting(Routed("", signature))
    held = serving_artifacts(schema, catalog, RerankRules(), routing, KeySpace("recsys"))
    arrays = [
        catalog.item_ids,
        catalog.categories,
        catalog.published_at,
        catalog.popular_order,
        held.item_keys,
        held.blocked,
        held.popular,
        held.id_order,
    ]
    if catalog.vectors is not None:  # pre-rank's item vectors
        arrays.append(catalog.vectors)
    for neighbours in (catalog.neighbours, catalog.page_neighbours):
        if neighbours is not None:
            arrays.extend([neighbours.positions, neighbours.similarity])
    item_features = catalog.size * (schema.item_blob_width * 4 + 1)  # matrix + usable flags
    index_bytes = (world / INDEX_FILE).stat().st_size
    return sum(a.nbytes for a in arrays) + item_features + index_bytes


def memory_report(api: ApiProcess, world: Path) -> dict[str, float]:
    rss = api.rss_bytes()
    data = held_data_bytes(world)
    return {
        "api_rss_mb": round(rss / 2**20, 1),
        "held_data_mb": round(data / 2**20, 1),
        "rss_over_data": round(rss / data, 2),
    }


async def steady_run(
    load: Load, api: ApiProcess, processes: Processes, triton_url: str, args: argparse.Namespace
) -> dict[str, Any]:
    """CPU per request at a steady rate, with the stages' and Triton's view of the same run."""
    stages_before = stage_snapshot(api.url)
    triton_before = triton_snapshot(triton_url, args.model)
    cpu = await cpu_per_request(load, processes, args.cpu_rate, args.duration)
    cpu["stages"] = stage_deltas(stages_before, stage_snapshot(api.url))
    cpu["triton"] = triton_deltas(triton_before, triton_snapshot(triton_url, args.model))
    return cpu


async def measure(
    api: ApiProcess, processes: Processes, triton_url: str, args: argparse.Namespace
) -> dict[str, Any]:
    load = Load(f"{api.url}/recommend", demo_bodies(args.users, NUM_ITEMS), timeout_s=2.0)
    await run(load, 50, 2.0)  # warm the pools, channels and model
    cpu = await steady_run(load, api, processes, triton_url, args)
    rate = await max_rate(load, args.start_rate, args.step, args.duration)
    overhead = await overhead_p50(api.url, args.sequential, args.users)
    closed = await closed_loop(load, CLOSED_LOOP_CONNECTIONS, args.duration)
    alone = await asyncio.to_thread(
        triton_alone,
        triton_url,
        args.model,
        args.rows,
        stability_percent=args.stability_percent,
    )
    ratio = None
    if rate["max_rate_at_p99"] and alone["triton_alone_max_rate_at_p99"]:
        ratio = round(rate["max_rate_at_p99"] / alone["triton_alone_max_rate_at_p99"], 3)
    return {
        "api_cpu_ms_per_request": cpu["cpu_ms_per_request"]["api"],
        "max_rate_at_p99": rate["max_rate_at_p99"],
        "triton_alone_max_rate_at_p99": alone["triton_alone_max_rate_at_p99"],
        "rate_ratio": ratio,
        "p99_bound_ms": P99_BOUND_MS,
        "candidates": args.rows,
        "items": None,  # filled in by main, from the world
        **overhead,
        "cpu": cpu,
        "rate_steps": rate["points"],
        "triton_alone": alone,
        "closed_loop": {
            "connections": closed.connections,
            "requests_per_s": round(closed.requests_per_s, 1),
            "statuses": closed.statuses,
            "p50_ms": closed.latency.p50_ms,
            "p99_ms": closed.latency.p99_ms,
        },
        "memory": memory_report(api, args.world),
        "model": {
            "flops_per_row": model_flops_per_row(args.world / MODEL_FILE),
            "rows_per_request": args.rows,
        },
    }


async def rate_at_small_candidates(api: ApiProcess, args: argparse.Namespace) -> dict[str, Any]:
    """Requests/s at 100 candidates with 4 connections, each sending on an answer."""
    load = Load(f"{api.url}/recommend", demo_bodies(args.users, NUM_ITEMS), timeout_s=2.0)
    await closed_loop(load, CLOSED_LOOP_CONNECTIONS, 2.0)  # warm
    result = await closed_loop(load, CLOSED_LOOP_CONNECTIONS, args.duration)
    return {
        "rate_at_100_candidates": round(result.requests_per_s, 1),
        "connections": result.connections,
        "statuses": result.statuses,
        "degraded": result.degraded,
        "p50_ms": result.latency.p50_ms,
        "p99_ms": result.latency.p99_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--users", type=demo_users, default=20_000)
    parser.add_argument("--cpu-rate", type=float, default=100.0)
    parser.add_argument("--start-rate", type=float, default=100.0)
    parser.add_argument("--step", type=float, default=1.2)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument("--model", default="ranking_model")
    parser.add_argument(
        "--stability-percent",
        type=int,
        default=10,
        help="perf_analyzer's stability bound for Triton alone; a busy machine may need 30",
    )
    parser.add_argument(
        "--rows", type=int, default=500, help="rows per request: what pre-rank keeps"
    )
    parser.add_argument(
        "--trace-rounds",
        type=int,
        default=3,
        help="rounds of the API's CPU with tracing off, at 1%% and at 100%% (0: skip)",
    )
    parser.add_argument("--settings", nargs="*", default=[], help="NAME=VALUE for the API")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = dict(item.split("=", 1) for item in args.settings)
    small = {**settings, "candidate_count": str(SMALL_CANDIDATES), "popular_candidates": "0"}
    with local_service(args.world, **settings) as (api, stack):
        processes = Processes(api.pid, stack.redis.pid, stack.triton.pid)
        report = asyncio.run(measure(api, processes, stack.settings.triton_url, args))
        with api_on(stack, api.log_path.with_name("api-small.log"), **small) as small_api:
            at_small = asyncio.run(rate_at_small_candidates(small_api, args))
        if args.trace_rounds > 0:
            report["trace_cost"] = measure_trace_cost(
                stack,
                api.log_path.parent,
                args.cpu_rate,
                args.duration,
                args.users,
                args.trace_rounds,
            )
    report["rate_at_100_candidates"] = at_small.pop("rate_at_100_candidates")
    report["at_100_candidates"] = at_small
    with np.load(args.world / ITEMS_FILE) as items:
        report["items"] = len(items["ids"])
    report["settings"] = settings
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        # The other benchmarks' records (cascade, realtime, ...) share the file: kept.
        record_top(args.out, report)
        for path in write_plots(report, args.out.parent / args.out.stem):
            log.info("wrote %s", path)


if __name__ == "__main__":
    main()
