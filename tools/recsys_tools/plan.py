"""`recsys plan capacity`: GPUs, instances per GPU, CPU cores and memory per host from peak QPS.

From a batch's latency and size it follows the serving article's rules of thumb (sections
2.1, 5.1, 5.2); from a `python -m loadtest.bench` record it uses the measured figures instead.
Every plan shows its arithmetic and says which figures were measured and which assumed.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.core.errors import ConfigError
from recsys_tools.commands import Commands

ASSUMED_DERATE = 0.7  # an ideal batch rate loses about 30% to queueing and system overhead
HEADROOM = 0.5  # spare capacity for traffic spikes and a lost card
QUEUE_DELAY_MS = 1.0  # the article's max_queue_delay_microseconds: 1000
GPU_RESERVE_GB = 1.0  # the CUDA context and allocator slack, which no instance can use
BATCH_SHARE = 0.5  # past this share of p99, features, recall and the network are starved
CORES_PER_GPU = 8
MIN_HOST_MEMORY_GB = 64
GPUS_PER_HOST = 8
_EPS = 1e-9  # keeps float noise such as 2.0000000001 from costing another GPU
_MAY_BE_ZERO = {"headroom", "queue_delay_ms", "activation_memory_gb", "embedding_table_gb"}


@dataclass(frozen=True, slots=True)
class CapacityInputs:
    """The figures a plan starts from; each field is the flag of the same name."""

    qps: float
    p99_ms: float
    batch_size: int | None = None
    batch_latency_ms: float | None = None
    derate: float | None = None  # None: 0.7 for an assumed rate, 1 for a measured one
    headroom: float = HEADROOM
    queue_delay_ms: float = QUEUE_DELAY_MS
    gpu_memory_gb: float | None = None
    model_memory_gb: float | None = None
    activation_memory_gb: float | None = None
    api_cpu_ms: float | None = None  # the API's CPU per request; a benchmark's when None
    embedding_table_gb: float = 0.0  # held in host memory, if it is
    gpus_per_host: int = GPUS_PER_HOST


@dataclass(frozen=True, slots=True)
class Throughput:
    """What one instance serves and the ranking call's latency, assumed or measured."""

    requests_per_s: float
    rank_p99_ms: float
    compute_ms: float
    steps: tuple[str, ...]
    measured: tuple[str, ...] = ()
    api_cpu_ms: float | None = None
    other_cpu_ms: float = 0.0  # Redis's and Triton's CPU per request, when measured
    api_rss_mb: float | None = None


@dataclass(frozen=True, slots=True)
class HostPlan:
    hosts: int
    gpus_per_host: int
    api_cpu_cores: float | None
    cpu_cores_per_host: int
    host_memory_gb: int
    storage: str
    network: str


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    requests_per_second_per_instance: float
    derate: float
    usable_requests_per_second_per_gpu: float
    gpus: int
    load_per_gpu: float
    instances_per_gpu: int
    rank_p99_ms: float
    host: HostPlan
    measured: tuple[str, ...]
    assumed: tuple[str, ...]
    steps: tuple[str, ...]
    warnings: tuple[str, ...]


def _n(value: float) -> str:
    text = f"{value:.1f}"
    return text.removesuffix(".0")


def _validate(inputs: CapacityInputs) -> None:
    for name in CapacityInputs.__dataclass_fields__:
        value, zero_ok = getattr(inputs, name), name in _MAY_BE_ZERO
        # Written as `not (...)` so that NaN fails too; infinity would break the rounding.
        if value is not None and not (
            math.isfinite(value) and (value >= 0 if zero_ok else value > 0)
        ):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} must be {'>=' if zero_ok else '>'} 0 and finite (got {value:g})"
            )
    if inputs.derate is not None and inputs.derate > 1:
        raise ConfigError(f"--derate must be <= 1 (got {inputs.derate:g})")
    memory = (inputs.gpu_memory_gb, inputs.model_memory_gb, inputs.activation_memory_gb)
    if len({size is None for size in memory}) > 1:
        raise ConfigError("--gpu-memory-gb, --model-memory-gb, --activation-memory-gb go together")


def plan_capacity(inputs: CapacityInputs) -> CapacityPlan:
    """The plan from one batch's latency and size: the article's arithmetic (section 5.1)."""
    _validate(inputs)
    size, latency, queue = inputs.batch_size, inputs.batch_latency_ms, inputs.queue_delay_ms
    if size is None or latency is None:
        raise ConfigError("--batch-size and --batch-latency-ms are needed, or --benchmark PATH")
    rate = 1000.0 / latency * size
    steps = (
        f"per instance: 1000 / {_n(latency)} ms x {size} = {_n(rate)} requests/s",
        f"ranking: {_n(latency)} ms batch + {_n(queue)} ms queue delay = "
        f"{_n(latency + queue)} ms of the {_n(inputs.p99_ms)} ms p99 budget",
    )
    return _plan(inputs, Throughput(rate, latency + queue, latency, steps), ASSUMED_DERATE)


def _figure(record: Any, *path: str) -> float | None:
    for key in path:
        record = record.get(key) if isinstance(record, Mapping) else None
    ok = isinstance(record, int | float) and not isinstance(record, bool)
    return float(record) if ok else None


def plan_from_benchmark(record: Mapping[str, Any], inputs: CapacityInputs) -> CapacityPlan:
    """The plan from a `python -m loadtest.bench` record: Triton alone's measured rate."""
    _validate(inputs)
    alone = record.get("triton_alone")
    points = alone.get("points") if isinstance(alone, Mapping) else None
    levels = [
        (_figure(p, "requests_per_s") or 0.0, p99, _figure(p, "concurrency") or 0.0)
        for p in (points if isinstance(points, list) else [])
        if (p99 := _figure(p, "p99_ms")) is not None and p99 <= inputs.p99_ms
    ]
    if not levels or max(levels)[0] <= 0:
        raise ConfigError(
            f"--benchmark: no Triton-alone level (triton_alone.points) within --p99-ms "
            f"{_n(inputs.p99_ms)}; run python -m loadtest.bench with Triton up"
        )
    rate, p99, in_flight = max(levels)
    candidates = _figure(record, "candidates")
    cpu = {k: _figure(record, "cpu", "cpu_ms_per_request", k) for k in ("api", "redis", "triton")}
    api = cpu["api"] if cpu["api"] is not None else _figure(record, "api_cpu_ms_per_request")
    rss = _figure(record, "memory", "api_rss_mb")
    steps = (
        f"per GPU (measured): Triton alone served {_n(rate)} requests/s"
        f"{f' of {candidates:.0f} candidates' if candidates else ''} at p99 {p99:g} ms with "
        f"{in_flight:.0f} in flight, its best level within {_n(inputs.p99_ms)} ms",
        "that Triton ran on the benchmark host's device with its instance count: "
        "plan GPUs from a run on the target GPU",
    )
    measured: tuple[str, ...] = ("requests/s per GPU (triton_alone)", "ranking p99 (triton_alone)")
    measured += ("CPU ms per request (cpu)",) if api is not None else ()
    measured += ("API resident memory (memory)",) if rss is not None else ()
    other = (cpu["redis"] or 0.0) + (cpu["triton"] or 0.0)
    return _plan(inputs, Throughput(rate, p99, p99, steps, measured, api, other, rss), 1.0)


def _instances(inputs: CapacityInputs) -> tuple[int, str]:
    """Copies of the model one GPU holds (section 2.1): the instance_group count to set."""
    gpu, model, act = inputs.gpu_memory_gb, inputs.model_memory_gb, inputs.activation_memory_gb
    if gpu is None or model is None or act is None:
        return 1, "instances per GPU: 1 (assumed; --gpu-memory-gb and the model's sizes give it)"
    count = math.floor((gpu - GPU_RESERVE_GB) / (model + act) + _EPS)
    if count < 1:
        raise ConfigError(
            f"--model-memory-gb {model:g} + --activation-memory-gb {act:g} do not fit in "
            f"--gpu-memory-gb {gpu:g} less {GPU_RESERVE_GB:g} GB reserved"
        )
    # Copies overlap batches but share one GPU's compute: the rate planned on counts one.
    return count, (
        f"instances per GPU: floor(({gpu:g} - {GPU_RESERVE_GB:g} GB reserved) / ({model:g} + "
        f"{act:g} GB)) = {count}, the instance_group count (the rate planned on stays the same)"
    )


def _host_plan(inputs: CapacityInputs, source: Throughput, gpus: int) -> tuple[HostPlan, list[str]]:
    """CPU and memory per host: the article's floor (section 5.2), or the measured need."""
    qps, spare, table = inputs.qps, 1 + inputs.headroom, inputs.embedding_table_gb
    hosts = math.ceil(gpus / inputs.gpus_per_host)
    per_host = math.ceil(gpus / hosts)
    api_ms = inputs.api_cpu_ms if inputs.api_cpu_ms is not None else source.api_cpu_ms
    cores, api_cores, steps = CORES_PER_GPU * per_host, None, []
    why = f"{CORES_PER_GPU} per GPU x {per_host}"
    held, need_gb = f"2 x {table:g} GB embedding table", 2 * table  # room to load the next one
    if api_ms is not None:
        cpu_ms = api_ms + source.other_cpu_ms
        need = qps * cpu_ms / 1000 * spare
        steps.append(f"CPU: {_n(qps)} x {cpu_ms:g} ms / 1000 x {spare:g} = {need:.1f} cores")
        cores = max(cores, math.ceil(need / hosts - _EPS))
        why = f"max({why}, {need:.1f} / {hosts} host(s))"
        api_cores = qps * api_ms / 1000 * spare
        workers = math.ceil(api_cores / hosts - _EPS)  # one API process per busy core
        if source.api_rss_mb is not None:
            held += f" + {workers} API processes x {source.api_rss_mb:g} MB"
            need_gb += workers * source.api_rss_mb / 1024
    memory = math.ceil(max(MIN_HOST_MEMORY_GB, need_gb) - _EPS)
    steps.append(f"cores per host: {why} = {cores}")
    steps.append(f"memory per host: max({MIN_HOST_MEMORY_GB} GB, {held}) = {memory} GB")
    big_model = (inputs.model_memory_gb or 0) >= 2
    return HostPlan(
        hosts,
        per_host,
        None if api_cores is None else round(api_cores, 1),
        cores,
        memory,
        "NVMe SSD (2 GB+ models reload in seconds)" if big_model else "SATA SSD",
        "10GbE" if hosts == 1 else "25GbE between hosts",
    ), steps


def _warnings(inputs: CapacityInputs, source: Throughput, gpus: int) -> tuple[str, ...]:
    found, budget = [], inputs.p99_ms
    if gpus > 1 and inputs.qps / (gpus - 1) > source.requests_per_s:
        found.append("with one GPU down the others get more than they can serve")
    if source.rank_p99_ms > budget:
        found.append(f"ranking alone ({_n(source.rank_p99_ms)} ms) exceeds the p99 budget")
    if source.compute_ms > BATCH_SHARE * budget:
        found.append(
            f"the batch takes {_n(source.compute_ms)} ms, over {BATCH_SHARE:.0%} of the "
            f"{_n(budget)} ms p99 budget: little is left for features, recall and the network"
        )
    return tuple(found)


def _plan(inputs: CapacityInputs, source: Throughput, default_derate: float) -> CapacityPlan:
    qps, headroom, rate = inputs.qps, inputs.headroom, source.requests_per_s
    derate = default_derate if inputs.derate is None else inputs.derate
    usable = rate * derate
    need = qps * (1 + headroom) / usable
    gpus = max(1, math.ceil(need - _EPS))
    load = qps / gpus / usable
    why = "queueing and system overhead" if inputs.derate is None else "--derate"
    if source.measured and inputs.derate is None:
        why = "none: measured at its p99, queueing included; --derate sets one"
    steps = [
        *source.steps,
        f"usable per GPU: {_n(rate)} x {derate:g} ({why}) = {_n(usable)} requests/s",
        f"GPUs: ceil({_n(qps)} x (1 + {headroom:g} headroom) / {_n(usable)}) = "
        f"ceil({need:.2f}) = {gpus}",
        f"load per GPU: {_n(qps)} / {gpus} / {_n(usable)} = {load:.1%} of usable",
    ]
    if gpus > 1:
        down = qps / (gpus - 1)
        steps.append(
            f"one GPU down: {_n(qps)} / {gpus - 1} = {_n(down)} requests/s each, "
            f"{down / rate:.0%} of {_n(rate)}"
        )
    instances, instance_step = _instances(inputs)
    host, host_steps = _host_plan(inputs, source, gpus)
    assumed = [f"headroom {headroom:g}", f"{CORES_PER_GPU} cores per GPU, 64 GB per host"]
    if not source.measured:
        assumed[:0] = [f"derate {derate:g}", f"queue delay {inputs.queue_delay_ms:g} ms"]
    if inputs.gpu_memory_gb is None:
        assumed.append("1 instance per GPU")
    return CapacityPlan(
        requests_per_second_per_instance=round(rate, 1),
        derate=derate,
        usable_requests_per_second_per_gpu=round(usable, 1),
        gpus=gpus,
        load_per_gpu=round(load, 3),
        instances_per_gpu=instances,
        rank_p99_ms=round(source.rank_p99_ms, 2),
        host=host,
        measured=source.measured,
        assumed=tuple(assumed),
        steps=(*steps, instance_step, *host_steps),
        warnings=_warnings(inputs, source, gpus),
    )


def plan_json(plan: CapacityPlan) -> dict[str, Any]:
    """The plan as one flat object; host figures sit beside the GPU ones."""
    figures = asdict(plan)
    figures.update(figures.pop("host"))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in figures.items()}


def render_text(plan: CapacityPlan) -> str:
    host = plan.host
    return "\n".join(
        [
            *(f"  {step}" for step in plan.steps),
            f"plan: {plan.gpus} GPU(s) at {plan.load_per_gpu:.0%} load, {plan.instances_per_gpu} "
            f"instance(s) each; {host.hosts} host(s) of {host.gpus_per_host} GPU(s), "
            f"{host.cpu_cores_per_host} cores, {host.host_memory_gb} GB, {host.storage}, "
            f"{host.network}",
            f"measured: {', '.join(plan.measured) or 'nothing'}",
            f"assumed: {', '.join(plan.assumed)}",
            *(f"warning: {warning}" for warning in plan.warnings),
        ]
    )


def _run_capacity(args: argparse.Namespace) -> None:
    fields = {k: v for k, v in vars(args).items() if k in CapacityInputs.__dataclass_fields__}
    inputs = CapacityInputs(**fields)
    if args.benchmark is None:
        plan = plan_capacity(inputs)
    else:
        try:
            record = json.loads(Path(args.benchmark).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--benchmark {args.benchmark}: {exc}") from None
        if not isinstance(record, dict):
            raise ConfigError(f"--benchmark {args.benchmark}: not a loadtest.bench record")
        plan = plan_from_benchmark(record, inputs)
    print(json.dumps(plan_json(plan), indent=2) if args.json else render_text(plan))


def register(commands: Commands) -> None:
    """`plan capacity` and its options, run through `args.run` like every other command."""
    plan = commands.add_parser("plan", help="capacity planning")
    capacity = plan.add_subparsers(dest="plan_command", required=True).add_parser(
        "capacity", help="GPUs, instances, CPU and memory from peak QPS and a measured latency"
    )
    add = capacity.add_argument
    add("--qps", type=float, required=True, help="peak requests/s")
    add("--p99-ms", type=float, required=True, help="the end-to-end p99 budget")
    add("--batch-size", type=int, help="requests in the batch measured")
    add("--batch-latency-ms", type=float, help="that batch's inference time")
    add("--benchmark", type=Path, help="a python -m loadtest.bench JSON record instead")
    add("--derate", type=float, help="default 0.7; 1 with --benchmark (measured)")
    add("--headroom", type=float, default=HEADROOM, help="spare share (default 0.5)")
    add("--queue-delay-ms", type=float, default=QUEUE_DELAY_MS, help="the batcher's wait")
    add("--gpu-memory-gb", type=float)
    add("--model-memory-gb", type=float)
    add("--activation-memory-gb", type=float, help="the largest batch's tensors")
    add("--api-cpu-ms", type=float, help="API CPU per request (default: the benchmark's)")
    add("--embedding-table-gb", type=float, default=0.0, help="if held in host memory")
    add("--gpus-per-host", type=int, default=GPUS_PER_HOST)
    add("--json", action="store_true", help="print the plan as JSON")
    capacity.set_defaults(run=_run_capacity)
