"""A real redis-server and a real tritonserver, started once for the integration tests.

The world is small (a few thousand items) so it builds in seconds; everything else is what
the demo runs. Both servers are stopped by pid at the end, and the teardown checks that
nothing they started is left running.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import redis
from prometheus_client.parser import text_string_to_metric_families
from recsys_tools.localstack import (
    ManagedProcess,
    default_triton_env,
    group_alive,
    project_root,
    start_redis,
    start_triton,
)
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world
from recsys_tools.world.store.identity import install_model
from recsys_tools.world.store.redis_loader import load_world_into_redis

from app.core.settings import Settings
from app.main import create_app
from app.release.keyspace import KeySpace
from app.world.schema import FeatureSchema, load_schema

SMALL_WORLD = DemoSize(items=3000, users=400, impressions=30_000)
# Small enough that the 500 candidates pre-rank keeps go to Triton in several chunks.
TEST_MAX_BATCH = 256
PLAIN_RULES = "[diversity]\nmax_per_category = 0\n"
# Fixed context so scores can be recomputed exactly outside the service.
CONTEXT: dict[str, Any] = {
    "device": "mobile",
    "page": "home",
    "locale": "en-US",
    "hour": 10,
    "weekday": 2,
}


@dataclass(frozen=True)
class Stack:
    root: Path
    world: Path
    model_repository: Path
    redis_url: str
    triton_url: str
    schema: FeatureSchema
    plain_rules: Path

    def settings(self, **overrides: Any) -> Settings:
        here = {"redis_url": self.redis_url, "triton_url": self.triton_url}
        return in_process_settings(**{"artifacts_dir": self.world, **here, **overrides})


def in_process_settings(**overrides: Any) -> Settings:
    """Settings for an app served in-process (name the servers and the world in overrides)."""
    values: dict[str, Any] = {
        "startup_timeout_s": 5.0,
        # In-process apps share the event loop and the heap with the test, whose own work
        # (computing expected scores, a garbage collection of its large heap) would read
        # as the service running late; so does the session loop standing still while a
        # slow synchronous fixture sets up the next test, which reads as seconds of lag.
        # Budgets and shedding are tested on the API as its own process (test_faults,
        # test_overload) and in unit tests.
        "max_queue_ms": 600_000.0,
        "request_budget_ms": 2000.0,
        "redis_timeout_ms": 1000.0,
        "triton_timeout_ms": 1000.0,
    }
    values.update(overrides)
    return Settings(**values)


def _model_repository(root: Path, world: Path, schema: FeatureSchema) -> Path:
    source = project_root() / "model_repository" / schema.model_name
    target = root / "models" / schema.model_name
    (target / "1").mkdir(parents=True)
    config = (source / "config.pbtxt").read_text()
    assert "max_batch_size: 2048" in config
    (target / "config.pbtxt").write_text(
        config.replace("max_batch_size: 2048", f"max_batch_size: {TEST_MAX_BATCH}")
    )
    shutil.copyfile(source / "1" / "model.py", target / "1" / "model.py")
    install_model(world, root / "models", schema.model_name)
    return root / "models"


def load_redis(url: str, world: Path, schema: FeatureSchema) -> None:
    client = redis.Redis.from_url(url)
    try:
        load_world_into_redis(world, client, schema, KeySpace("recsys"))
    finally:
        client.close()


@pytest.fixture
def bare_redis(tmp_path: Path) -> Iterator[tuple[ManagedProcess, str]]:
    """A redis-server of the test's own, empty, that it may freeze, kill or restart; stopped
    (by pid) whatever the test did to it."""
    # Its own folder: a test may start another Redis in tmp_path / "redis".
    process, url = start_redis(tmp_path / "own-redis")
    try:
        yield process, url
    finally:
        process.stop()


@pytest.fixture
def own_redis(stack: Stack, bare_redis: tuple[ManagedProcess, str]) -> tuple[ManagedProcess, str]:
    """bare_redis with the stack's world loaded, as the shared one holds it."""
    load_redis(bare_redis[1], stack.world, stack.schema)
    return bare_redis


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stack")
    schema = load_schema()
    world = root / "world"
    build_demo_world(world, schema, SMALL_WORLD, seed=11)
    repository = _model_repository(root, world, schema)
    plain_rules = root / "plain-rules.toml"
    plain_rules.write_text(PLAIN_RULES)
    started: list[ManagedProcess] = []
    try:
        redis_process, redis_url = start_redis(root / "redis")
        started.append(redis_process)
        load_redis(redis_url, world, schema)
        triton_process, triton_url = start_triton(
            default_triton_env(), repository, root / "triton", [schema.model_name]
        )
        started.append(triton_process)
        yield Stack(root, world, repository, redis_url, triton_url, schema, plain_rules)
    finally:
        for process in started:
            process.stop()
    leftovers = [p.name for p in started if group_alive(p.pid)]
    assert not leftovers, f"still running after stop: {leftovers}"


@pytest.fixture
def loaded_redis(own_redis: tuple[ManagedProcess, str]) -> str:
    """own_redis's URL, for a test that never stops it."""
    return own_redis[1]


def metric_samples(text: str) -> dict[str, float]:
    """The exposition's samples by `name{label=value,...}`, labels sorted."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan run, reached in-process over ASGI."""
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://recsys.test"
        ) as client,
    ):
        yield client


@pytest.fixture
def own_triton(stack: Stack, tmp_path: Path) -> Iterator[tuple[ManagedProcess, str]]:
    process, url = start_triton(
        default_triton_env(), stack.model_repository, tmp_path / "triton", [stack.schema.model_name]
    )
    try:
        yield process, url
    finally:
        process.stop()


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(stack.settings()) as api:
        yield api


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def plain_client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """Rules off and every catalog item a candidate, and pre-rank keeping them all: the
    answer is the model's own top N."""
    settings = stack.settings(rules_file=stack.plain_rules, candidate_count=5000, prerank_keep=5000)
    async with serving(settings) as api:
        yield api
