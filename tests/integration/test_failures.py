"""Start-up refusals, and a Redis that goes away under an in-process app."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import redis
from recsys_tools.localstack import ManagedProcess, leased_port

from app.clients.feature_store import WORLD_ID_FIELD
from app.core.errors import ConfigError, SchemaError, UnreachableError
from app.core.metrics import ServiceMetrics
from app.process.services import READINESS_TTL_S, start_services
from app.release.catalog import load_catalog
from app.release.keyspace import KeySpace
from app.world.layout import DEFAULT_USER_FILE, SCHEMA_FILE
from tests.integration.conftest import CONTEXT, Stack, serving

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_start_up_refuses_a_schema_the_model_does_not_take(
    stack: Stack, tmp_path: Path
) -> None:
    schema = json.loads(
        (Path(__file__).parents[2] / "app" / "defaults" / "feature_schema.json").read_text()
    )
    schema["context"]["locale"].append("fr")  # one column wider than the deployed model
    # The same world, but built for the wider schema: the model is what disagrees.
    world = tmp_path / "world"
    shutil.copytree(stack.world, world)
    (world / SCHEMA_FILE).write_text(json.dumps(schema))
    with pytest.raises(SchemaError, match="input width is 121, schema packs 122"):
        await start_services(stack.settings(artifacts_dir=world), ServiceMetrics())


async def test_start_up_refuses_a_schema_other_than_the_worlds_own(
    stack: Stack, tmp_path: Path
) -> None:
    schema = json.loads((stack.world / SCHEMA_FILE).read_text())
    schema["version"] += 1
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    with pytest.raises(ConfigError, match="differs from the world's own"):
        await start_services(stack.settings(feature_schema=path), ServiceMetrics())


async def test_start_up_refuses_a_missing_world(stack: Stack, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"items\.npz is missing"):
        await start_services(stack.settings(artifacts_dir=tmp_path), ServiceMetrics())


async def test_start_up_gives_up_on_an_absent_triton(stack: Stack) -> None:
    with leased_port() as port:
        settings = stack.settings(triton_url=f"127.0.0.1:{port}", startup_timeout_s=1.0)
        absent = r"did not serve a ready model.*RECSYS_TRITON_URL"
        with pytest.raises(UnreachableError, match=absent):
            await start_services(settings, ServiceMetrics())


@pytest.mark.parametrize(
    ("item_features", "degraded"),
    [
        ("off", ["features:unavailable", "fetch:unavailable"]),
        # Item features held in memory keep every candidate scored: only the user's fall back.
        ("full", ["features:unavailable"]),
    ],
)
async def test_a_lost_redis_degrades_the_answer(
    stack: Stack,
    own_redis: tuple[ManagedProcess, str],
    item_features: str,
    degraded: list[str],
) -> None:
    process, url = own_redis
    async with serving(
        stack.settings(redis_url=url, redis_timeout_ms=200, item_features=item_features)
    ) as api:
        process.stop()
        response = await api.post(
            "/recommend", json={"user_id": "u1", "num_items": 8, "context": CONTEXT}
        )
        ready = await api.get("/readyz")
        metrics = (await api.get("/metrics")).text
    assert response.status_code == 200
    answer = response.json()
    assert answer["degraded"] == degraded
    assert len(answer["items"]) == 8
    scored = [item for item in answer["items"] if item.get("score") is not None]
    assert len(scored) == (8 if item_features == "full" else 0)
    # Redis is shared by every instance: it degrades answers, not readiness.
    assert ready.status_code == 200
    assert ready.json()["checks"]["redis"] is False
    assert ready.json()["failing"] == []
    fetch_fell_back = 'recsys_degraded_total{reason="unavailable",stage="fetch"} 1.0' in metrics
    assert fetch_fell_back == (item_features == "off")
    assert 'recsys_requests_total{outcome="degraded"} 1.0' in metrics


async def test_a_default_user_blob_with_nan_is_refused(stack: Stack, tmp_path: Path) -> None:
    world = tmp_path / "world"
    shutil.copytree(stack.world, world)
    blob = np.load(world / DEFAULT_USER_FILE)
    blob[3] = np.nan
    np.save(world / DEFAULT_USER_FILE, blob)
    with pytest.raises(ConfigError, match="holds NaN or Inf"):
        load_catalog(world, stack.schema, nprobe=8)


async def test_a_layout_record_that_is_not_utf8_is_a_mismatch_not_a_crash(
    stack: Stack, own_redis: tuple[ManagedProcess, str]
) -> None:
    url = own_redis[1]
    async with serving(stack.settings(redis_url=url)) as api:
        client = redis.Redis.from_url(url)
        client.hset(KeySpace("recsys").meta, WORLD_ID_FIELD, b"\xff\xfe")
        client.close()
        await asyncio.sleep(READINESS_TTL_S)  # past what readiness learnt before
        ready = await api.get("/readyz")
    assert ready.status_code == 200  # Redis is reported, not deciding
    assert ready.json()["checks"]["redis_world"] is False
