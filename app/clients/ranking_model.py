"""The ranking model on Triton, over gRPC with the asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Coroutine
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton_grpc
from tritonclient.utils import InferenceServerException

from app.clients.breaker import CircuitBreaker
from app.clients.registration import Registration, region_unknown
from app.clients.shared_memory import InputSlots
from app.core.errors import FailureKind, RankingModelError
from app.core.vocabulary import Heads
from app.release.plan import ModelAnswer, Routed
from app.world.schema import HEAD_NAMES, HEADS_OUTPUT, ModelSignature
from app.world.stamp import WORLD_ID_PARAMETER

log = logging.getLogger(__name__)

_STATUS_KINDS = {
    "StatusCode.DEADLINE_EXCEEDED": FailureKind.TIMEOUT,
    "StatusCode.CANCELLED": FailureKind.TIMEOUT,
    "StatusCode.UNAVAILABLE": FailureKind.UNAVAILABLE,
    "StatusCode.NOT_FOUND": FailureKind.UNAVAILABLE,
    "StatusCode.RESOURCE_EXHAUSTED": FailureKind.OVERLOADED,
}
# Triton answers a request its queue policy rejected (queue full, or the request's own queue
# timeout passed) with UNAVAILABLE and one of these messages: the server is up but busy.
_OVERLOAD_MESSAGES = ("exceeds maximum queue size", "timeout expired")
# How long past its caller's timeout a call may still answer, unwaited, before gRPC cancels
# it, on a Triton older than CANCEL_SAFE_FROM: a cancellation that meets the answer on its
# way out can end such a Triton with a segmentation fault (server issue 7368, fixed in 2.53,
# 24.12), and one that has not answered this much later is queued, not on its way out. A
# newer Triton gets its cancellation at the caller's timeout: with no queue policy in the
# model's config, cancellation is what drops a queued call nobody waits for.
LATE_ANSWER_S = 0.25
CANCEL_SAFE_FROM = (2, 53)
# Calls out at once (given up on included) past which a call fails at once as OVERLOADED:
# more would be a backlog Triton answers after its callers have gone.
MAX_CALLS_OUT = 256

# Custom channel arguments replace all of the client's defaults, so the message limits are
# restated. Reconnect backoff is capped low: after Triton restarts, gRPC's default backoff
# (1 s growing to 120 s) would keep the channel failing long after Triton is back.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


# One chunk's answer: its scores, its heads if the model answers them, the version.
_Part = tuple[npt.NDArray[np.float32], Heads | None, str]


class _RegionLostError(Exception):
    """An input named a shared-memory region the Triton no longer holds."""


def _mapped(exc: InferenceServerException, operation: str) -> RankingModelError:
    status, message = str(exc.status()), str(exc.message())
    kind = _STATUS_KINDS.get(status, FailureKind.ERROR)
    if kind is FailureKind.UNAVAILABLE and any(m in message.lower() for m in _OVERLOAD_MESSAGES):
        kind = FailureKind.OVERLOADED
    return RankingModelError(kind, f"{operation}: {status} {message}")


def chunk_bounds(n_rows: int, max_batch_size: int) -> list[tuple[int, int]]:
    """Split n_rows into the fewest chunks of at most max_batch_size, sized evenly.

    Triton rejects a request above max_batch_size and never splits one; even chunks let the
    dynamic batcher merge them with other requests' chunks.
    """
    if n_rows <= 0:
        return []
    n_chunks = -(-n_rows // max_batch_size)
    edges = np.linspace(0, n_rows, n_chunks + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges)]


def _dims(shape: Any) -> tuple[int, ...]:
    return tuple(int(dim) for dim in shape)


def _latest(versions: list[Any]) -> str:
    numbered = [str(v) for v in versions if str(v).isdigit()]
    return max(numbered, key=int) if numbered else ""


def _heads(result: Any, signature: ModelSignature, n_rows: int) -> Heads | None:
    """The heads' probabilities where the model answers them in the expected shape; a model
    without them, or with a malformed answer, ranks by its score alone."""
    if not signature.heads:
        return None
    heads = result.as_numpy(HEADS_OUTPUT)
    if heads is None or heads.shape != (n_rows, len(HEAD_NAMES)):
        return None
    as_float: Heads = heads.astype(np.float32, copy=False)
    return as_float


def signature_from_triton(
    metadata: dict[str, Any], config: dict[str, Any], version: str = ""
) -> ModelSignature:
    """Reduce Triton's model metadata and config (as JSON) to a ModelSignature.

    Its version is `version`, or for "" the highest one Triton has ready (the one it picks).
    """
    inputs, outputs = metadata.get("inputs", []), metadata.get("outputs", [])
    first_in = inputs[0] if inputs else {"name": "", "datatype": "", "shape": []}
    first_out = outputs[0] if outputs else {"name": "", "datatype": ""}
    model_config = config.get("config", config)
    world = model_config.get("parameters", {}).get(WORLD_ID_PARAMETER, {})
    return ModelSignature(
        name=str(metadata.get("name", "")),
        version=version or _latest(metadata.get("versions") or []),
        input_name=str(first_in["name"]),
        input_datatype=str(first_in["datatype"]),
        input_shape=_dims(first_in.get("shape", [])),
        output_name=str(first_out["name"]),
        output_datatype=str(first_out["datatype"]),
        max_batch_size=int(model_config.get("max_batch_size", 0)),
        world_id=str(world.get("string_value", "")),
        heads=any(
            out.get("name") == HEADS_OUTPUT
            and _dims(out.get("shape", []))[-1:] == (len(HEAD_NAMES),)
            for out in outputs[1:]
        ),
    )


class RankingModelClient:
    """Scores packed rows. One gRPC channel, created in the lifespan and reused.

    Every inference goes through this endpoint's circuit breaker and carries the request id
    and, as Triton's own queue timeout, the time left (honoured where the model's queue policy
    allows overrides: Triton then drops a request that could no longer be answered in time
    instead of computing it). The caller waits that long; the gRPC deadline is later (_send).
    """

    def __init__(
        self,
        client: triton_grpc.InferenceServerClient,
        model_name: str,
        model_version: str,
        breaker: CircuitBreaker,
        url: str = "",
        late_answer_s: float | None = None,
    ) -> None:
        """`late_answer_s` fixes the grace; by default it follows the server's version."""
        self._client = client
        self._model_name = model_name
        self._model_version = model_version
        self._breaker = breaker
        self.url = url
        self._registration: Registration | None = None
        self._calls: set[asyncio.Task[_Part]] = set()
        self._grace_fixed = late_answer_s is not None
        self._late_answer_s = LATE_ANSWER_S if late_answer_s is None else late_answer_s

    async def use_shared_memory(self, slots: InputSlots, timeout_s: float) -> None:
        """Send rows through `slots` from now on; registers the region with Triton."""
        registration = Registration(self._client, slots)
        try:
            await registration.register(timeout_s)
        except InferenceServerException as exc:
            raise _mapped(exc, "register shared memory") from exc
        self._registration = registration

    def _shared_input(self, rows: npt.NDArray[np.float32], request_input: Any) -> int | None:
        """Put the rows in a free slot and point the input at it; None: send them inline."""
        registration = self._registration
        if registration is None or rows.nbytes > registration.slots.slot_bytes:
            return None
        if not registration.registered:
            registration.renew()
            return None
        slots = registration.slots
        slot = slots.acquire()
        if slot is not None:
            offset = slots.write(slot, np.ascontiguousarray(rows))
            request_input.set_shared_memory(slots.name, rows.nbytes, offset=offset)
        return slot

    @property
    def breaker(self) -> CircuitBreaker:
        return self._breaker

    async def signature(self, timeout_s: float, version: str | None = None) -> ModelSignature:
        """What `version` (default: the configured one; "": the latest) accepts."""
        version = self._model_version if version is None else version
        try:
            metadata = await self._client.get_model_metadata(
                self._model_name, version, as_json=True, client_timeout=timeout_s
            )
            config = await self._client.get_model_config(
                self._model_name, version, as_json=True, client_timeout=timeout_s
            )
        except InferenceServerException as exc:
            raise _mapped(exc, "read model metadata") from exc
        return signature_from_triton(metadata, config, version)

    async def is_ready(self, timeout_s: float, version: str | None = None) -> bool:
        version = self._model_version if version is None else version
        try:
            return bool(
                await self._client.is_model_ready(
                    self._model_name, version, client_timeout=timeout_s
                )
            )
        except InferenceServerException:
            return False

    async def ready_signature(
        self, timeout_s: float = 1.0, version: str | None = None
    ) -> ModelSignature:
        """The model's signature, or UNAVAILABLE while Triton is down or still loading it."""
        if not await self.is_ready(timeout_s, version):
            shown = self._model_version if version is None else version
            raise RankingModelError(
                FailureKind.UNAVAILABLE,
                f"model {self._model_name!r} version {shown or '(latest)'} is not ready",
            )
        if not self._grace_fixed:
            try:
                server = await self._client.get_server_metadata(
                    as_json=True, client_timeout=timeout_s
                )
            except InferenceServerException as exc:
                raise _mapped(exc, "read server metadata") from exc
            self._late_answer_s = late_answer_s(str(server.get("version", "")))
        return await self.signature(timeout_s, version)

    @property
    def late_answer_s(self) -> float:
        """How long past its caller's timeout a call may still answer before it is cancelled."""
        return self._late_answer_s

    @property
    def calls_out(self) -> int:
        """Inferences sent and not yet answered, those given up on included."""
        return len(self._calls)

    async def _send(
        self,
        rows: npt.NDArray[np.float32],
        routed: Routed,
        timeout_s: float,
        request_id: str,
        shared: bool,
    ) -> Any:
        """One inference of `rows`, through the region when `shared` and a slot is free."""
        signature = routed.signature
        request_input = triton_grpc.InferInput(signature.input_name, list(rows.shape), "FP32")
        slot = self._shared_input(rows, request_input) if shared else None
        if slot is None:
            request_input.set_data_from_numpy(rows)
        try:
            return await self._client.infer(
                self._model_name,
                [request_input],
                model_version=routed.version,
                outputs=[
                    triton_grpc.InferRequestedOutput(name)
                    for name in (
                        signature.output_name,
                        *((HEADS_OUTPUT,) if signature.heads else ()),
                    )
                ],
                request_id=request_id,
                timeout=int(timeout_s * 1_000_000),
                client_timeout=timeout_s + self._late_answer_s,
            )
        except InferenceServerException as exc:
            if slot is not None and region_unknown(exc):
                raise _RegionLostError from exc
            raise
        finally:
            # Held until Triton has answered: until then it may still read the rows.
            if slot is not None and self._registration is not None:
                self._registration.slots.release(slot)

    async def _infer_chunk(
        self,
        rows: npt.NDArray[np.float32],
        routed: Routed,
        timeout_s: float,
        request_id: str,
    ) -> _Part:
        deadline = time.monotonic() + timeout_s
        try:
            try:
                result = await self._send(rows, routed, timeout_s, request_id, shared=True)
            except _RegionLostError:
                # Triton restarted and forgot the region: this chunk goes inline at once,
                # and the region is registered again beside the requests.
                self._region_lost()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RankingModelError(
                        FailureKind.TIMEOUT, "infer: no time left to send inline"
                    ) from None
                result = await self._send(rows, routed, left, request_id, shared=False)
        except InferenceServerException as exc:
            failure = _mapped(exc, "infer")
            if failure.kind is FailureKind.UNAVAILABLE:
                self._region_lost()  # Triton may be restarting: its regions go with it
            raise failure from exc
        signature = routed.signature
        scores = result.as_numpy(signature.output_name)
        if scores is None or scores.size != rows.shape[0]:
            raise RankingModelError(
                FailureKind.BAD_DATA, f"{signature.output_name} has the wrong size"
            )
        flat: npt.NDArray[np.float32] = scores.reshape(-1).astype(np.float32, copy=False)
        return (
            flat,
            _heads(result, signature, rows.shape[0]),
            str(result.get_response().model_version),
        )

    def _launch(self, chunk: Coroutine[Any, Any, _Part]) -> asyncio.Task[_Part]:
        call = asyncio.ensure_future(chunk)
        self._calls.add(call)
        call.add_done_callback(self._answered)
        return call

    def _answered(self, call: asyncio.Task[_Part]) -> None:
        self._calls.discard(call)
        failure = None if call.cancelled() else call.exception()
        if failure is not None and not isinstance(failure, RankingModelError):
            log.error("a ranking call failed", exc_info=failure)  # a fault here, not Triton's

    def _region_lost(self) -> None:
        if self._registration is not None:
            self._registration.lost()

    async def score(
        self,
        rows: npt.NDArray[np.float32],
        routed: Routed,
        timeout_s: float,
        request_id: str,
        guarded: bool = True,
    ) -> ModelAnswer:
        """One score per row; chunks go out concurrently and are joined in row order.

        The answer is given up when one chunk fails (it needs all of them) or timeout_s has
        passed, but the calls are not cancelled here: each runs on, unwaited, until Triton
        answers or its gRPC deadline passes (timeout_s, or LATE_ANSWER_S later on a Triton
        whose cancellations race its answers; see late_answer_s). Answers from two versions
        (Triton's latest changed between chunks) are refused: one answer is scored by one
        model. An unguarded call (a shadow's) neither counts towards the
        breaker nor waits for it, so a failing trial version never stops the served one.
        """
        if timeout_s <= 0:
            raise RankingModelError(FailureKind.TIMEOUT, "no time left before the deadline")
        bounds = chunk_bounds(rows.shape[0], routed.signature.max_batch_size)
        if not bounds:
            return ModelAnswer(np.empty(0, np.float32), routed.version)
        if len(self._calls) >= MAX_CALLS_OUT:
            raise RankingModelError(FailureKind.OVERLOADED, f"{len(self._calls)} calls out")
        guard = self._breaker.guard(RankingModelError) if guarded else contextlib.nullcontext()
        with guard:
            calls = [
                self._launch(self._infer_chunk(rows[a:b], routed, timeout_s, request_id))
                for a, b in bounds
            ]
            parts = await _joined(calls, timeout_s)
        version = parts[0][2]
        if any(other != version for _, _, other in parts):
            versions = " and ".join(sorted({other for _, _, other in parts}))
            raise RankingModelError(FailureKind.ERROR, f"versions {versions} answered one request")
        heads = [part for _, part, _ in parts if part is not None]
        joined = np.concatenate(heads) if len(heads) == len(parts) else None
        return ModelAnswer(np.concatenate([scores for scores, _, _ in parts]), version, joined)

    async def close(self) -> None:
        """Lets the calls out answer (their grace and a little more), then cancels the rest."""
        if self._calls:
            await asyncio.wait(set(self._calls), timeout=self._late_answer_s + 0.1)
        for call in list(self._calls):
            call.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        if self._registration is not None:
            await self._registration.close()
        await self._client.close()


async def _joined(calls: list[asyncio.Task[_Part]], timeout_s: float) -> list[_Part]:
    """The chunks' answers in row order, or the first failure, or TIMEOUT after timeout_s."""
    done, _ = await asyncio.wait(calls, timeout=timeout_s, return_when=asyncio.FIRST_EXCEPTION)
    for call in done:
        if call.cancelled():  # only close() cancels a call
            raise RankingModelError(FailureKind.UNAVAILABLE, "infer: the client closed")
        failure = call.exception()
        if failure is not None:
            raise failure
    if len(done) < len(calls):
        raise RankingModelError(
            FailureKind.TIMEOUT, f"infer: no answer within {timeout_s * 1000:.0f} ms"
        )
    return [call.result() for call in calls]


def late_answer_s(server_version: str) -> float:
    """The grace before a late call is cancelled, by the Triton server's version ("2.51.0")."""
    try:
        major, minor = (int(part) for part in server_version.split(".")[:2])
    except ValueError:
        return LATE_ANSWER_S  # unknown: the safe side
    return 0.0 if (major, minor) >= CANCEL_SAFE_FROM else LATE_ANSWER_S


def connect_triton(
    url: str, model_name: str, model_version: str, breaker: CircuitBreaker
) -> RankingModelClient:
    """Create the channel; no I/O happens until the first call."""
    client = triton_grpc.InferenceServerClient(url=url, channel_args=CHANNEL_ARGS)
    return RankingModelClient(client, model_name, model_version, breaker, url)
