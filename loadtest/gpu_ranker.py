"""The ranking model on a GPU, beside onnxruntime on the same host's CPU: what a GPU buys.

Runs where PyTorch sees a CUDA GPU and needs nothing of the service (numpy, onnx,
onnxruntime and torch only), so it can run on a GPU host that has no Triton yet:

    python -m loadtest.gpu_ranker --world var/world --world var/movies --out gpu.json

The served ONNX graph (the exporter's few operators: MatMul, Add, Sub, Mul, Relu, Sigmoid,
Slice, Max, Log, ReduceSum) is run node by node in PyTorch on the GPU, so the figures are the
model's own math and copies, with no Triton, no gRPC and no TensorRT between (a TensorRT
engine fuses the nodes and should be at least as fast). For each world it reports:

- the error of each precision against onnxruntime's FP32 on the CPU, on the world's held-out
  rows: FP32 (TF32 off), TF32, FP16 with the score's tail in FP32 (as `recsys model
  build-engine` pins it, `tools/recsys_tools/model/precision.py`) and FP16 whole;
- the candidates each precision makes equal that FP32 told apart, per 500-row request;
- per batch of 1 to 8,192 rows: the GPU's own time (a CUDA graph's replay, timed by CUDA
  events), one whole execution from pinned host memory (copy in, run, copy the score back,
  host clock), and onnxruntime on this host's CPU (all its cores, and two), side by side;
- the GPU memory one execution takes at each batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.world.layout import HOLDOUT_FILE, MODEL_FILE

BATCHES = (1, 8, 64, 256, 500, 1024, 2048, 4096, 8192)
REQUEST_ROWS = 500
HEADS_MATMUL = "net_heads_m"  # as tools/recsys_tools/model/precision.py names the tail
BLEND_PREFIX = "blend_"
PRECISIONS = ("fp32", "tf32", "fp16_tail32", "fp16")


def score_tail(graph: Any) -> set[str]:
    """The nodes from the heads' logits to the score, and the blend's (precision.py's rule)."""
    reached: set[str] = set()
    names: set[str] = set()
    for node in graph.node:
        downstream = node.name == HEADS_MATMUL or any(name in reached for name in node.input)
        if downstream or node.name.startswith(BLEND_PREFIX):
            reached.update(node.output)
            names.add(node.name)
    return names


@dataclass
class TorchGraph:
    """The ONNX graph as PyTorch calls: the tower in `tower_dtype`, the tail in FP32."""

    nodes: list[tuple[str, list[str], str, bool]]
    constants: dict[str, Any]
    input_name: str
    outputs: list[str]
    tower_dtype: Any

    @classmethod
    def of(cls, model: Any, precision: str, device: Any) -> TorchGraph:
        import torch
        from onnx import numpy_helper

        graph = model.graph
        tail = score_tail(graph) if precision == "fp16_tail32" else set()
        dtype = torch.float16 if precision.startswith("fp16") else torch.float32
        constants: dict[str, Any] = {}
        nodes = []
        for node in graph.node:
            in_tail = node.name in tail
            nodes.append((node.op_type, list(node.input), node.output[0], in_tail))
        tail_inputs = {i for node in graph.node if node.name in tail for i in node.input}
        for initializer in graph.initializer:
            value = torch.from_numpy(numpy_helper.to_array(initializer).copy())
            if value.is_floating_point():
                # Index constants stay on the host: read as Python ints, never synchronising
                # (a CUDA graph's capture forbids it).
                value = value.to(device)
                if initializer.name not in tail_inputs:
                    value = value.to(dtype)
            constants[initializer.name] = value
        outputs = [output.name for output in graph.output]
        return cls(nodes, constants, graph.input[0].name, outputs, dtype)

    def __call__(self, rows: Any) -> list[Any]:
        import torch

        values = dict(self.constants)
        values[self.input_name] = rows.to(self.tower_dtype)
        row32 = rows.float()
        for op, inputs, output, in_tail in self.nodes:
            args = [values[name] for name in inputs]
            if in_tail:
                args = [
                    row32
                    if name == self.input_name
                    else (a.float() if a.is_floating_point() else a)
                    for name, a in zip(inputs, args, strict=True)
                ]
            values[output] = _OPS[op](*args)
        return [
            values[name].float() if torch.is_tensor(values[name]) else values[name]
            for name in self.outputs
        ]


def _slice(x: Any, starts: Any, ends: Any, axes: Any) -> Any:
    out = x
    for start, end, axis in zip(starts.tolist(), ends.tolist(), axes.tolist(), strict=True):
        out = out.narrow(int(axis), int(start), min(int(end), out.shape[int(axis)]) - int(start))
    return out


def _ops() -> dict[str, Callable[..., Any]]:
    import torch

    return {
        "MatMul": torch.matmul,
        "Add": torch.add,
        "Sub": torch.sub,
        "Mul": torch.mul,
        "Relu": torch.relu,
        "Sigmoid": torch.sigmoid,
        "Log": torch.log,
        "Max": torch.maximum,
        "Slice": _slice,
        "ReduceSum": lambda x, axes: x.sum(dim=[int(a) for a in axes.tolist()], keepdim=True),
    }


_OPS: dict[str, Callable[..., Any]] = {}


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000.0, 4)


def _ort_session(path: Path, threads: int | None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _ort_ms(session: Any, rows: np.ndarray, repeats: int) -> float:
    name = session.get_inputs()[0].name
    session.run(None, {name: rows})
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, {name: rows})
        samples.append(time.perf_counter() - start)
    return _median_ms(samples)


def _ties(full: np.ndarray, reduced: np.ndarray) -> int:
    groups, inverse = np.unique(reduced, return_inverse=True)
    lost = 0
    for group in range(len(groups)):
        members = full[inverse == group]
        if len(members) > 1:
            lost += len(np.unique(members)) - 1
    return lost


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positives = labels > 0
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if not n_pos or not n_neg:
        return float("nan")
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _accuracy(
    model: Any, path: Path, rows: np.ndarray, labels: np.ndarray, device: Any
) -> dict[str, Any]:
    import torch

    reference = _ort_session(path, None)
    name = reference.get_inputs()[0].name
    base = reference.run(None, {name: rows})[0][:, 0].astype(np.float64)
    report: dict[str, Any] = {"rows": len(rows), "auc_fp32_cpu": round(_auc(labels, base), 6)}
    for precision in PRECISIONS:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        graph = TorchGraph.of(model, precision, device)
        with torch.no_grad():
            scores = graph(torch.from_numpy(rows).to(device))[0][:, 0].double().cpu().numpy()
        requests = [
            slice(s, s + REQUEST_ROWS) for s in range(0, len(rows) - REQUEST_ROWS + 1, REQUEST_ROWS)
        ]
        ties = sum(_ties(base[r], scores[r]) for r in requests)
        top = [
            len(set(np.argsort(-base[r])[:20]) & set(np.argsort(-scores[r])[:20])) / 20
            for r in requests
        ]
        report[precision] = {
            "relative_error": float(np.linalg.norm(scores - base) / np.linalg.norm(base)),
            "max_abs_diff": float(np.abs(scores - base).max()),
            "auc_loss": round(_auc(labels, base) - _auc(labels, scores), 6),
            "ties_added": int(ties),
            "requests": len(requests),
            "top20_kept": round(float(np.mean(top)), 4) if top else None,
        }
    torch.backends.cuda.matmul.allow_tf32 = False
    return report


def _gpu_times(
    graph: TorchGraph, width: int, batch: int, repeats: int, device: Any
) -> dict[str, float]:
    import torch

    cuda: Any = torch.cuda  # its stubs leave Stream and Event untyped

    rng = np.random.default_rng(batch)
    host = torch.from_numpy(rng.standard_normal((batch, width)).astype(np.float32)).pin_memory()
    score_host = torch.empty((batch, 1), dtype=torch.float32).pin_memory()
    static_in = host.to(device)
    stream = cuda.Stream()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):
            graph(static_in)
        stream.synchronize()
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph, stream=stream):
            static_out = graph(static_in)[0]
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    starts = [cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [cuda.Event(enable_timing=True) for _ in range(repeats)]
    with torch.cuda.stream(stream):
        for _ in range(10):
            cuda_graph.replay()
        for start, end in zip(starts, ends, strict=True):
            start.record(stream)
            cuda_graph.replay()
            end.record(stream)
    torch.cuda.synchronize()
    compute = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    whole: list[float] = []
    eager: list[float] = []
    with torch.no_grad(), torch.cuda.stream(stream):
        for k in range(repeats + 10):
            began = time.perf_counter()
            static_in.copy_(host, non_blocking=True)
            cuda_graph.replay()
            score_host.copy_(static_out, non_blocking=True)
            stream.synchronize()
            if k >= 10:
                whole.append(time.perf_counter() - began)
        for k in range(repeats // 4 + 5):
            began = time.perf_counter()
            out = graph(host.to(device, non_blocking=True))[0].cpu()
            if k >= 5:
                eager.append(time.perf_counter() - began)
    del out
    return {
        "gpu_graph_ms": round(compute, 4),
        "whole_ms": _median_ms(whole),
        "eager_whole_ms": _median_ms(eager),
        "peak_bytes": int(peak),
    }


def _latency(model: Any, path: Path, width: int, repeats: int, device: Any) -> list[dict[str, Any]]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    graphs = {p: TorchGraph.of(model, p, device) for p in ("fp32", "fp16_tail32")}
    cpu_all, cpu_two = _ort_session(path, None), _ort_session(path, 2)
    table = []
    for batch in BATCHES:
        rows = np.random.default_rng(batch).standard_normal((batch, width)).astype(np.float32)
        cpu_repeats = max(5, min(repeats, 20_000 // batch))
        entry: dict[str, Any] = {
            "batch": batch,
            "cpu_ort_all_cores_ms": _ort_ms(cpu_all, rows, cpu_repeats),
            "cpu_ort_2_threads_ms": _ort_ms(cpu_two, rows, cpu_repeats),
        }
        for precision, graph in graphs.items():
            try:
                entry[precision] = _gpu_times(graph, width, batch, repeats, device)
            except RuntimeError as exc:  # recorded, so one failure leaves the other figures
                entry[precision] = {"error": str(exc)[:300]}
                print(f"  batch {batch} {precision}: {exc}", flush=True)
        if any("error" in entry[p] for p in graphs):
            table.append(entry)
            continue
        whole = entry["fp32"]["whole_ms"]
        entry["rows_per_s_fp32_whole"] = round(batch / (whole / 1000.0))
        entry["cpu_all_over_gpu_whole"] = round(entry["cpu_ort_all_cores_ms"] / whole, 2)
        table.append(entry)
        print(
            f"  batch {batch:5d}: cpu(all) {entry['cpu_ort_all_cores_ms']:8.3f} ms  "
            f"cpu(2) {entry['cpu_ort_2_threads_ms']:8.3f} ms  "
            f"gpu fp32 graph {entry['fp32']['gpu_graph_ms']:7.4f} whole {whole:7.4f} "
            f"eager {entry['fp32']['eager_whole_ms']:7.4f}  "
            f"fp16 graph {entry['fp16_tail32']['gpu_graph_ms']:7.4f} "
            f"whole {entry['fp16_tail32']['whole_ms']:7.4f} ms",
            flush=True,
        )
    return table


def _device_facts() -> dict[str, Any]:
    import onnxruntime
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "onnxruntime": onnxruntime.__version__,
        "cpu_cores": len(__import__("os").sched_getaffinity(0)),
    }


def run_world(world: Path, repeats: int, device: Any) -> dict[str, Any]:
    import onnx

    path = world / MODEL_FILE
    model = onnx.load(str(path))
    width = int(model.graph.input[0].type.tensor_type.shape.dim[1].dim_value)
    with np.load(world / HOLDOUT_FILE) as saved:
        rows, labels = saved["rows"].astype(np.float32), saved["labels"].astype(np.int8)
    ops = sorted({node.op_type for node in model.graph.node})
    print(f"{world}: width {width}, {len(rows)} held-out rows, ops {ops}", flush=True)
    accuracy = _accuracy(model, path, rows, labels, device)
    for precision in PRECISIONS:
        print(f"  {precision}: {accuracy[precision]}", flush=True)
    return {
        "world": str(world),
        "width": width,
        "nodes": len(model.graph.node),
        "accuracy": accuracy,
        "latency": _latency(model, path, width, repeats, device),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=Path, action="append", required=True)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU is visible to PyTorch", file=sys.stderr)
        return 2
    _OPS.update(_ops())
    device = torch.device("cuda")
    report: dict[str, Any] = {"device": _device_facts(), "worlds": []}
    print(report["device"], flush=True)
    for world in args.world:
        try:
            report["worlds"].append(run_world(world, args.repeats, device))
        except Exception as exc:  # the next world still runs; the report says what failed
            report["worlds"].append({"world": str(world), "error": repr(exc)[:500]})
            print(f"{world}: {exc!r}", flush=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
