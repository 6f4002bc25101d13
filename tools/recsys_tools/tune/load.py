"""Open-loop load on Triton over gRPC: a fixed schedule, latency timed from the schedule.

Request i is due at i/rate from the start, whatever Triton is doing; it is sent as the service
sends one request's rows (chunks of at most max_batch_size, all at once, done when the last
answers). A closed loop would wait for answers and so slow down exactly when Triton does,
hiding the queueing a batching delay causes; timing from the due time shows it.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton_grpc
from tritonclient.utils import InferenceServerException

from app.clients.ranking_model import chunk_bounds
from app.core.errors import ConfigError
from app.world.schema import world_schema
from recsys_tools.measure import schedule
from recsys_tools.model.holdout import load_holdout
from recsys_tools.tune.figures import LoadRun

FloatArray = npt.NDArray[np.float32]
# Distinct requests cycled through, so Triton never sees one tensor over and over.
DISTINCT_REQUESTS = 8
# The first request is due this long after scheduling starts, so it is not already late.
LEAD_S = 0.05
BAD_ANSWER = "bad_answer"


def request_rows(world: Path | None, width: int, rows: int) -> tuple[list[FloatArray], str]:
    """DISTINCT_REQUESTS blocks of `rows` rows, and where they come from.

    A world's held-out rows are the features the model really scores; random rows in [0, 1)
    cost the model the same, since its work does not depend on the values.
    """
    if world is None:
        rng = np.random.default_rng(0)
        blocks = [rng.random((rows, width), dtype=np.float32) for _ in range(DISTINCT_REQUESTS)]
        return blocks, f"random rows, {width} wide"

    holdout = load_holdout(world, world_schema(world, None))
    if holdout.rows.shape[1] != width:
        raise ConfigError(
            f"--world {world}: its rows are {holdout.rows.shape[1]} wide, the model takes "
            f"{width}: name the world this model was trained on, or leave --world out"
        )
    # Wraps round when the world holds fewer rows than the requests need.
    take = np.arange(rows * DISTINCT_REQUESTS) % len(holdout.rows)
    blocks = list(holdout.rows[take].reshape(DISTINCT_REQUESTS, rows, width))
    return blocks, f"held-out rows of {world}"


def chunked(blocks: Sequence[FloatArray], max_batch_size: int, input_name: str) -> list[list[Any]]:
    """Each request as the InferInputs of its chunks, split as the service splits it.

    Built once per setting: infer() copies an input into its message when called, so one
    input can serve requests in flight together.
    """
    requests = []
    for block in blocks:
        chunks = []
        for start, end in chunk_bounds(len(block), max_batch_size):
            tensor = triton_grpc.InferInput(input_name, [end - start, block.shape[1]], "FP32")
            tensor.set_data_from_numpy(block[start:end])
            chunks.append(tensor)
        requests.append(chunks)
    return requests


async def _chunk(client: Any, model: str, output: str, tensor: Any, timeout_s: float) -> str:
    """Empty when the chunk was scored, else why not (a gRPC status)."""
    try:
        result = await client.infer(
            model,
            [tensor],
            outputs=[triton_grpc.InferRequestedOutput(output)],
            client_timeout=timeout_s,
        )
    except InferenceServerException as exc:
        return str(exc.status() or "error")
    scores = result.as_numpy(output)
    return "" if scores is not None and scores.shape[0] == tensor.shape()[0] else BAD_ANSWER


async def drive(
    client: Any,
    model: str,
    output: str,
    requests: Sequence[Sequence[Any]],
    rate: float,
    duration_s: float,
    timeout_s: float,
) -> LoadRun:
    """Send ceil(rate x duration) requests on schedule and wait for every answer."""
    loop = asyncio.get_running_loop()
    count = max(1, math.ceil(rate * duration_s - 1e-9))
    start = loop.time() + LEAD_S
    ends: list[float] = []
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    sizes = [sum(int(tensor.shape()[0]) for tensor in chunks) for chunks in requests]
    sent = {"rows": 0, "chunks": 0}

    async def one(index: int, due: float) -> None:
        chunks = requests[index % len(requests)]
        sent["rows"] += sizes[index % len(requests)]
        sent["chunks"] += len(chunks)
        answers = await asyncio.gather(
            *(_chunk(client, model, output, tensor, timeout_s) for tensor in chunks)
        )
        now = loop.time()
        ends.append(now - start)
        failed = [why for why in answers if why]
        if failed:
            errors[failed[0]] += 1
        else:
            latencies.append(now - due)

    tasks: list[asyncio.Task[None]] = []
    try:
        for index, offset in enumerate(schedule(rate, count / rate, poisson=False)):
            due = start + offset
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(index, due)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return LoadRun(
        requests=count,
        latencies_s=tuple(sorted(latencies)),
        errors=dict(errors),
        rows_sent=sent["rows"],
        chunks_sent=sent["chunks"],
        duration_s=count / rate,
        span_s=max(ends, default=0.0),
    )
