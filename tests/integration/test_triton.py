"""What Triton itself reports about the service's calls, how its queue policy sheds load, and
readiness when the model goes away."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest
import tritonclient.grpc.aio as triton_grpc
from httpx import AsyncClient
from prometheus_client.parser import text_string_to_metric_families
from recsys_tools.localstack import default_triton_env, start_triton
from tritonclient.utils import InferenceServerException

from app.clients.breaker import CircuitBreaker
from app.clients.ranking_model import (
    CHANNEL_ARGS,
    RankingModelClient,
    connect_triton,
    late_answer_s,
)
from app.core.errors import FailureKind, RankingModelError
from app.release.plan import Routed
from tests.integration.conftest import CONTEXT, TEST_MAX_BATCH, Stack, serving
from tests.integration.models import slow_model_repository

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
MODEL = "ranking_model"
SLOW_MS = 200
# How many times a test may send its requests again when the machine sent them out of order.
ORDER_TRIES = 3


async def _statistics(triton: triton_grpc.InferenceServerClient) -> dict[str, Any]:
    """Triton's statistics once they stand still: chunks an earlier test left queued (its
    caller gave up on them, on a busy machine) are counted before, not during, this one."""
    previous: dict[str, Any] | None = None
    for _ in range(50):
        stats = await triton.get_inference_statistics(MODEL, as_json=True)
        current: dict[str, Any] = stats["model_stats"][0]
        if previous is not None and current.get("inference_count") == previous.get(
            "inference_count"
        ):
            return current
        previous = current
        # Longer than the slow model's execution: one still under way is seen finishing.
        await asyncio.sleep(0.3)
    raise AssertionError("Triton kept inferring for 15 s")


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
    assert rows == 500  # what pre-rank keeps of the pool, by default
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


@pytest.fixture(scope="module")
def slow_triton(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """This module's own Triton, serving the slow ranking model, with explicit model control
    (the session stack's Triton has none, so its model cannot be unloaded)."""
    root = tmp_path_factory.mktemp("slow-triton")
    onnx = stack.model_repository / MODEL / "1" / "model.onnx"
    repository = slow_model_repository(root / "models", onnx, SLOW_MS, TEST_MAX_BATCH)
    process, url = start_triton(
        default_triton_env(), repository, root / "triton", [MODEL], model_control=True
    )
    try:
        yield url
    finally:
        process.stop()


def _features(rows: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).random((rows, 121), dtype=np.float32)


async def _infer(
    triton: triton_grpc.InferenceServerClient, rows: npt.NDArray[np.float32], **kwargs: Any
) -> npt.NDArray[np.float32]:
    features = triton_grpc.InferInput("features", list(rows.shape), "FP32")
    features.set_data_from_numpy(rows)
    result = await triton.infer(MODEL, [features], client_timeout=10.0, **kwargs)
    scores: npt.NDArray[np.float32] = result.as_numpy("score")
    return scores


async def _outcome(
    triton: triton_grpc.InferenceServerClient, rows: npt.NDArray[np.float32], **kwargs: Any
) -> tuple[str, str]:
    """("OK", "") or the status and message Triton answered with."""
    try:
        await _infer(triton, rows, **kwargs)
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    return "OK", ""


async def test_the_slow_model_answers_valid_scores_after_its_delay(
    stack: Stack, slow_triton: str
) -> None:
    rows = _features(64)
    session = ort.InferenceSession(str(stack.model_repository / MODEL / "1" / "model.onnx"))
    expected = session.run(["score"], {session.get_inputs()[0].name: rows})[0].reshape(-1, 1)
    triton = triton_grpc.InferenceServerClient(slow_triton)
    try:
        started = time.monotonic()
        scores = await _infer(triton, rows, request_id="slow-1")
        elapsed = time.monotonic() - started
    finally:
        await triton.close()
    assert elapsed >= SLOW_MS / 1000
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


async def test_triton_rejects_a_request_whose_queue_timeout_passed(slow_triton: str) -> None:
    triton = triton_grpc.InferenceServerClient(slow_triton)
    try:
        # The channel connected first: the first request below goes out at once, not after
        # a connection a loaded machine may take a hundred ms or more to make.
        assert await triton.is_server_ready()
        for _ in range(ORDER_TRIES):
            busy = asyncio.create_task(_outcome(triton, _features(8)))
            # Half the slow model's time: the first request now holds the only model
            # instance, and still will when the second's 50 ms in the queue have passed.
            await asyncio.sleep(SLOW_MS / 2000)
            # The service passes its remaining deadline in microseconds, as here.
            late = await _outcome(triton, _features(8), timeout=50_000, request_id="late-1")
            first = await busy
            # Only if the machine held the first request back past the second one did the
            # second reach the instance (and the first time out behind it): the order this
            # test needs was not made, so it is made again.
            if late != ("OK", ""):
                break
    finally:
        await triton.close()
    assert first == ("OK", "")
    assert late == ("StatusCode.UNAVAILABLE", "Request timeout expired")


async def test_triton_rejects_requests_beyond_its_queue_at_once(slow_triton: str) -> None:
    triton = triton_grpc.InferenceServerClient(slow_triton)
    try:
        config = await triton.get_model_config(MODEL, as_json=True)
        queue = int(config["config"]["dynamic_batching"]["default_queue_policy"]["max_queue_size"])
        rows = _features(8)
        # One or two execute, up to `queue` wait (and time out behind them), the rest find
        # the queue full and are answered at once. Twice the queue keeps it full even when a
        # busy machine takes a while to send the burst.
        burst = [_outcome(triton, rows, request_id=f"burst-{i}") for i in range(2 * queue)]
        outcomes = await asyncio.gather(*burst)
    finally:
        await triton.close()
    full = [m for _, m in outcomes if m.endswith("Exceeds maximum queue size")]
    assert full
    assert all(m.startswith("[request id: burst-") for m in full)
    messages = Counter(m for s, m in outcomes if s != "OK")
    assert set(messages) == {"Request timeout expired", *full}
    assert {s for s, _ in outcomes} == {"OK", "StatusCode.UNAVAILABLE"}


async def test_a_call_given_up_on_is_not_cancelled_but_answered(slow_triton: str) -> None:
    """The caller stops waiting at its timeout; the call stays out until Triton answers it.

    Cancelling it instead sends Triton a cancellation that may meet the answer on its way
    out: Triton 2.51 (the local one) can die of that race on a busy machine.
    """
    breaker = CircuitBreaker("triton", failures=5, open_s=1.0)
    learnt = connect_triton(slow_triton, MODEL, "", breaker)
    # Ten times the model's delay to answer, however busy the machine: this test is about the
    # caller letting go, not about the grace.
    channel = triton_grpc.InferenceServerClient(slow_triton, channel_args=CHANNEL_ARGS)
    endpoint = RankingModelClient(channel, MODEL, "", breaker, late_answer_s=SLOW_MS / 100)
    triton = triton_grpc.InferenceServerClient(slow_triton)
    try:
        await learnt.ready_signature(5.0)
        version = (await triton.get_server_metadata(as_json=True))["version"]
        assert learnt.late_answer_s == late_answer_s(version)  # LATE_ANSWER_S on 2.51
        routed = Routed("", await endpoint.ready_signature(5.0))
        before = await _statistics(triton)
        with pytest.raises(RankingModelError) as raised:
            # A tenth of the model's delay: given up on long before it can answer.
            await endpoint.score(_features(8), routed, SLOW_MS / 10_000, "given-up-1")
        assert raised.value.kind is FailureKind.TIMEOUT
        assert endpoint.calls_out == 1
        for _ in range(100):
            if not endpoint.calls_out:
                break
            await asyncio.sleep(0.05)
        assert endpoint.calls_out == 0
        after = await _statistics(triton)
    finally:
        await learnt.close()
        await endpoint.close()
        await triton.close()
    # Triton answered it (computed, or refused once its queue timeout passed on a busy
    # machine): either way the answer, not a cancellation, ended the call.
    answered = sum(
        int(after["inference_stats"][kind].get("count", 0))
        - int(before["inference_stats"][kind].get("count", 0))
        for kind in ("success", "fail")
    )
    assert answered == 1


async def test_readyz_names_triton_when_its_model_is_unloaded(
    stack: Stack, slow_triton: str
) -> None:
    async with serving(stack.settings(triton_url=slow_triton)) as client:
        ready = await _wait_for_readiness(client, 200)
        assert ready["checks"]["triton"] is True
        assert all(ready["checks"].values())
        triton = triton_grpc.InferenceServerClient(slow_triton)
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
            answer = response.json()
            assert answer["degraded"] == ["rank:unavailable"]
            assert len(answer["items"]) == 10
            # No version scored it: the field says so with a null, as the schema requires.
            assert answer["model"] == {"name": MODEL, "version": None, "variant": "fallback"}
            assert "timings_ms" not in answer
        finally:
            await triton.load_model(MODEL)
            await triton.close()
        await _wait_for_readiness(client, 200)
