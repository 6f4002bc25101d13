"""`recsys tune batching` without Triton: config edits, statistics over a window, figures, the
recommendation rule and the report, on literal values."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from recsys_tools import tune
from recsys_tools.measure import percentile
from recsys_tools.tune import ROWS, options_from
from recsys_tools.tune.config import (
    Setting,
    TuneError,
    config_text,
    loaded_setting,
    settings_grid,
    with_setting,
)
from recsys_tools.tune.figures import (
    LoadRun,
    SettingResult,
    TritonDelta,
    measured,
    stats_delta,
)
from recsys_tools.tune.files import write_outputs
from recsys_tools.tune.report import (
    BUSY_TIE,
    ERRORS,
    MEETS,
    P99_OVER,
    TuneChoice,
    TuneReport,
    largest_chunk,
    recommend,
    render_text,
    report_json,
    verdict,
)
from tritonclient.grpc import model_config_pb2

from app.core.errors import ConfigError
from app.core.settings import Settings

# The local model's config as Triton 2.51 reports it with as_json=True: int64 fields as strings,
# preferred_batch_size filled in with max_batch_size, the instance group named.
TRITON_CONFIG: dict[str, Any] = {
    "name": "ranking_model",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 2048,
    "input": [{"name": "features", "data_type": "TYPE_FP32", "dims": ["121"]}],
    "output": [{"name": "score", "data_type": "TYPE_FP32", "dims": ["1"]}],
    "instance_group": [{"name": "ranking_model_0", "count": 1, "kind": "KIND_CPU"}],
    "default_model_filename": "model.py",
    "dynamic_batching": {"preferred_batch_size": [2048]},
    "parameters": {
        "intra_op_num_threads": {"string_value": "1"},
        "world_id": {"string_value": "20260101-000000-abcdef"},
    },
    "backend": "python",
}


def test_the_grid_varies_the_delay_fastest() -> None:
    grid = settings_grid([0, 500], [256, 512], [1, 2])
    assert grid[:3] == [Setting(0, 256, 1), Setting(500, 256, 1), Setting(0, 512, 1)]
    assert len(grid) == 8
    assert grid[-1] == Setting(500, 512, 2)
    assert Setting(2000, 256, 1).label == "2000us/b256/x1"


def test_the_setting_read_back_from_triton_json() -> None:
    assert loaded_setting(TRITON_CONFIG) == Setting(0, 2048, 1)
    config = copy.deepcopy(TRITON_CONFIG)
    config["dynamic_batching"]["max_queue_delay_microseconds"] = "2000"  # uint64: a string
    config["instance_group"][0]["count"] = 3
    assert loaded_setting(config) == Setting(2000, 2048, 3)


def test_a_setting_edits_a_copy_and_keeps_the_rest() -> None:
    original = copy.deepcopy(TRITON_CONFIG)
    edited = with_setting(original, Setting(500, 256, 2))
    assert original == TRITON_CONFIG
    assert edited["max_batch_size"] == 256
    assert edited["dynamic_batching"] == {
        "max_queue_delay_microseconds": 500,
        # Triton filled it in with the old maximum: it follows the new one.
        "preferred_batch_size": [256],
    }
    assert edited["instance_group"] == [{"name": "ranking_model_0", "count": 2, "kind": "KIND_CPU"}]
    assert edited["parameters"] == TRITON_CONFIG["parameters"]
    assert loaded_setting(edited) == Setting(500, 256, 2)


@pytest.mark.parametrize(
    ("preferred", "new_max", "expected"),
    [
        ([64, 2048], 256, [64, 256]),
        (["512"], 256, None),  # above the new maximum, which Triton refuses: dropped
        ([512], 4096, [512]),
        ([], 256, None),
    ],
)
def test_preferred_batch_sizes_stay_within_the_maximum(
    preferred: list[Any], new_max: int, expected: list[int] | None
) -> None:
    config = copy.deepcopy(TRITON_CONFIG)
    config["dynamic_batching"] = {"preferred_batch_size": preferred}
    batching = with_setting(config, Setting(0, new_max, 1))["dynamic_batching"]
    assert batching.get("preferred_batch_size") == expected


def test_a_config_without_dynamic_batching_gets_it() -> None:
    config = {k: v for k, v in TRITON_CONFIG.items() if k != "dynamic_batching"}
    assert with_setting(config, Setting(100, 2048, 1))["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100
    }


def test_instances_of_several_groups_are_refused() -> None:
    config = copy.deepcopy(TRITON_CONFIG)
    config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}, {"count": 1, "kind": "KIND_CPU"}]
    assert with_setting(config, Setting(0, 2048, 2))["instance_group"] == config["instance_group"]
    with pytest.raises(TuneError, match="--instances"):
        with_setting(config, Setting(0, 2048, 3))


def test_the_config_text_parses_as_tritons_model_config() -> None:
    config = with_setting(TRITON_CONFIG, Setting(2000, 256, 2))
    text = config_text(config, ("chosen at 50 requests/s", "second line"))
    assert text.startswith("# chosen at 50 requests/s\n# second line\n")
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert parsed.name == "ranking_model"
    assert parsed.max_batch_size == 256
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 2000
    assert list(parsed.dynamic_batching.preferred_batch_size) == [256]
    assert parsed.instance_group[0].count == 2
    assert parsed.input[0].dims == [121]
    assert parsed.parameters["world_id"].string_value == "20260101-000000-abcdef"


def test_a_config_field_the_client_does_not_know_is_refused() -> None:
    with pytest.raises(TuneError, match="tritonclient"):
        config_text({**TRITON_CONFIG, "no_such_field": 1})


def _stats(
    requests: int, rows: int, executions: int, batches: dict[int, tuple[int, int]]
) -> dict[str, Any]:
    """Statistics shaped as get_inference_statistics(as_json=True) gives them."""
    return {
        "model_stats": [
            {
                "name": "ranking_model",
                "version": "1",
                "inference_count": str(rows),
                "execution_count": str(executions),
                "inference_stats": {
                    "success": {"count": str(requests), "ns": "999"},
                    "queue": {"count": str(requests), "ns": str(requests * 2_000_000)},
                    "compute_infer": {"count": str(requests), "ns": str(requests * 500_000)},
                },
                "batch_stats": [
                    {
                        "batch_size": str(size),
                        "compute_input": {"count": str(n), "ns": str(n * 100_000)},
                        "compute_infer": {"count": str(n), "ns": str(ns)},
                        "compute_output": {"count": str(n), "ns": str(n * 100_000)},
                    }
                    for size, (n, ns) in batches.items()
                ],
            },
            {"name": "other_model", "inference_count": "99999", "execution_count": "999"},
        ]
    }


def test_statistics_over_a_window() -> None:
    before = _stats(10, 1500, 10, {150: (10, 5_000_000)})
    after = _stats(50, 7500, 30, {150: (10, 5_000_000), 300: (20, 16_000_000)})
    delta = stats_delta(before, after, "ranking_model")
    assert delta.requests == 40
    assert delta.inferences == 6000
    assert delta.executions == 20
    assert delta.rows_per_execution == 300.0
    assert delta.requests_per_execution == 2.0
    assert delta.queue_ms_per_request == 2.0
    assert delta.compute_ms_per_request == 0.5
    assert delta.batch_sizes == {300: 20}
    # Input and output count as busy beside the inference: 20 x 0.2 ms + 16 ms.
    assert delta.busy_s == pytest.approx(0.020)


def test_statistics_of_a_fresh_model_leave_zeros_out() -> None:
    fresh = {"model_stats": [{"name": "ranking_model", "inference_stats": {"success": {}}}]}
    delta = stats_delta(fresh, _stats(2, 300, 1, {300: (1, 1_000_000)}), "ranking_model")
    assert (delta.requests, delta.inferences, delta.executions) == (2, 300, 1)
    empty = stats_delta(fresh, fresh, "ranking_model")
    assert empty.rows_per_execution is None
    assert empty.batch_sizes == {}


def test_statistics_that_go_back_mean_a_reload() -> None:
    with pytest.raises(TuneError, match="reloaded"):
        stats_delta(_stats(10, 1500, 10, {}), _stats(2, 300, 2, {}), "ranking_model")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def _delta(requests_per_execution: float | None = 2.0) -> TritonDelta:
    return TritonDelta(
        executions=100,
        inferences=30_000,
        requests=200,
        rows_per_execution=300.0,
        requests_per_execution=requests_per_execution,
        queue_ms_per_request=1.0,
        compute_ms_per_request=0.5,
        busy_s=0.25,
        batch_sizes={300: 100},
    )


def test_measured_figures_from_a_window() -> None:
    latencies = tuple(0.001 * v for v in range(1, 101))
    run = LoadRun(100, latencies, {}, 30_000, 200, duration_s=2.0, span_s=2.5)
    result = measured(Setting(0, 256, 1), Setting(0, 256, 1), run, _delta(), {})
    assert result.offered_rps == 50.0
    assert result.throughput_rps == 40.0  # the last answer came 0.5 s after the schedule ended
    assert (result.p50_ms, result.p99_ms, result.max_ms) == (50.0, 99.0, 100.0)
    assert result.window_s == 2.5
    assert result.busy_share == 0.1


def _result(
    delay: int,
    p99: float | None,
    busy: float | None,
    merged: float | None = 2.0,
    errors: int = 0,
    answered_rps: float = 100.0,
) -> SettingResult:
    return SettingResult(
        setting=Setting(delay, 2048, 1),
        loaded=Setting(delay, 2048, 1),
        offered_rps=100.0,
        throughput_rps=answered_rps,
        requests=1000,
        answered=1000 - errors,
        errors=errors,
        error_kinds={"StatusCode.DEADLINE_EXCEEDED": errors} if errors else {},
        p50_ms=None if p99 is None else p99 / 2,
        p99_ms=p99,
        max_ms=p99,
        rows_sent=1_100_000,
        chunks_sent=1000,
        window_s=10.0,
        triton=_delta(merged),
        busy_share=busy,
        config={"delay": delay},
    )


def test_verdicts() -> None:
    assert verdict(_result(0, 10.0, 0.5), 20.0) == MEETS
    assert verdict(_result(0, 10.0, 0.5, errors=1), 20.0) == ERRORS
    assert verdict(_result(0, 30.0, 0.5), 20.0) == P99_OVER
    assert verdict(_result(0, None, None), 20.0) == P99_OVER
    assert verdict(_result(0, 10.0, 0.5, answered_rps=98.0), 20.0) == "behind"
    assert verdict(_result(0, 10.0, 0.5, answered_rps=99.0), 20.0) == MEETS


def test_the_most_headroom_wins_over_a_lower_p99() -> None:
    results = [_result(0, 8.0, 0.80), _result(500, 12.0, 0.55), _result(2000, 25.0, 0.40)]
    # 2000 us would free the most time but misses the 20 ms target.
    choice = recommend(results, 20.0)
    assert choice == TuneChoice(1, True, choice.reason if choice else "")


def test_headroom_within_the_tie_goes_to_the_lowest_p99() -> None:
    least = 0.45
    results = [
        _result(0, 3.0, least + BUSY_TIE + 0.01),  # the lowest p99, but clearly busier
        _result(500, 6.0, least + BUSY_TIE - 0.01),
        _result(2000, 15.0, least),
    ]
    choice = recommend(results, 20.0)
    assert choice is not None
    assert choice.index == 1
    assert choice.met_target


def test_a_delay_that_buys_nothing_is_passed_over() -> None:
    # Less busy by noise, but one request per execution: the delay only adds its wait.
    results = [_result(0, 5.0, 0.30, merged=1.0), _result(2000, 7.0, 0.20, merged=1.1)]
    choice = recommend(results, 20.0)
    assert choice is not None
    assert choice.index == 0


def test_only_delays_that_buy_nothing_still_give_a_choice() -> None:
    results = [_result(500, 5.0, 0.30, merged=1.0), _result(2000, 7.0, 0.30, merged=1.0)]
    choice = recommend(results, 20.0)
    assert choice is not None
    assert choice.index == 0
    assert choice.met_target


def test_no_setting_meets_the_target() -> None:
    results = [_result(0, 40.0, 0.9), _result(500, 30.0, 0.9, errors=3), _result(2000, 35.0, 0.9)]
    choice = recommend(results, 20.0)
    # The fewest errors first, then the lowest p99.
    assert choice is not None
    assert choice.index == 2
    assert not choice.met_target
    assert "no setting meets p99 <= 20 ms" in choice.reason


def test_nothing_answered_gives_no_recommendation() -> None:
    assert recommend([_result(0, None, None, errors=1000)], 20.0) is None


def _report(results: list[SettingResult], rows: int = 1100) -> TuneReport:
    return TuneReport(
        url="127.0.0.1:8001",
        model="ranking_model",
        rate=100.0,
        rows=rows,
        rows_source="random rows, 121 wide",
        width=121,
        duration_s=10.0,
        warmup_s=2.0,
        p99_target_ms=20.0,
        original=Setting(0, 2048, 1),
        results=tuple(results),
        recommendation=recommend(results, 20.0),
        left_loaded="original",
    )


def test_the_table_flags_a_delay_that_buys_nothing() -> None:
    report = _report([_result(0, 5.0, 0.3, merged=1.0), _result(2000, 7.0, 0.3, merged=1.0)])
    text = render_text(report, ["wrote somewhere"])
    lines = text.splitlines()
    assert lines[3].endswith("meets <")  # delay 0, chosen
    assert lines[4].endswith("meets *")
    assert "* the delay buys nothing" in text
    # 1100-row requests with max_batch_size 2048: no two fit one execution.
    assert "max_batch_size 2048: no two chunks of up to 1100 rows" in text
    assert "--max-batch-sizes 2200" in text
    assert text.endswith("wrote somewhere")


def test_largest_chunk_follows_the_service_split() -> None:
    assert largest_chunk(1100, 2048) == 1100
    assert largest_chunk(1100, 256) == 220  # five even chunks
    assert largest_chunk(300, 256) == 150


def test_the_json_report_has_every_figure() -> None:
    report = _report([_result(0, 5.0, 0.3), _result(2000, 7.0, 0.1)])
    body = json.loads(json.dumps(report_json(report)))
    assert body["recommendation"]["setting"] == {
        "delay_us": 2000,
        "max_batch_size": 2048,
        "instances": 1,
    }
    assert body["recommendation"]["met_target"] is True
    assert body["chosen_config"] == {"delay": 2000}
    first = body["results"][0]
    for key in ("offered_rps", "throughput_rps", "p50_ms", "p99_ms", "max_ms", "errors"):
        assert key in first
    for key in ("executions", "inferences", "requests", "rows_per_execution"):
        assert key in first["triton"]
    assert first["triton"]["batch_sizes"] == {"300": 100}
    assert first["verdict"] == MEETS
    assert first["delay_buys_nothing"] is False
    assert "config" not in first


def test_outputs_are_written(tmp_path: Path) -> None:
    results = [_result(0, 5.0, 0.3), _result(2000, 7.0, 0.1)]
    results = [
        SettingResult(**{**_fields(r), "config": with_setting(TRITON_CONFIG, r.setting)})
        for r in results
    ]
    notes = write_outputs(_report(results), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.pbtxt",
        "tuning.json",
        "tuning.png",
    ]
    assert len(notes) == 3
    text = (tmp_path / "out" / "config.pbtxt").read_text()
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 2000
    assert (tmp_path / "out" / "tuning.png").read_bytes().startswith(b"\x89PNG")


def _fields(result: SettingResult) -> dict[str, Any]:
    return {name: getattr(result, name) for name in SettingResult.__dataclass_fields__}


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="recsys")
    tune.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["tune", "batching", *argv])


def test_the_rows_default_to_one_service_requests() -> None:
    args = _parse("--rate", "50", "--delays", "0, 500,2000", "--p99-ms", "20")
    fields = Settings.model_fields
    assert args.rows == ROWS
    assert fields["prerank_keep"].default == ROWS
    options = options_from(args)
    assert options.delays == (0, 500, 2000)
    assert options.max_batch_sizes is None
    assert options.instances is None
    assert options.url == "127.0.0.1:8001"
    assert options.model == "ranking_model"
    assert not options.keep


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "0"], "--rate must be > 0"),
        (["--rate", "nan"], "--rate must be > 0"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--rows", "0"], "--rows must be > 0"),
        (["--delays", "0,-5"], "--delays -5"),
        (["--max-batch-sizes", "0"], "--max-batch-sizes 0"),
        (["--instances", "0,1"], "--instances 0"),
    ],
)
def test_bad_options_are_refused_before_triton(argv: list[str], message: str) -> None:
    base = {"--rate": "50", "--delays": "0", "--p99-ms": "20"}
    pairs = dict(zip(argv[::2], argv[1::2], strict=True))
    args = _parse(*(part for pair in {**base, **pairs}.items() for part in pair))
    with pytest.raises(ConfigError, match=message):
        options_from(args)


def test_an_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    args = _parse("--rate", "5", "--delays", "0", "--p99-ms", "9", "--out", str(tmp_path / "file"))
    with pytest.raises(ConfigError, match="is a file"):
        options_from(args)


def test_a_list_that_is_not_numbers_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        _parse("--rate", "5", "--delays", "0,fast", "--p99-ms", "9")
