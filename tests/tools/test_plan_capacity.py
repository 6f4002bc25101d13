"""`recsys plan capacity`: the article's worked example, memory, CPU, a benchmark record, flags."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from recsys_tools import plan
from recsys_tools.plan import (
    CapacityInputs,
    plan_capacity,
    plan_from_benchmark,
    plan_json,
    render_text,
)

from app.core.errors import ConfigError

# The serving article's worked example (section 5.1): 2000 QPS, p99 50 ms, batch 8 in 3 ms.
EXAMPLE = CapacityInputs(qps=2000, p99_ms=50, batch_size=8, batch_latency_ms=3)


def _with(**changes: Any) -> CapacityInputs:
    fields = {name: getattr(EXAMPLE, name) for name in CapacityInputs.__dataclass_fields__}
    return CapacityInputs(**{**fields, **changes})


def _record(points: list[tuple[int, float, float]] | None = None) -> dict[str, Any]:
    """A small record shaped like docs/benchmarks.json, as python -m loadtest.bench writes it."""
    levels = points or [(1, 1189.4, 1.01), (2, 1392.4, 1.91), (3, 1457.4, 2.9), (4, 1700, 60.0)]
    return {
        "api_cpu_ms_per_request": 3.16,
        "max_rate_at_p99": 430.0,
        "triton_alone_max_rate_at_p99": 1457.4,
        "p99_bound_ms": 50.0,
        "candidates": 1100,
        "cpu": {"cpu_ms_per_request": {"api": 3.16, "redis": 0.08, "triton": 1.58}},
        "triton_alone": {
            "triton_alone_max_rate_at_p99": 1457.4,
            "rows": 1100,
            "points": [
                {"concurrency": c, "requests_per_s": rate, "p99_ms": p99} for c, rate, p99 in levels
            ],
        },
        "memory": {"api_rss_mb": 186.0, "held_data_mb": 34.6},
    }


def test_the_articles_worked_example_comes_out_exactly() -> None:
    plan = plan_capacity(EXAMPLE)

    assert plan.requests_per_second_per_instance == 2666.7  # 1000 / 3 x 8
    assert plan.derate == 0.7
    assert plan.usable_requests_per_second_per_gpu == 1866.7  # 2666.7 x 0.7
    assert plan.gpus == 2  # ceil(2000 x 1.5 / 1866.7) = ceil(1.61)
    assert plan.load_per_gpu == 0.536  # 1000 of 1866.7 ...
    assert plan.load_per_gpu < 0.6  # ... under the article's 60%
    assert plan.instances_per_gpu == 1
    assert plan.rank_p99_ms == 4.0  # 3 ms batch + 1 ms queue delay
    assert plan.warnings == ()
    assert plan.measured == ()
    assert "derate 0.7" in plan.assumed
    assert plan.steps[:5] == (
        "per instance: 1000 / 3 ms x 8 = 2666.7 requests/s",
        "ranking: 3 ms batch + 1 ms queue delay = 4 ms of the 50 ms p99 budget",
        "usable per GPU: 2666.7 x 0.7 (queueing and system overhead) = 1866.7 requests/s",
        "GPUs: ceil(2000 x (1 + 0.5 headroom) / 1866.7) = ceil(1.61) = 2",
        "load per GPU: 2000 / 2 / 1866.7 = 53.6% of usable",
    )
    assert "one GPU down: 2000 / 1 = 2000 requests/s each, 75% of 2666.7" in plan.steps


def test_the_article_host_floor_is_8_cores_per_gpu_and_64_gb() -> None:
    host = plan_capacity(EXAMPLE).host

    assert (host.hosts, host.gpus_per_host) == (1, 2)
    assert host.cpu_cores_per_host == 16
    assert host.host_memory_gb == 64
    assert host.api_cpu_cores is None  # no CPU figure given: the floor alone
    assert (host.storage, host.network) == ("SATA SSD", "10GbE")


def test_500_qps_fits_on_one_gpu() -> None:
    plan = plan_capacity(_with(qps=500))

    assert plan.gpus == 1  # ceil(750 / 1866.7) = ceil(0.40)
    assert plan.load_per_gpu == 0.268
    assert not any(step.startswith("one GPU down") for step in plan.steps)


def test_10000_qps_needs_9_gpus_on_2_hosts() -> None:
    plan = plan_capacity(_with(qps=10000))

    assert plan.gpus == 9  # ceil(15000 / 1866.7) = ceil(8.04)
    assert plan.load_per_gpu == 0.595  # 10000 / 9 / 1866.7
    assert "GPUs: ceil(10000 x (1 + 0.5 headroom) / 1866.7) = ceil(8.04) = 9" in plan.steps
    assert (plan.host.hosts, plan.host.gpus_per_host) == (2, 5)
    assert plan.host.cpu_cores_per_host == 40
    assert plan.host.network == "25GbE between hosts"


def test_an_exact_multiple_does_not_round_up_to_another_gpu() -> None:
    # 1000 / 5 x 10 = 2000/s, x 0.75 = 1500; 2000 x 1.5 / 1500 = 2.0 exactly.
    plan = plan_capacity(_with(batch_size=10, batch_latency_ms=5, derate=0.75))

    assert plan.gpus == 2
    assert plan.load_per_gpu == pytest.approx(2 / 3, abs=1e-3)


def test_headroom_and_derate_change_the_count() -> None:
    assert plan_capacity(_with(headroom=0)).gpus == 2  # ceil(2000 / 1866.7) = ceil(1.07)
    assert plan_capacity(_with(headroom=1)).gpus == 3  # ceil(4000 / 1866.7) = ceil(2.14)
    assert plan_capacity(_with(derate=1)).gpus == 2  # ceil(3000 / 2666.7) = ceil(1.12)


@pytest.mark.parametrize(
    ("gpu", "model", "activation", "instances"),
    [
        (16, 1.5, 4, 2),  # the article's 16 GB T4: (16 - 1) / 5.5 = 2.7 ("about 3" needs 16.5)
        (24, 1.5, 4, 4),  # (24 - 1) / 5.5 = 4.2
        (7, 3, 0, 2),  # (7 - 1) / 3 = 2.0 exactly
    ],
)
def test_instances_per_gpu_from_memory(
    gpu: float, model: float, activation: float, instances: int
) -> None:
    plan = plan_capacity(
        _with(gpu_memory_gb=gpu, model_memory_gb=model, activation_memory_gb=activation)
    )

    assert plan.instances_per_gpu == instances
    assert plan.gpus == 2  # the copies share one GPU's compute: the rate planned on is one's
    assert "1 instance per GPU" not in plan.assumed


def test_the_instance_arithmetic_is_shown() -> None:
    plan = plan_capacity(_with(gpu_memory_gb=16, model_memory_gb=1.5, activation_memory_gb=4))

    assert any(
        step.startswith("instances per GPU: floor((16 - 1 GB reserved) / (1.5 + 4 GB)) = 2")
        for step in plan.steps
    )


def test_a_model_that_does_not_fit_names_the_flags() -> None:
    with pytest.raises(ConfigError, match=r"--model-memory-gb 3 \+ --activation-memory-gb 4 .*"):
        plan_capacity(_with(gpu_memory_gb=6, model_memory_gb=3, activation_memory_gb=4))


def test_memory_flags_go_together() -> None:
    with pytest.raises(ConfigError, match="--gpu-memory-gb, --model-memory-gb, --activation"):
        plan_capacity(_with(gpu_memory_gb=16, model_memory_gb=1.5))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"qps": 0}, "--qps must be > 0"),
        ({"p99_ms": -5}, "--p99-ms must be > 0"),
        ({"p99_ms": math.nan}, "--p99-ms must be > 0"),
        ({"qps": math.inf}, "--qps must be > 0 and finite"),
        ({"batch_size": 0}, "--batch-size must be > 0"),
        ({"batch_latency_ms": 0}, "--batch-latency-ms must be > 0"),
        ({"derate": 0}, "--derate must be > 0"),
        ({"derate": 1.5}, "--derate must be <= 1"),
        ({"headroom": -0.1}, "--headroom must be >= 0"),
        ({"queue_delay_ms": -1}, "--queue-delay-ms must be >= 0"),
        ({"api_cpu_ms": 0}, "--api-cpu-ms must be > 0"),
        ({"gpus_per_host": 0}, "--gpus-per-host must be > 0"),
    ],
)
def test_invalid_inputs_name_the_flag(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_capacity(_with(**changes))


def test_without_a_batch_latency_or_a_benchmark_it_names_the_flags() -> None:
    with pytest.raises(ConfigError, match="--batch-latency-ms are needed, or --benchmark PATH"):
        plan_capacity(CapacityInputs(qps=2000, p99_ms=50, batch_size=8))


def test_a_batch_over_half_the_p99_budget_warns() -> None:
    plan = plan_capacity(_with(batch_latency_ms=30))

    assert plan.gpus == 17  # 1000 / 30 x 8 = 266.7, x 0.7 = 186.7; ceil(3000 / 186.7) = 17
    assert plan.warnings == (
        "the batch takes 30 ms, over 50% of the 50 ms p99 budget: "
        "little is left for features, recall and the network",
    )


def test_ranking_over_the_p99_budget_warns_but_still_plans() -> None:
    plan = plan_capacity(_with(batch_latency_ms=50, queue_delay_ms=2))

    assert plan.rank_p99_ms == 52.0
    assert "ranking alone (52 ms) exceeds the p99 budget" in plan.warnings


def test_cpu_cores_from_cpu_ms_per_request() -> None:
    example = plan_capacity(_with(api_cpu_ms=3.16)).host
    busy = plan_capacity(_with(qps=10000, api_cpu_ms=8)).host

    assert example.api_cpu_cores == 9.5  # 2000 x 3.16 / 1000 x 1.5 = 9.48
    assert example.cpu_cores_per_host == 16  # the 8-per-GPU floor is more
    assert busy.api_cpu_cores == 120.0  # 10000 x 8 / 1000 x 1.5
    assert busy.cpu_cores_per_host == 60  # 120 over 2 hosts, above 8 x 5


def test_an_embedding_table_in_memory_needs_twice_its_size() -> None:
    assert plan_capacity(_with(embedding_table_gb=40)).host.host_memory_gb == 80
    assert plan_capacity(_with(embedding_table_gb=20)).host.host_memory_gb == 64


def test_models_of_2_gb_or_more_get_nvme() -> None:
    plan = plan_capacity(_with(gpu_memory_gb=16, model_memory_gb=2, activation_memory_gb=1))

    assert plan.host.storage.startswith("NVMe SSD")


def test_a_benchmark_record_plans_from_measured_figures() -> None:
    plan = plan_from_benchmark(_record(), CapacityInputs(qps=2000, p99_ms=50))

    # The best level within 50 ms: 1457.4 at p99 2.9 ms (1700 at 60 ms is outside).
    assert plan.requests_per_second_per_instance == 1457.4
    assert plan.derate == 1.0  # measured at its p99: no assumed x0.7
    assert plan.usable_requests_per_second_per_gpu == 1457.4
    assert plan.gpus == 3  # ceil(3000 / 1457.4) = ceil(2.06)
    assert plan.load_per_gpu == 0.457
    assert plan.rank_p99_ms == 2.9
    assert plan.steps[0].startswith(
        "per GPU (measured): Triton alone served 1457.4 requests/s of 1100 candidates at p99 "
        "2.9 ms with 3 in flight"
    )
    assert any("x 1 (none: measured at its p99" in step for step in plan.steps)
    assert "requests/s per GPU (triton_alone)" in plan.measured
    assert "CPU ms per request (cpu)" in plan.measured
    assert not any(item.startswith("derate") for item in plan.assumed)


def test_a_benchmark_record_sizes_cpu_and_memory_from_its_figures() -> None:
    plan = plan_from_benchmark(
        _record(), CapacityInputs(qps=2000, p99_ms=50, embedding_table_gb=40)
    )

    assert "CPU: 2000 x 4.82 ms / 1000 x 1.5 = 14.5 cores" in plan.steps  # 3.16 + 0.08 + 1.58
    assert plan.host.api_cpu_cores == 9.5  # 2000 x 3.16 / 1000 x 1.5
    assert plan.host.cpu_cores_per_host == 24  # 8 per GPU x 3, above 14.5
    # 2 x 40 GB + 10 API processes x 186 MB = 81.8 GB
    assert plan.host.host_memory_gb == 82


def test_a_benchmark_with_a_tighter_budget_takes_the_level_within_it() -> None:
    plan = plan_from_benchmark(_record(), CapacityInputs(qps=2000, p99_ms=2))

    assert plan.requests_per_second_per_instance == 1392.4  # p99 1.91 ms, 2 in flight
    assert plan.gpus == 3  # ceil(3000 / 1392.4) = ceil(2.15)


def test_a_derate_applies_to_measured_figures_only_when_asked() -> None:
    plan = plan_from_benchmark(_record(), CapacityInputs(qps=2000, p99_ms=50, derate=0.7))

    assert plan.usable_requests_per_second_per_gpu == 1020.2  # 1457.4 x 0.7
    assert plan.gpus == 3  # ceil(3000 / 1020.2) = ceil(2.94)


def test_a_benchmark_without_a_level_inside_the_budget_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"within --p99-ms 0.5"):
        plan_from_benchmark(_record(), CapacityInputs(qps=2000, p99_ms=0.5))
    with pytest.raises(ConfigError, match=r"--benchmark: no Triton-alone level"):
        plan_from_benchmark({"max_rate_at_p99": 430.0}, CapacityInputs(qps=2000, p99_ms=50))


def test_the_json_has_the_documented_keys() -> None:
    figures = plan_json(plan_capacity(EXAMPLE))

    assert figures["requests_per_second_per_instance"] == 2666.7
    assert figures["gpus"] == 2
    assert {
        "usable_requests_per_second_per_gpu",
        "load_per_gpu",
        "instances_per_gpu",
        "api_cpu_cores",
        "cpu_cores_per_host",
        "host_memory_gb",
        "steps",
        "measured",
        "assumed",
        "warnings",
    } <= figures.keys()
    assert json.loads(json.dumps(figures)) == figures


def test_the_text_shows_the_arithmetic_and_the_plan() -> None:
    text = render_text(plan_capacity(EXAMPLE))

    assert "  per instance: 1000 / 3 ms x 8 = 2666.7 requests/s" in text
    assert "  GPUs: ceil(2000 x (1 + 0.5 headroom) / 1866.7) = ceil(1.61) = 2" in text
    assert "plan: 2 GPU(s) at 54% load, 1 instance(s) each; 1 host(s) of 2 GPU(s)" in text
    assert "measured: nothing" in text


def _parse(command_line: str) -> argparse.Namespace:
    """Parsed as the real `recsys` parser would: `plan` added among its sub-commands."""
    parser = argparse.ArgumentParser(prog="recsys")
    plan.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(command_line.split())


def test_the_command_prints_the_example_plan_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse("plan capacity --qps 2000 --p99-ms 50 --batch-size 8 --batch-latency-ms 3 --json")
    args.run(args)

    figures = json.loads(capsys.readouterr().out)
    assert figures["requests_per_second_per_instance"] == 2666.7
    assert figures["gpus"] == 2
    assert figures["load_per_gpu"] == 0.536


def test_the_command_plans_from_a_benchmark_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "benchmarks.json"
    record.write_text(json.dumps(_record()))
    args = _parse(f"plan capacity --qps 2000 --p99-ms 50 --benchmark {record}")
    args.run(args)

    text = capsys.readouterr().out
    assert "per GPU (measured): Triton alone served 1457.4 requests/s" in text
    assert "plan: 3 GPU(s)" in text


def test_the_command_without_figures_is_one_config_error() -> None:
    args = _parse("plan capacity --qps 2000 --p99-ms 50")

    with pytest.raises(ConfigError, match="--batch-size and --batch-latency-ms are needed"):
        args.run(args)


def test_an_unreadable_benchmark_names_the_flag(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")

    for path in (broken, tmp_path / "absent.json"):
        args = _parse(f"plan capacity --qps 1 --p99-ms 50 --benchmark {path}")
        with pytest.raises(ConfigError, match=re.escape(f"--benchmark {path}")):
            args.run(args)
