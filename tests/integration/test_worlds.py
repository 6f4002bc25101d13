"""One world at a time: a model, an index or Redis data from another world is refused.

The session stack serves its world; a second, tiny world stands for "another world".
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
import redis
from recsys_tools.localstack import ManagedProcess
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world

from app.core.errors import ConfigError
from app.core.metrics import ServiceMetrics
from app.process.services import READINESS_TTL_S, start_services
from app.world.layout import INDEX_FILE
from app.world.stamp import read_stamp
from tests.integration.conftest import Stack, load_redis, metric_samples, serving

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
OTHER = DemoSize(items=600, users=80, impressions=6000)


@pytest.fixture(scope="module")
def other_world(tmp_path_factory: pytest.TempPathFactory, stack: Stack) -> Path:
    world = tmp_path_factory.mktemp("other") / "world"
    build_demo_world(world, stack.schema, OTHER, seed=3)
    return world


def _world_id(world: Path) -> str:
    stamp = read_stamp(world)
    assert stamp is not None
    return stamp.world_id


async def test_redis_holding_another_world_is_refused(stack: Stack, other_world: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        await start_services(stack.settings(artifacts_dir=other_world), ServiceMetrics())
    message = str(refused.value)
    assert f"the data in Redis belongs to world {_world_id(stack.world)}" in message
    assert f"this service serves world {_world_id(other_world)}" in message
    assert "recsys load-redis" in message


async def test_a_model_from_another_world_is_refused(
    stack: Stack, other_world: Path, bare_redis: tuple[ManagedProcess, str]
) -> None:
    url = bare_redis[1]
    load_redis(url, other_world, stack.schema)
    settings = stack.settings(artifacts_dir=other_world, redis_url=url)
    with pytest.raises(ConfigError) as refused:
        await start_services(settings, ServiceMetrics())
    message = str(refused.value)
    assert "Triton model 'ranking_model'" in message
    assert f"belongs to world {_world_id(stack.world)}" in message
    assert "recsys install-model" in message


async def test_an_index_copied_from_another_world_is_refused(
    stack: Stack, other_world: Path, tmp_path: Path
) -> None:
    world = tmp_path / "world"
    shutil.copytree(stack.world, world)
    shutil.copyfile(other_world / INDEX_FILE, world / INDEX_FILE)
    with pytest.raises(ConfigError, match=r"index\.faiss does not belong to world"):
        await start_services(stack.settings(artifacts_dir=world), ServiceMetrics())


async def test_readiness_reports_redis_switching_worlds(
    stack: Stack, own_redis: tuple[ManagedProcess, str]
) -> None:
    url = own_redis[1]
    async with serving(stack.settings(redis_url=url)) as api:
        before = (await api.get("/readyz")).json()
        client = redis.Redis.from_url(url)
        client.hset("recsys:meta", "world_id", "another-world")
        client.close()
        await asyncio.sleep(READINESS_TTL_S)  # past what readiness learnt a moment ago
        after = await api.get("/readyz")
    assert before["checks"]["redis_world"] is True
    # Redis is shared by every instance: reported, not a reason to leave the rotation.
    assert after.status_code == 200
    assert after.json()["checks"]["redis_world"] is False
    assert after.json()["checks"]["model_world"] is True


async def test_a_flushed_redis_reads_as_holding_no_world_within_two_seconds(
    stack: Stack, own_redis: tuple[ManagedProcess, str]
) -> None:
    url = own_redis[1]
    cold = "recsys_cold_start_users_total{}"
    async with serving(stack.settings(redis_url=url)) as api:
        ready = (await api.get("/readyz")).json()
        samples = metric_samples((await api.get("/metrics")).text)
        assert ready["checks"]["redis_world"] is True
        assert samples["recsys_redis_world{state=served}"] == 1
        assert samples["recsys_redis_world{state=none}"] == 0
        cold_before = samples[cold]
        answered: list[tuple[float, int, bool]] = []
        stop = asyncio.Event()

        async def steady_load() -> None:
            sent = 0
            while not stop.is_set():
                body = {"user_id": f"u{sent % 40}", "num_items": 5}
                response = await api.post("/recommend", json=body)
                answered.append(
                    (time.monotonic(), response.status_code, response.json().get("cold_start"))
                )
                sent += 1

        load = asyncio.create_task(steady_load())
        await asyncio.sleep(0.3)
        client = redis.Redis.from_url(url)
        client.flushall()  # a restart without persistence, an operator's mistake
        client.close()
        flushed = time.monotonic()
        seen: dict[str, float | bool] = {}
        while time.monotonic() < flushed + 2.0:
            ready = (await api.get("/readyz")).json()
            samples = metric_samples((await api.get("/metrics")).text)
            seen = {
                "redis_world": ready["checks"]["redis_world"],
                "state_none": samples["recsys_redis_world{state=none}"],
                "state_served": samples["recsys_redis_world{state=served}"],
                "cold_starts": samples[cold] - cold_before,
            }
            if seen["redis_world"] is False and seen["state_none"] == 1 and seen["cold_starts"]:
                break
            await asyncio.sleep(0.1)
        said_at = time.monotonic() - flushed
        stop.set()
        await load
    assert seen == {
        "redis_world": False,
        "state_none": 1,
        "state_served": 0,
        "cold_starts": seen["cold_starts"],
    }, seen
    assert seen["cold_starts"] > 0
    assert said_at < 2.0
    # Nothing failed: the users are served as cold starts, flagged as such.
    assert {code for _, code, _ in answered} == {200}
    assert any(cold_start for at, _, cold_start in answered if at > flushed + 0.1)
