"""What Triton itself reports about the service's calls, and readiness when it goes away."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import tritonclient.grpc.aio as triton_grpc
from httpx import AsyncClient
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import CONTEXT, TEST_MAX_BATCH, Stack

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
MODEL = "ranking_model"


async def _statistics(triton: triton_grpc.InferenceServerClient) -> dict[str, Any]:
    stats = await triton.get_inference_statistics(MODEL, as_json=True)
    model_stats: dict[str, Any] = stats["model_stats"][0]
    return model_stats


async def _rows_ranked(client: AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == "recsys_stage_candidates":
            for sample in family.samples:
                if sample.name.endswith("_sum") and sample.labels["stage"] == "rank":
                    return sample.value
    raise AssertionError("no rank candidates in /metrics")


async def test_triton_counts_every_candidate_in_chunks(stack: Stack, client: AsyncClient) -> None:
    triton = triton_grpc.InferenceServerClient(stack.triton_url)
    try:
        before, rows_before = await _statistics(triton), await _rows_ranked(client)
        response = await client.post(
            "/recommend", json={"user_id": "u4", "num_items": 10, "context": CONTEXT}
        )
        assert response.status_code == 200
        after, rows_after = await _statistics(triton), await _rows_ranked(client)
    finally:
        await triton.close()
    rows = rows_after - rows_before
    assert rows >= 1000  # the default candidate count
    inferences = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    assert inferences == rows
    requests = int(after["inference_stats"]["success"]["count"]) - int(
        before["inference_stats"]["success"].get("count", 0)
    )
    assert requests == -(-int(rows) // TEST_MAX_BATCH)
    assert all(int(batch["batch_size"]) <= TEST_MAX_BATCH for batch in after["batch_stats"])


async def _wait_for_readiness(client: AsyncClient, status: int) -> dict[str, Any]:
    for _ in range(100):
        response = await client.get("/readyz")
        if response.status_code == status:
            body: dict[str, Any] = response.json()
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz never answered {status}: {response.text}")


async def test_readyz_names_triton_when_its_model_is_unloaded(
    stack: Stack, client: AsyncClient
) -> None:
    ready = await _wait_for_readiness(client, 200)
    assert ready["checks"] == {"redis": True, "triton": True, "index": True, "schema": True}
    triton = triton_grpc.InferenceServerClient(stack.triton_url)
    try:
        await triton.unload_model(MODEL)
        not_ready = await _wait_for_readiness(client, 503)
        assert "triton" in not_ready["failing"]
        assert not_ready["checks"]["redis"] is True

        # Without the model the answer degrades to recall order; it does not fail.
        response = await client.post(
            "/recommend", json={"user_id": "u4", "num_items": 10, "context": CONTEXT}
        )
        assert response.status_code == 200
        assert response.json()["degraded"] == ["rank:unavailable"]
        assert len(response.json()["items"]) == 10
    finally:
        await triton.load_model(MODEL)
        await triton.close()
    await _wait_for_readiness(client, 200)
