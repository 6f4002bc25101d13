"""The ranking model on Triton, over gRPC with the asyncio client."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton_grpc
from tritonclient.utils import InferenceServerException

from app.errors import FailureKind, RankingModelError
from app.schema import ModelSignature

_STATUS_KINDS = {
    "StatusCode.DEADLINE_EXCEEDED": FailureKind.TIMEOUT,
    "StatusCode.UNAVAILABLE": FailureKind.UNAVAILABLE,
    "StatusCode.NOT_FOUND": FailureKind.UNAVAILABLE,
    "StatusCode.CANCELLED": FailureKind.TIMEOUT,
}


def _mapped(exc: InferenceServerException, operation: str) -> RankingModelError:
    kind = _STATUS_KINDS.get(str(exc.status()), FailureKind.ERROR)
    return RankingModelError(kind, f"{operation}: {exc.message()}")


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


def signature_from_triton(metadata: dict[str, Any], config: dict[str, Any]) -> ModelSignature:
    """Reduce Triton's model metadata and config (as JSON) to a ModelSignature."""
    inputs, outputs = metadata.get("inputs", []), metadata.get("outputs", [])
    first_in = inputs[0] if inputs else {"name": "", "datatype": "", "shape": []}
    first_out = outputs[0] if outputs else {"name": "", "datatype": ""}
    versions = metadata.get("versions") or [""]
    return ModelSignature(
        name=str(metadata.get("name", "")),
        version=str(versions[-1]),
        input_name=str(first_in["name"]),
        input_datatype=str(first_in["datatype"]),
        input_shape=_dims(first_in.get("shape", [])),
        output_name=str(first_out["name"]),
        output_datatype=str(first_out["datatype"]),
        max_batch_size=int(config.get("config", config).get("max_batch_size", 0)),
    )


class RankingModelClient:
    """Scores packed rows. One gRPC channel, created in the lifespan and reused."""

    def __init__(
        self, client: triton_grpc.InferenceServerClient, model_name: str, model_version: str = ""
    ) -> None:
        self._client = client
        self._model_name = model_name
        self._model_version = model_version

    async def signature(self, timeout_s: float) -> ModelSignature:
        try:
            metadata = await self._client.get_model_metadata(
                self._model_name, self._model_version, as_json=True, client_timeout=timeout_s
            )
            config = await self._client.get_model_config(
                self._model_name, self._model_version, as_json=True, client_timeout=timeout_s
            )
        except InferenceServerException as exc:
            raise _mapped(exc, "read model metadata") from exc
        return signature_from_triton(metadata, config)

    async def is_ready(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                return bool(
                    await self._client.is_model_ready(self._model_name, self._model_version)
                )
        except (InferenceServerException, TimeoutError):
            return False

    async def ready_signature(self, timeout_s: float = 1.0) -> ModelSignature:
        """The model's signature, or UNAVAILABLE while Triton is down or still loading it."""
        if not await self.is_ready(timeout_s):
            raise RankingModelError(
                FailureKind.UNAVAILABLE, f"model {self._model_name!r} is not ready"
            )
        return await self.signature(timeout_s)

    async def _infer_chunk(
        self, rows: npt.NDArray[np.float32], input_name: str, output_name: str, timeout_s: float
    ) -> npt.NDArray[np.float32]:
        request_input = triton_grpc.InferInput(input_name, list(rows.shape), "FP32")
        request_input.set_data_from_numpy(rows)
        output = triton_grpc.InferRequestedOutput(output_name)
        result = await self._client.infer(
            self._model_name,
            [request_input],
            model_version=self._model_version,
            outputs=[output],
            client_timeout=timeout_s,
        )
        scores = result.as_numpy(output_name)
        if scores is None or scores.size != rows.shape[0]:
            raise RankingModelError(FailureKind.BAD_DATA, f"{output_name} has the wrong size")
        flat: npt.NDArray[np.float32] = scores.reshape(-1).astype(np.float32, copy=False)
        return flat

    async def score(
        self, rows: npt.NDArray[np.float32], signature: ModelSignature, timeout_s: float
    ) -> npt.NDArray[np.float32]:
        """One score per row; chunks go out concurrently and are joined in row order."""
        if timeout_s <= 0:
            raise RankingModelError(FailureKind.TIMEOUT, "no time left before the deadline")
        bounds = chunk_bounds(rows.shape[0], signature.max_batch_size)
        calls = [
            self._infer_chunk(rows[a:b], signature.input_name, signature.output_name, timeout_s)
            for a, b in bounds
        ]
        try:
            parts = await asyncio.gather(*calls)
        except InferenceServerException as exc:
            raise _mapped(exc, "infer") from exc
        return np.concatenate(parts) if parts else np.empty(0, np.float32)

    async def close(self) -> None:
        await self._client.close()


def connect_triton(url: str, model_name: str, model_version: str) -> RankingModelClient:
    """Create the channel; no I/O happens until the first call."""
    client = triton_grpc.InferenceServerClient(url=url)
    return RankingModelClient(client, model_name, model_version)
