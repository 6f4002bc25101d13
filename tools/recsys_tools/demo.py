"""`recsys demo`: the service on a world, with a real local Redis and Triton.

Any complete world is served as it is, with its own schema and model. Only a missing world,
or one the demo generated itself, is (re)built, as the synthetic demo world: a world that
was imported or built from interactions is never overwritten.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import numpy as np
import redis
import uvicorn

from app.cli import ensure_port_free
from app.core.errors import ConfigError, RecsysError
from app.core.settings import Settings, load_settings
from app.main import create_app
from app.release.keyspace import KeySpace
from app.world.layout import (
    ATTRIBUTES_FILE,
    DEFAULT_USER_FILE,
    INDEX_FILE,
    ITEMS_FILE,
    MODEL_FILE,
    USERS_FILE,
)
from app.world.manifest import read_manifest
from app.world.schema import load_schema, world_schema
from recsys_tools.demo_screen import answer_table, demo_logging, said_answer, said_training
from recsys_tools.localstack import (
    ManagedProcess,
    default_triton_env,
    project_root,
    start_ingest,
    start_redis,
    start_triton,
)
from recsys_tools.world.recipes.demo import DEMO, SYNTHETIC, build_demo_world
from recsys_tools.world.store.identity import CONFIG_FILE, install_model
from recsys_tools.world.store.redis_loader import load_world_into_redis

log = logging.getLogger("recsys.demo")

EXAMPLE_USER = "u42"  # a user of the synthetic demo world


def example_request(world: Path) -> dict[str, Any]:
    """The request the demo shows: the demo's user, or else the world's first known user,
    with the words the catalog holds for each item (a title, the categories)."""
    with np.load(world / USERS_FILE) as users:
        ids = users["ids"].astype(str)
    user = EXAMPLE_USER if EXAMPLE_USER in ids or len(ids) == 0 else str(ids[0])
    request: dict[str, Any] = {
        "user_id": user,
        "num_items": 10,
        "context": {"device": "mobile", "page": "home", "locale": "en-US"},
        "debug": True,
    }
    if (world / ATTRIBUTES_FILE).is_file():
        with np.load(world / ATTRIBUTES_FILE) as attributes:
            request["attributes"] = sorted(attributes.files)
    return request


@dataclass(frozen=True, slots=True)
class StackOptions:
    world: Path
    model_template: Path  # a Triton model repository whose configs the stack copies
    run_dir: Path

    @property
    def model_repository(self) -> Path:
        """The stack's own repository: the world's model under the template's config."""
        return self.run_dir / "model_repository"


WORLD_FILES = (ITEMS_FILE, USERS_FILE, INDEX_FILE, DEFAULT_USER_FILE, MODEL_FILE)


def _scores_log_odds(world: Path) -> bool:
    try:
        return world_schema(world, None).score_scale == "log_odds"
    except RecsysError:
        return False


def ensure_world(world: Path) -> None:
    """Serve a complete world as it is; build the demo world only where none or ours is."""
    missing = [name for name in WORLD_FILES if not (world / name).is_file()]
    source = read_manifest(world).source
    # A demo world built before titles were generated is built again, to show them; one
    # built before the score was a log-odds, to serve it.
    stale = source == SYNTHETIC and (
        not (world / ATTRIBUTES_FILE).is_file() or not _scores_log_odds(world)
    )
    if not missing and not stale:
        log.info("Serving the world in %s as it is.", world)
        return
    if world.is_dir() and any(world.iterdir()) and source != SYNTHETIC:
        raise ConfigError(
            f"{world} is not a complete world (no {', '.join(missing)}) and the demo did not "
            "build it, so it is left alone: build it (recsys build-world --world "
            f"{world} ...) or choose another --world"
        )
    log.info(
        "Building the demo world in %s: %s items, %s users, a ranker trained on %s "
        "impressions (about 20 s, once)...",
        world,
        f"{DEMO.items:,}",
        f"{DEMO.users:,}",
        f"{DEMO.impressions:,}",
    )
    started = time.monotonic()
    report = build_demo_world(world, load_schema(), DEMO)
    log.info("Built in %.0f s. %s", time.monotonic() - started, said_training(report))


def prepare_model_repository(options: StackOptions, model_name: str) -> Path:
    """A fresh repository in the run directory holding the world's model, under its id."""
    source = options.model_template / model_name
    if not (source / CONFIG_FILE).is_file():
        raise ConfigError(f"no model config at {source / CONFIG_FILE}")
    target = options.model_repository / model_name
    shutil.rmtree(options.model_repository, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", MODEL_FILE))
    install_model(options.world, options.model_repository, model_name)
    return options.model_repository


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
    ingest: ManagedProcess | None = None


@contextmanager
def local_stack(options: StackOptions, ingest: bool = False) -> Iterator[LocalStack]:
    """Build the world if absent, start Redis and Triton, load Redis, and with `ingest` the
    event consumer; yield the stack.

    Ctrl-C or SIGTERM at any moment stops whatever was started.
    """
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ensure_world(options.world)
    schema = world_schema(options.world, None)
    repository = prepare_model_repository(options, schema.model_name)
    started: list[ManagedProcess] = []
    try:
        redis_process, redis_url = start_redis(options.run_dir / "redis")
        started.append(redis_process)
        client = redis.Redis.from_url(redis_url)
        report = load_world_into_redis(options.world, client, schema, KeySpace("recsys"))
        client.close()
        log.info("Redis (pid %d) holds %s.", redis_process.pid, report.said())
        triton_process, triton_url = start_triton(
            default_triton_env(),
            repository,
            options.run_dir / "triton",
            [schema.model_name],
            metrics=True,
        )
        started.append(triton_process)
        log.info(
            "Triton (pid %d) serves %s over gRPC at %s, its metrics on port %d.",
            triton_process.pid,
            schema.model_name,
            triton_url,
            triton_process.ports["metrics"],
        )
        settings = load_settings(
            redis_url=redis_url, triton_url=triton_url, artifacts_dir=options.world
        )
        consumer = None
        if ingest:
            consumer = start_ingest(
                {
                    "RECSYS_REDIS_URL": redis_url,
                    "RECSYS_ARTIFACTS_DIR": str(options.world),
                    "RECSYS_EVENT_PARTITIONS": str(settings.event_partitions),
                },
                options.run_dir / "ingest",
            )
            started.append(consumer)
            log.info("recsys-ingest (pid %d) applies what POST /events receives.", consumer.pid)
        yield LocalStack(settings, redis_process, triton_process, consumer)
    finally:
        for process in reversed(started):
            process.stop()
        log.info("Stopped %s.", ", ".join(p.name for p in started) or "nothing")


async def _first_answer(
    client: httpx.AsyncClient, request: dict[str, Any]
) -> tuple[httpx.Response, float]:
    """The example's answer once the service is ready, as a well-behaved client asks for it.

    This client shares the server's event loop, so its own work can make the service's
    admission control refuse it for a moment: it waits and asks again, as a 503 says to.
    """
    for _ in range(50):
        if (await client.get("/readyz")).status_code == 200:
            break
        await asyncio.sleep(0.1)
    for _ in range(10):
        started = time.perf_counter()
        answer = await client.post("/recommend", json=request)
        elapsed_ms = (time.perf_counter() - started) * 1000
        if answer.status_code != 503:
            break
        await asyncio.sleep(0.1)
    return answer, elapsed_ms


async def _show_a_click(
    client: httpx.AsyncClient, request: dict[str, Any], item: str, title: str | None
) -> None:
    """Real time, shown: the user clicks the top item; their next answer no longer holds it."""
    event = {
        "event_id": "demo-click-1",
        "user_id": request["user_id"],
        "item_id": item,
        "type": "click",
    }
    posted = await client.post("/events", json={"events": [event]})
    log.info(
        "\nThe user clicks %s: POST /events answers %d.", _named(item, title), posted.status_code
    )
    started = time.monotonic()
    while time.monotonic() - started < 5.0:
        answer = await client.post("/recommend", json=request)
        items = [entry["item_id"] for entry in answer.json().get("items", [])]
        if item not in items:
            waited_ms = (time.monotonic() - started) * 1000
            log.info(
                "%.0f ms later their next answer no longer holds it (it is seen now) and "
                "begins with %s.",
                waited_ms,
                ", ".join(items[:5]),
            )
            return
        await asyncio.sleep(0.02)
    log.info("The click on %s had not reached the answer after 5 s.", item)


def _named(item: str, title: str | None) -> str:
    return f"{title} ({item})" if title else item


class _DemoServer(uvicorn.Server):
    """A server that ends quietly: the demo's own stack stops after it, in this process.

    uvicorn raises the signal that stopped it once more after shutting down, for whoever
    embeds it; here that would interrupt the event loop's last steps with a traceback.
    """

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn exits the process when start-up fails; here the stack must stop first.
        try:
            await super().serve(sockets)
        except SystemExit:
            self.should_exit = True

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def _serve_and_show(settings: Settings) -> None:
    request = example_request(settings.artifacts_dir)
    # log_config=None: uvicorn's lines go to the demo's log file with the rest.
    server = _DemoServer(
        uvicorn.Config(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            access_log=False,
            log_config=None,
        )
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving
            raise ConfigError("the API did not start: the line above says why")
        await asyncio.sleep(0.05)
    base = f"http://{settings.host}:{settings.port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10.0) as client:
            answer, elapsed_ms = await _first_answer(client, request)
    except httpx.HTTPError:
        if not server.should_exit:
            raise
        await serving  # stopped before the first answer: nothing to show
        return
    log.info("\nPOST %s/recommend %s", base, json.dumps(request))
    if answer.status_code != 200:
        log.info("%d: %s", answer.status_code, answer.text)
    else:
        body = answer.json()
        log.info("%s", "\n".join(answer_table(body)))
        log.info("%s", said_answer(body, elapsed_ms))
        if body["items"]:
            top = body["items"][0]
            title = (top.get("attributes") or {}).get("title")
            async with httpx.AsyncClient(base_url=base, timeout=10.0) as client:
                await _show_a_click(client, request, top["item_id"], title)
    log.info(
        "\nServing on %s: metrics at /metrics, readiness at /readyz, the API's own page at "
        "/docs; why each answer is what it is at %s/debug/. Ctrl-C stops the API, Triton "
        "and Redis.",
        base,
        base,
    )
    await serving


def run_demo(options: StackOptions, host: str | None, port: int | None) -> None:
    """Host and port: the flags, else RECSYS_HOST and RECSYS_PORT, else the defaults."""
    demo_logging(options.run_dir / "demo.log")
    log.info("The demo's full log: %s", options.run_dir / "demo.log")
    chosen = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    address = load_settings(**chosen)
    ensure_port_free(address.host, address.port)
    try:
        with local_stack(options, ingest=True) as stack:
            # The demo is the operator's own: its debug pages are on (on loopback only,
            # unless an admin token is set).
            update = {"host": address.host, "port": address.port, "debug_pages": True}
            served = stack.settings.model_copy(update=update)
            asyncio.run(_serve_and_show(served))
    except KeyboardInterrupt:
        log.info("interrupted")
