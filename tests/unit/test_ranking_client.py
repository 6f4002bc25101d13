import asyncio
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from tritonclient.utils import InferenceServerException

from app.clients import ranking_model
from app.clients.breaker import CircuitBreaker
from app.clients.ranking_model import (
    LATE_ANSWER_S,
    RankingModelClient,
    chunk_bounds,
    late_answer_s,
    signature_from_triton,
)
from app.core.errors import FailureKind, RankingModelError
from app.release.plan import Routed
from app.world.schema import ModelSignature


@pytest.mark.parametrize(
    ("rows", "max_batch", "bounds"),
    [
        (0, 256, []),
        (10, 256, [(0, 10)]),
        (256, 256, [(0, 256)]),
        (257, 256, [(0, 128), (128, 257)]),
        (1000, 256, [(0, 250), (250, 500), (500, 750), (750, 1000)]),
        (5, 2, [(0, 2), (2, 3), (3, 5)]),
    ],
)
def test_chunks_are_few_even_and_within_max_batch(
    rows: int, max_batch: int, bounds: list[tuple[int, int]]
) -> None:
    assert chunk_bounds(rows, max_batch) == bounds
    assert all(0 < end - start <= max_batch for start, end in bounds)


def test_signature_from_triton_json() -> None:
    metadata = {
        "name": "ranking_model",
        "versions": ["1", "2"],
        "platform": "python",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": ["-1", "121"]}],
        "outputs": [{"name": "score", "datatype": "FP32", "shape": ["-1", "1"]}],
    }
    config = {"config": {"name": "ranking_model", "max_batch_size": 2048}}
    signature = signature_from_triton(metadata, config)
    assert signature.input_shape == (-1, 121)
    assert signature.version == "2"
    assert signature.max_batch_size == 2048
    assert (signature.input_name, signature.output_name) == ("features", "score")
    assert not signature.heads


def test_a_model_that_answers_its_heads_says_so() -> None:
    metadata = {
        "name": "ranking_model",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": ["-1", "125"]}],
        "outputs": [
            {"name": "score", "datatype": "FP32", "shape": ["-1", "1"]},
            {"name": "heads", "datatype": "FP32", "shape": ["-1", "2"]},
        ],
    }
    assert signature_from_triton(metadata, {"config": {}}).heads
    # Another second output, or heads of another width, is not this contract's.
    for other in (
        {"name": "logits", "shape": ["-1", "2"]},
        {"name": "heads", "shape": ["-1", "3"]},
    ):
        odd = {**metadata, "outputs": [metadata["outputs"][0], {"datatype": "FP32", **other}]}
        assert not signature_from_triton(odd, {"config": {}}).heads


def test_signature_of_a_model_without_inputs() -> None:
    signature = signature_from_triton({"name": "m"}, {"config": {}})
    assert signature.input_shape == ()
    assert signature.max_batch_size == 0


class _Result:
    def __init__(self, rows: int) -> None:
        self._rows = rows

    def as_numpy(self, name: str) -> npt.NDArray[np.float32]:
        return np.full((self._rows, 1), 0.5, dtype=np.float32)


class _FakeTriton:
    """The first chunk fails at once; the others would take a second."""

    def __init__(self, status: str, message: str) -> None:
        self.status, self.message = status, message
        self.calls: list[dict[str, Any]] = []
        self.cancelled = 0

    async def infer(self, model_name: str, inputs: list[Any], **kwargs: Any) -> _Result:
        self.calls.append(kwargs)
        rows = inputs[0].shape()[0]
        if len(self.calls) == 1:
            raise InferenceServerException(self.message, status=self.status)
        try:
            await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return _Result(rows)

    async def close(self) -> None:
        pass

    # What ready_signature reads: a ready model and a server of `version`.
    version = "2.51.0"

    async def is_model_ready(self, *args: Any, **kwargs: Any) -> bool:
        return True

    async def get_server_metadata(self, **kwargs: Any) -> dict[str, Any]:
        return {"name": "triton", "version": self.version}

    async def get_model_metadata(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        shape = ["-1", "3"]
        return {
            "name": "m",
            "inputs": [{"name": "features", "datatype": "FP32", "shape": shape}],
            "outputs": [{"name": "score", "datatype": "FP32", "shape": ["-1", "1"]}],
        }

    async def get_model_config(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"config": {"name": "m", "max_batch_size": 2}}


SIGNATURE = ModelSignature("m", "1", "features", "FP32", (-1, 3), "score", "FP32", 2)
ROUTED = Routed("", SIGNATURE)


def _client(fake: _FakeTriton, breaker: CircuitBreaker | None = None) -> RankingModelClient:
    return RankingModelClient(
        fake,
        "m",
        "",
        breaker or CircuitBreaker("triton", failures=5, open_s=1.0),
    )


async def test_one_failing_chunk_ends_the_answer_and_its_siblings_run_out_uncancelled() -> None:
    fake = _FakeTriton("StatusCode.UNAVAILABLE", "connection refused")
    client = _client(fake)
    rows = np.zeros((6, 3), dtype=np.float32)
    started = time.monotonic()
    with pytest.raises(RankingModelError) as raised:
        await client.score(rows, ROUTED, 0.5, "req-7")
    assert time.monotonic() - started < 0.5
    assert raised.value.kind is FailureKind.UNAVAILABLE
    # The siblings are not cancelled: a cancellation racing an answer crashes Triton 2.51.
    assert client.calls_out == 2
    assert fake.cancelled == 0
    # Every chunk carries the request id, Triton's queue timeout (the time left) and a gRPC
    # deadline later than that.
    assert {c["request_id"] for c in fake.calls} == {"req-7"}
    assert {c["timeout"] for c in fake.calls} == {500_000}
    assert {c["client_timeout"] for c in fake.calls} == {0.5 + LATE_ANSWER_S}
    await client.close()  # the one place calls are cancelled
    assert (client.calls_out, fake.cancelled) == (0, 2)


async def test_a_call_past_its_timeout_is_given_up_on_but_runs_to_its_answer() -> None:
    fake = _FakeTriton("StatusCode.OK", "")
    fake.calls.append({})  # no chunk fails at once: each takes a second
    client = _client(fake)
    started = time.monotonic()
    with pytest.raises(RankingModelError) as raised:
        await client.score(np.zeros((1, 3), np.float32), ROUTED, 0.05, "r")
    assert time.monotonic() - started < 0.5
    assert raised.value.kind is FailureKind.TIMEOUT
    assert client.calls_out == 1
    for _ in range(100):
        if not client.calls_out:
            break
        await asyncio.sleep(0.05)
    assert (client.calls_out, fake.cancelled) == (0, 0)


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", FailureKind.TIMEOUT),
        ("StatusCode.UNAVAILABLE", "failed to connect", FailureKind.UNAVAILABLE),
        ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size", FailureKind.OVERLOADED),
        ("StatusCode.UNAVAILABLE", "Request timeout expired", FailureKind.OVERLOADED),
        ("StatusCode.INTERNAL", "model crashed", FailureKind.ERROR),
    ],
)
async def test_triton_statuses_map_to_failure_kinds(
    status: str, message: str, kind: FailureKind
) -> None:
    fake = _FakeTriton(status, message)
    with pytest.raises(RankingModelError) as raised:
        await _client(fake).score(np.zeros((1, 3), np.float32), ROUTED, 0.5, "r")
    assert raised.value.kind is kind


async def test_an_open_breaker_skips_triton_and_no_time_left_is_not_its_fault() -> None:
    fake = _FakeTriton("StatusCode.UNAVAILABLE", "down")
    breaker = CircuitBreaker("triton", failures=1, open_s=60.0)
    client = _client(fake, breaker)
    rows = np.zeros((1, 3), np.float32)
    with pytest.raises(RankingModelError):
        await client.score(rows, ROUTED, 0.0, "r")
    assert not fake.calls
    assert breaker.state.name == "CLOSED"
    with pytest.raises(RankingModelError):
        await client.score(rows, ROUTED, 0.5, "r")
    assert breaker.state.name == "OPEN"
    with pytest.raises(RankingModelError) as raised:
        await client.score(rows, ROUTED, 0.5, "r")
    assert raised.value.kind is FailureKind.CIRCUIT_OPEN
    assert len(fake.calls) == 1


@pytest.mark.parametrize(
    ("version", "grace"),
    [
        ("2.51.0", LATE_ANSWER_S),
        ("2.52.9", LATE_ANSWER_S),
        ("2.53.0", 0.0),
        ("2.62.1", 0.0),
        ("3.0", 0.0),
        ("", LATE_ANSWER_S),
        ("dev", LATE_ANSWER_S),
    ],
)
def test_the_grace_before_a_cancellation_follows_the_server_version(
    version: str, grace: float
) -> None:
    assert late_answer_s(version) == grace


async def test_a_triton_whose_cancellations_are_safe_gets_them_at_the_callers_timeout() -> None:
    fake = _FakeTriton("StatusCode.OK", "")
    fake.calls.append({})
    fake.version = "2.62.0"
    client = _client(fake)
    assert client.late_answer_s == LATE_ANSWER_S  # before the server has said
    routed = Routed("", await client.ready_signature(1.0))
    assert client.late_answer_s == 0.0
    with pytest.raises(RankingModelError):
        await client.score(np.zeros((1, 3), np.float32), routed, 0.05, "r")
    assert fake.calls[-1]["client_timeout"] == 0.05
    await client.close()


async def test_too_many_calls_out_fail_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranking_model, "MAX_CALLS_OUT", 2)
    fake = _FakeTriton("StatusCode.OK", "")
    fake.calls.append({})
    client = _client(fake)
    rows = np.zeros((1, 3), np.float32)
    for _ in range(2):
        with pytest.raises(RankingModelError) as raised:
            await client.score(rows, ROUTED, 0.01, "r")
        assert raised.value.kind is FailureKind.TIMEOUT
    sent = len(fake.calls)
    with pytest.raises(RankingModelError) as raised:
        await client.score(rows, ROUTED, 0.5, "r")
    assert raised.value.kind is FailureKind.OVERLOADED
    assert len(fake.calls) == sent  # nothing more sent
    await client.close()


async def test_close_waits_out_the_grace_then_cancels_what_is_still_out() -> None:
    fake = _FakeTriton("StatusCode.OK", "")
    fake.calls.append({})  # each call takes a second
    client = RankingModelClient(
        fake,
        "m",
        "",
        CircuitBreaker("triton", failures=5, open_s=1.0),
        late_answer_s=0.1,
    )
    with pytest.raises(RankingModelError):
        await client.score(np.zeros((1, 3), np.float32), ROUTED, 0.01, "r")
    started = time.monotonic()
    await client.close()
    assert 0.1 <= time.monotonic() - started < 0.9
    assert (client.calls_out, fake.cancelled) == (0, 1)
