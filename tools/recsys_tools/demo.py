"""`recsys demo`: the service on its demo world, with a real local Redis and Triton."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
import redis
import uvicorn

from app.catalog import MODEL_FILE
from app.clients.feature_store import KeySpace
from app.main import create_app
from app.schema import load_schema
from app.settings import Settings
from recsys_tools.localstack import (
    ManagedProcess,
    TritonPorts,
    default_triton_env,
    free_port,
    project_root,
    start_redis,
    start_triton,
)
from recsys_tools.world.build import DEMO, build_demo_world, install_model
from recsys_tools.world.files import read_manifest
from recsys_tools.world.redis_loader import load_world_into_redis

log = logging.getLogger("recsys.demo")

EXAMPLE_REQUEST = {
    "user_id": "u42",
    "num_items": 10,
    "context": {"device": "mobile", "page": "home", "locale": "en-US"},
    "debug": True,
}


@dataclass(frozen=True, slots=True)
class StackOptions:
    world: Path
    model_repository: Path
    run_dir: Path


def ensure_world(world: Path) -> None:
    if (world / MODEL_FILE).is_file() and read_manifest(world).get("index_ntotal"):
        return
    log.info("building the demo world in %s (about a minute)", world)
    report = build_demo_world(world, load_schema(), DEMO)
    log.info("ranker AUC on held-out impressions: %s", report)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Unwind through the finally blocks that stop Redis and Triton.
    sys.exit(128 + signum)


def stack_options(world: Path) -> StackOptions:
    """Where the local stack keeps its model repository and its servers' files."""
    root = project_root()
    return StackOptions(world, root / "model_repository", root / "var" / "run")


@dataclass(frozen=True, slots=True)
class LocalStack:
    """The running servers, and the API settings that point at them."""

    settings: Settings
    redis: ManagedProcess
    triton: ManagedProcess


@contextmanager
def local_stack(options: StackOptions) -> Iterator[LocalStack]:
    """Build the world if absent, start Redis and Triton, load Redis; yield the stack."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    schema = load_schema()
    ensure_world(options.world)
    install_model(options.world, options.model_repository, schema.model_name)
    started: list[ManagedProcess] = []
    try:
        redis_process, redis_url = start_redis(options.run_dir / "redis")
        started.append(redis_process)
        client = redis.Redis.from_url(redis_url)
        report = load_world_into_redis(options.world, client, schema, KeySpace("recsys"))
        client.close()
        log.info("loaded %s into redis (pid %d)", report, redis_process.pid)
        ports = TritonPorts(grpc=free_port(), metrics=free_port())
        triton_process, triton_url = start_triton(
            default_triton_env(),
            options.model_repository,
            options.run_dir / "triton",
            [schema.model_name],
            ports,
        )
        started.append(triton_process)
        log.info(
            "triton (pid %d) serves %s over gRPC at %s, its metrics on :%d",
            triton_process.pid,
            schema.model_name,
            triton_url,
            ports.metrics,
        )
        settings = Settings(redis_url=redis_url, triton_url=triton_url, artifacts_dir=options.world)
        yield LocalStack(settings, redis_process, triton_process)
    finally:
        for process in reversed(started):
            process.stop()
        log.info("stopped %s", ", ".join(p.name for p in started) or "nothing")


async def _first_answer(client: httpx.AsyncClient) -> httpx.Response:
    """The example's answer once the service is ready, as a well-behaved client asks for it.

    This client shares the server's event loop, so its own work can make the service's
    admission control refuse it for a moment: it waits and asks again, as a 503 says to.
    """
    for _ in range(50):
        if (await client.get("/readyz")).status_code == 200:
            break
        await asyncio.sleep(0.1)
    answer = await client.post("/recommend", json=EXAMPLE_REQUEST)
    for _ in range(10):
        if answer.status_code != 503:
            break
        await asyncio.sleep(0.1)
        answer = await client.post("/recommend", json=EXAMPLE_REQUEST)
    return answer


async def _serve_and_show(settings: Settings) -> None:
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host=settings.host, port=settings.port)
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving
            raise RuntimeError("the API did not start")
        await asyncio.sleep(0.05)
    base = f"http://{settings.host}:{settings.port}"
    async with httpx.AsyncClient(base_url=base, timeout=10.0) as client:
        answer = await _first_answer(client)
    print(f"\nPOST {base}/recommend {json.dumps(EXAMPLE_REQUEST)}", flush=True)
    print(json.dumps(answer.json(), indent=2), flush=True)
    print(
        f"\nServing on {base} (metrics at {base}/metrics, readiness at {base}/readyz). "
        "Ctrl-C stops the API, Triton and Redis.\n",
        flush=True,
    )
    await serving


def run_demo(options: StackOptions, host: str, port: int) -> None:
    try:
        with local_stack(options) as stack:
            served = stack.settings.model_copy(update={"host": host, "port": port})
            asyncio.run(_serve_and_show(served))
    except KeyboardInterrupt:
        pass
