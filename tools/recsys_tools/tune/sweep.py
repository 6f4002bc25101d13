"""The sweep against a running Triton: load each setting through model control, drive the
open-loop load, read Triton's statistics around the measured window, and load the original
config (or the chosen one) back at the end, whatever happened in between.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tritonclient.grpc.aio as triton_grpc
from tritonclient.utils import InferenceServerException

from app.clients.ranking_model import CHANNEL_ARGS
from app.core.errors import ConfigError
from recsys_tools.model.load import without_model_control
from recsys_tools.tune.config import (
    Setting,
    TuneError,
    loaded_setting,
    settings_grid,
    with_setting,
)
from recsys_tools.tune.figures import SettingResult, measured, stats_delta
from recsys_tools.tune.load import FloatArray, chunked, drive, request_rows
from recsys_tools.tune.report import TuneChoice, TuneReport, recommend

log = logging.getLogger("recsys.tune")

PROBE_TIMEOUT_S = 5.0
# A Python-backend instance starts a stub process and an onnxruntime session: seconds each.
LOAD_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 30.0
# Triton counts a request once its response is released, which can trail the answer.
SETTLE_S = 2.0
SETTLE_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class TuneOptions:
    url: str
    model: str
    rate: float
    rows: int
    delays: tuple[int, ...]
    max_batch_sizes: tuple[int, ...] | None  # None: the loaded config's
    instances: tuple[int, ...] | None  # None: the loaded config's
    duration_s: float
    warmup_s: float
    p99_ms: float
    world: Path | None = None
    timeout_s: float = 5.0
    keep: bool = False


@dataclass(frozen=True, slots=True)
class ModelIO:
    input_name: str
    width: int
    output_name: str


def model_io(config: Mapping[str, Any], model: str) -> ModelIO:
    """The one FP32 row input and the output the service uses, from the model's config."""
    inputs, outputs = config.get("input", []), config.get("output", [])
    if len(inputs) != 1 or not outputs:
        raise ConfigError(f"{model} takes {len(inputs)} inputs: tune batching drives one")
    tensor = inputs[0]
    dims = [int(dim) for dim in tensor.get("dims", [])]
    if tensor.get("data_type") != "TYPE_FP32" or len(dims) != 1 or dims[0] < 1:
        raise ConfigError(
            f"{model}'s input {tensor.get('name')} is {tensor.get('data_type')} {dims}: tune "
            "batching sends FP32 rows of a fixed width, as the service does"
        )
    return ModelIO(str(tensor["name"]), dims[0], str(outputs[0]["name"]))


def _grid(options: TuneOptions, original: Setting) -> list[Setting]:
    sizes = options.max_batch_sizes or (original.max_batch_size,)
    if min(sizes) < 1:
        raise ConfigError(
            f"{options.model} has max_batch_size {original.max_batch_size}: it does not batch; "
            "give --max-batch-sizes to try batching"
        )
    return settings_grid(options.delays, sizes, options.instances or (original.instances,))


async def _triton_call(what: str, options: TuneOptions, call: Any) -> Any:
    try:
        return await call
    except InferenceServerException as exc:
        raise TuneError(
            f"Triton at {options.url} did not {what} ({exc.status()} {exc.message()}): check "
            "--url (its gRPC address) and --model"
        ) from None


async def _config(client: Any, options: TuneOptions) -> dict[str, Any]:
    call = client.get_model_config(options.model, as_json=True, client_timeout=PROBE_TIMEOUT_S)
    answer = await _triton_call(f"give {options.model}'s config", options, call)
    config: dict[str, Any] = answer["config"]
    return config


async def _current(client: Any, options: TuneOptions) -> dict[str, Any]:
    """The config the model is served with now; it must be ready before anything is changed."""
    ready = client.is_model_ready(options.model, client_timeout=PROBE_TIMEOUT_S)
    if not await _triton_call("answer", options, ready):
        raise TuneError(
            f"{options.model} is not ready on Triton at {options.url}: load it (or name the "
            "loaded model with --model) before tuning"
        )
    return await _config(client, options)


async def _stats(client: Any, options: TuneOptions) -> dict[str, Any]:
    call = client.get_inference_statistics(
        options.model, as_json=True, client_timeout=PROBE_TIMEOUT_S
    )
    stats: dict[str, Any] = await _triton_call("give its statistics", options, call)
    return stats


async def _settled_stats(client: Any, options: TuneOptions) -> dict[str, Any]:
    """Statistics once two reads in a row agree: the last answers' requests are counted."""
    give_up = time.monotonic() + SETTLE_S
    last = await _stats(client, options)
    while time.monotonic() < give_up:
        await asyncio.sleep(SETTLE_POLL_S)
        now = await _stats(client, options)
        if now == last:
            break
        last = now
    return last


async def _load(client: Any, options: TuneOptions, config: Mapping[str, Any], what: str) -> None:
    """Load the model with this config (Triton's override of the repository's config.pbtxt)."""
    try:
        await client.load_model(
            options.model, config=json.dumps(config), client_timeout=LOAD_TIMEOUT_S
        )
    except InferenceServerException as exc:
        message = str(exc.message())
        if without_model_control(exc):
            raise ConfigError(
                f"Triton at {options.url} refuses to load models ({message}): start it with "
                "--model-control-mode=explicit to tune batching"
            ) from None
        raise TuneError(
            f"Triton did not load {options.model} with {what} ({exc.status()} {message}); "
            "it keeps the config it had: check the values in its log"
        ) from None
    give_up = time.monotonic() + READY_TIMEOUT_S
    while not await client.is_model_ready(options.model, client_timeout=PROBE_TIMEOUT_S):
        if time.monotonic() > give_up:
            raise TuneError(
                f"{options.model} was not ready {READY_TIMEOUT_S:g} s after loading {what}: "
                "see Triton's log"
            )
        await asyncio.sleep(0.1)


async def _measure(
    client: Any, options: TuneOptions, setting: Setting, io: ModelIO, blocks: list[FloatArray]
) -> SettingResult:
    """One loaded setting: warm it up, then time a window between two statistics reads."""
    config = await _config(client, options)
    loaded = loaded_setting(config)
    if loaded != setting:
        raise TuneError(
            f"Triton reports {loaded.label} after loading {setting.label}: something else "
            "changed the model meanwhile; run the sweep while nothing else loads models"
        )
    requests = chunked(blocks, loaded.max_batch_size, io.input_name)
    args = (client, options.model, io.output_name, requests, options.rate)
    if options.warmup_s > 0:
        await drive(*args, options.warmup_s, options.timeout_s)
    before = await _settled_stats(client, options)
    run = await drive(*args, options.duration_s, options.timeout_s)
    after = await _settled_stats(client, options)
    result = measured(setting, loaded, run, stats_delta(before, after, options.model), config)
    log.info(
        "%s: p99 %s ms, %.1f of %.1f requests/s answered, %s requests per execution",
        setting.label,
        result.p99_ms,
        result.throughput_rps,
        result.offered_rps,
        result.triton.requests_per_execution,
    )
    return result


async def tune_batching(options: TuneOptions) -> TuneReport:
    """Run the sweep; Triton serves the original config afterwards (the chosen one with keep)."""
    client = triton_grpc.InferenceServerClient(options.url, channel_args=CHANNEL_ARGS)
    try:
        return await _sweep(client, options)
    finally:
        await client.close()


async def _sweep(client: Any, options: TuneOptions) -> TuneReport:
    original = await _current(client, options)
    io = model_io(original, options.model)
    found = loaded_setting(original)
    grid = _grid(options, found)
    blocks, source = request_rows(options.world, io.width, options.rows)
    results: list[SettingResult] = []
    recommendation: TuneChoice | None = None
    changed = False  # a load that fails leaves the config it had: nothing to put back
    try:
        for setting in grid:
            await _load(client, options, with_setting(original, setting), setting.label)
            changed = True
            results.append(await _measure(client, options, setting, io, blocks))
        recommendation = recommend(results, options.p99_ms)
    finally:
        keep = options.keep and recommendation is not None
        final = results[recommendation.index].config if keep and recommendation else original
        if changed:
            await _restore(client, options, final, "chosen" if keep else "original")
    return TuneReport(
        url=options.url,
        model=options.model,
        rate=options.rate,
        rows=options.rows,
        rows_source=source,
        width=io.width,
        duration_s=options.duration_s,
        warmup_s=options.warmup_s,
        p99_target_ms=options.p99_ms,
        original=found,
        results=tuple(results),
        recommendation=recommendation,
        left_loaded="chosen" if keep else "original",
    )


async def _restore(
    client: Any, options: TuneOptions, config: Mapping[str, Any], which: str
) -> None:
    try:
        await _load(client, options, config, f"the {which} config")
    except (TuneError, ConfigError) as exc:
        raise TuneError(
            f"{exc}; the model may still run the last setting tried: load it again "
            "(its repository config.pbtxt) or restart Triton"
        ) from None
    log.info("%s serves the %s config", options.model, which)
