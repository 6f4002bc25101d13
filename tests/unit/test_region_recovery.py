"""A Triton that restarts forgets the shared-memory region; the client must not wait for it."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from tritonclient.utils import InferenceServerException

from app.clients.breaker import CircuitBreaker
from app.clients.ranking_model import RankingModelClient
from app.clients.registration import RETRY_S
from app.clients.shared_memory import InputSlots
from app.core.errors import FailureKind, RankingModelError
from app.release.plan import Routed
from app.world.schema import ModelSignature

SIGNATURE = ModelSignature("m", "1", "features", "FP32", (-1, 3), "score", "FP32", 8)
ROUTED = Routed("", SIGNATURE)
ROWS = np.ones((4, 3), dtype=np.float32)


class _Result:
    def __init__(self, rows: int) -> None:
        self._rows = rows

    def as_numpy(self, name: str) -> npt.NDArray[np.float32]:
        return np.full((self._rows, 1), 0.5, dtype=np.float32)

    def get_response(self) -> Any:
        class Response:
            model_version = "1"

        return Response()


class _Triton:
    """Holds regions the way Triton does: lost on a restart, refused while down."""

    def __init__(self) -> None:
        self.up = True
        self.regions: set[str] = set()
        self.sent: list[str] = []  # "shared" or "inline", one per inference that ran

    def restart(self) -> None:
        self.regions.clear()

    def _require_up(self) -> None:
        if not self.up:
            raise InferenceServerException("failed to connect", status="StatusCode.UNAVAILABLE")

    async def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0, **kwargs: Any
    ) -> None:
        self._require_up()
        if name in self.regions:
            raise InferenceServerException(
                f"shared memory region '{name}' already in manager",
                status="StatusCode.ALREADY_EXISTS",
            )
        self.regions.add(name)

    async def unregister_system_shared_memory(self, name: str = "", **kwargs: Any) -> None:
        self.regions.discard(name)

    async def close(self) -> None:
        pass

    async def infer(self, model_name: str, inputs: list[Any], **kwargs: Any) -> _Result:
        self._require_up()
        parameters = inputs[0]._get_tensor().parameters
        region = parameters["shared_memory_region"].string_param
        if region and region not in self.regions:
            raise InferenceServerException(
                f"Unable to find shared memory region: '{region}'", status="StatusCode.NOT_FOUND"
            )
        self.sent.append("shared" if region else "inline")
        return _Result(inputs[0].shape()[0])


async def _client(triton: _Triton) -> tuple[RankingModelClient, CircuitBreaker]:
    breaker = CircuitBreaker("triton", failures=1, open_s=60.0)
    client = RankingModelClient(triton, "m", "", breaker)
    await client.use_shared_memory(InputSlots(2, 8 * 3 * 4), 1.0)
    return client, breaker


async def _settle() -> None:
    """Let a background registration run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_forgotten_region_costs_no_failed_call() -> None:
    triton = _Triton()
    client, breaker = await _client(triton)
    try:
        await client.score(ROWS, ROUTED, 1.0, "r1")
        triton.restart()
        answer = await client.score(ROWS, ROUTED, 1.0, "r2")  # refused shared, sent inline
        await _settle()
        await client.score(ROWS, ROUTED, 1.0, "r3")
    finally:
        await client.close()
    assert answer.scores.tolist() == [0.5] * 4
    assert triton.sent == ["shared", "inline", "shared"]
    assert breaker.state.name == "CLOSED"


async def test_after_triton_was_unreachable_the_first_call_goes_inline() -> None:
    triton = _Triton()
    client, breaker = await _client(triton)
    try:
        triton.up = False
        with pytest.raises(RankingModelError) as raised:
            await client.score(ROWS, ROUTED, 1.0, "down")
        assert raised.value.kind is FailureKind.UNAVAILABLE
        await asyncio.sleep(RETRY_S)  # the breaker's probe comes later than the retry interval
        breaker.succeeded()  # what the probe gets to find out, here without waiting for it
        triton.restart()
        triton.up = True
        await client.score(ROWS, ROUTED, 1.0, "probe")  # at once, without the region
        await _settle()
        await client.score(ROWS, ROUTED, 1.0, "next")
    finally:
        await client.close()
    assert triton.sent == ["inline", "shared"]


async def test_a_region_triton_still_holds_counts_as_registered() -> None:
    triton = _Triton()
    client, breaker = await _client(triton)
    try:
        await client.score(ROWS, ROUTED, 1.0, "r1")
        # Unreachable for a moment, but not restarted: registering again finds it there.
        triton.up = False
        with pytest.raises(RankingModelError):
            await client.score(ROWS, ROUTED, 1.0, "r2")
        triton.up = True
        await asyncio.sleep(RETRY_S)
        breaker.succeeded()
        await client.score(ROWS, ROUTED, 1.0, "r3")
        await _settle()
        await client.score(ROWS, ROUTED, 1.0, "r4")
    finally:
        await client.close()
    assert triton.sent == ["shared", "inline", "shared"]
    assert triton.regions == set()  # unregistered at close
