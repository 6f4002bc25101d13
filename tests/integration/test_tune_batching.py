"""`recsys tune batching` against a real Triton in explicit model-control mode: each setting is
loaded, Triton's counts match what was sent, and the original config is back at the end."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc.aio as triton_grpc
from google.protobuf import text_format
from recsys_tools import tune
from recsys_tools.localstack import default_triton_env, group_alive, start_triton
from recsys_tools.tune.config import Setting, loaded_setting
from recsys_tools.tune.sweep import TuneOptions, tune_batching
from tritonclient.grpc import model_config_pb2

from app.clients.ranking_model import chunk_bounds
from app.core.errors import ConfigError
from tests.integration.conftest import TEST_MAX_BATCH, Stack

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
MODEL = "ranking_model"
ROWS = 300  # two chunks of 150 under the stack's max_batch_size of 256
RATE = 50.0


@pytest.fixture(scope="module")
def tuning_triton(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Triton of this module's own that allows model control (the stack's refuses it)."""
    root = tmp_path_factory.mktemp("tune-triton")
    process, url = start_triton(
        default_triton_env(), stack.model_repository, root / "triton", [MODEL], model_control=True
    )
    try:
        yield url
    finally:
        process.stop()
    assert not group_alive(process.pid), "tritonserver or its stubs outlived the test"


async def _config(url: str) -> dict[str, Any]:
    client = triton_grpc.InferenceServerClient(url)
    try:
        answer = await client.get_model_config(MODEL, as_json=True)
    finally:
        await client.close()
    config: dict[str, Any] = answer["config"]
    return config


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="recsys")
    tune.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["tune", "batching", *argv])


async def test_a_small_sweep_measures_each_setting_and_restores_the_model(
    tuning_triton: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = await _config(tuning_triton)
    out = tmp_path / "out"
    args = _args(
        *("--url", tuning_triton, "--rate", str(RATE), "--rows", str(ROWS)),
        *("--delays", "0,2000", "--duration", "3", "--warmup", "1", "--p99-ms", "1000"),
        *("--out", str(out), "--json"),
    )
    # The command runs its own event loop, as it does from the shell.
    await asyncio.to_thread(args.run, args)
    report = json.loads(capsys.readouterr().out)

    chunks = len(chunk_bounds(ROWS, TEST_MAX_BATCH))
    assert [r["loaded"] for r in report["results"]] == [
        {"delay_us": delay, "max_batch_size": TEST_MAX_BATCH, "instances": 1} for delay in (0, 2000)
    ]
    for result in report["results"]:
        triton = result["triton"]
        assert result["errors"] == 0
        assert result["requests"] == result["answered"] == RATE * 3
        assert result["offered_rps"] == RATE
        assert result["throughput_rps"] >= 0.95 * RATE
        assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
        # Triton counted exactly what was sent in the window: no warm-up, nothing lost.
        assert triton["inferences"] == result["rows_sent"] == result["requests"] * ROWS
        assert triton["requests"] == result["chunks_sent"] == result["requests"] * chunks
        sizes = {int(size): n for size, n in triton["batch_sizes"].items()}
        assert sum(sizes.values()) == triton["executions"] > 0
        assert sum(size * n for size, n in sizes.items()) == triton["inferences"]
        assert max(sizes) <= TEST_MAX_BATCH
        # Even chunks are over half of max_batch_size each: no two fit one execution.
        assert sizes == {ROWS // chunks: triton["executions"]}
        assert triton["requests_per_execution"] == 1.0
        assert 0 < result["busy_share"] < 1
    assert [r["delay_buys_nothing"] for r in report["results"]] == [False, True]
    assert report["recommendation"]["setting"]["delay_us"] == 0
    assert report["recommendation"]["met_target"] is True
    assert report["left_loaded"] == "original"

    assert await _config(tuning_triton) == original
    chosen = text_format.Parse((out / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    setting = report["recommendation"]["setting"]
    assert chosen.name == MODEL
    assert chosen.dynamic_batching.max_queue_delay_microseconds == setting["delay_us"]
    assert chosen.max_batch_size == setting["max_batch_size"] == TEST_MAX_BATCH
    assert json.loads((out / "tuning.json").read_text())["results"] == report["results"]
    assert (out / "tuning.png").stat().st_size > 0


async def test_a_delay_merges_requests_and_keep_leaves_it_loaded(tuning_triton: str) -> None:
    original = await _config(tuning_triton)
    # Requests 20 ms apart, each in one chunk a third of max_batch_size: a 30 ms delay holds
    # each batch open for the next request.
    options = TuneOptions(
        url=tuning_triton,
        model=MODEL,
        rate=RATE,
        rows=ROWS,
        delays=(30_000,),
        max_batch_sizes=(3 * ROWS,),
        instances=None,
        duration_s=1.0,
        warmup_s=0.0,
        p99_ms=1000.0,
        keep=True,
    )
    try:
        report = await tune_batching(options)
        assert report.left_loaded == "chosen"
        assert loaded_setting(await _config(tuning_triton)) == Setting(30_000, 3 * ROWS, 1)
        triton = report.results[0].triton
        assert triton.requests == report.results[0].requests
        assert triton.requests_per_execution is not None
        assert triton.requests_per_execution > 1.5
        assert max(triton.batch_sizes) > ROWS
    finally:
        client = triton_grpc.InferenceServerClient(tuning_triton)
        try:
            await client.load_model(MODEL, config=json.dumps(original))
        finally:
            await client.close()


async def test_a_triton_without_model_control_is_refused(stack: Stack) -> None:
    options = TuneOptions(
        url=stack.triton_url,
        model=MODEL,
        rate=RATE,
        rows=ROWS,
        delays=(0,),
        max_batch_sizes=None,
        instances=None,
        duration_s=1.0,
        warmup_s=0.0,
        p99_ms=100.0,
    )
    with pytest.raises(ConfigError, match="--model-control-mode=explicit"):
        await tune_batching(options)
    assert loaded_setting(await _config(stack.triton_url)).max_batch_size == TEST_MAX_BATCH
