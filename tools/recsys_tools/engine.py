"""`recsys model build-engine`: the world's ranker as a TensorRT engine for the serving Triton.

An engine only loads in the TensorRT version that built it, so it is built by the serving
release itself: with `--engine ort-trt` (the default) Triton's onnxruntime backend builds it
inside the serving image when the model loads, into the engine cache; with `--engine plan`
trtexec builds a TensorRT plan in the TensorRT image of the same release. One optimisation
profile covers every chunk the service sends: 1 row, a typical request's chunk, and
max_batch_size. INT8 is calibrated on the world's held-out packed rows.

Everything that needs no GPU is done and checked here (shapes, names, config, release, the
calibration); the GPU steps are printed, and run when this host has a GPU and podman.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.errors import ConfigError
from app.settings import Settings

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from app.schema import FeatureSchema
    from recsys_tools.model_compare import Holdout

    FloatArray = npt.NDArray[np.float32]

ENGINES = ("ort-trt", "plan")
PRECISIONS = ("fp16", "fp32", "int8")
DEFAULT_CONFIG = Path("deploy/triton/gpu/ranking_model/config.pbtxt")
TRITON_QUADLET = Path("deploy/quadlet/recsys-triton.container")
CACHE_QUADLET = Path("deploy/quadlet/recsys-trt-cache.volume")
DEFAULT_CACHE_VOLUME = "recsys-trt-cache"
# A request ranks its recalled candidates plus the popular ones mixed in.
REQUEST_ROWS: int = (
    Settings.model_fields["candidate_count"].default
    + Settings.model_fields["popular_candidates"].default
)
CALIBRATION_ROWS = 4096
IDENTITY_ROWS = 256  # random rows: the TensorRT-ready copy must score them as the original does
IDENTITY_TOLERANCE = 1e-6
ML_DOMAIN = "ai.onnx.ml"
TENSORRT_ACCELERATOR = "tensorrt"
# Every key the onnxruntime backend accepts for its TensorRT accelerator (its README's table
# and src/onnxruntime.cc); it refuses to load a model whose config has any other.
ACCELERATOR_KEYS = frozenset(
    {
        "precision_mode",
        "max_workspace_size_bytes",
        "trt_max_partition_iterations",
        "trt_min_subgraph_size",
        "int8_calibration_table_name",
        "int8_use_native_calibration_table",
        "trt_dla_enable",
        "trt_dla_core",
        "trt_engine_cache_enable",
        "trt_engine_cache_path",
        "trt_engine_cache_prefix",
        "trt_dump_subgraphs",
        "trt_force_sequential_engine_build",
        "trt_context_memory_sharing_enable",
        "trt_layer_norm_fp32_fallback",
        "trt_timing_cache_enable",
        "trt_timing_cache_path",
        "trt_force_timing_cache",
        "trt_detailed_build_log",
        "trt_build_heuristics_enable",
        "trt_sparsity_enable",
        "trt_builder_optimization_level",
        "trt_auxiliary_streams",
        "trt_tactic_sources",
        "trt_extra_plugin_lib_paths",
        "trt_profile_min_shapes",
        "trt_profile_opt_shapes",
        "trt_profile_max_shapes",
        "trt_cuda_graph_enable",
        "trt_dump_ep_context_model",
        "trt_ep_context_file_path",
        "trt_ep_context_embed_mode",
    }
)
ONNX_FLOAT = 1  # onnx.TensorProto.FLOAT
VERSION_DIR = "1"
BUILD_DIR = "build"  # not a number: Triton skips it when it lists the model's versions
CALIBRATION_DIR = "calibration"
# The check server: loopback ports beside production's 8001/8002, and the image's own user.
CHECK_CONTAINER = "recsys-build-engine"
CHECK_HTTP_PORT = 18000
CHECK_GRPC_PORT = 18001
TRITON_USER = "1000:1000"
READY_POLLS, READY_POLL_S = 180, 5  # 15 minutes for the first engine build and the warmup
PERF_CONCURRENCY = "1:4"

_IMAGE = re.compile(
    r"^(?P<repo>[^\s@:]+(?::\d+)?(?:/[^\s@:]+)*)/tritonserver:"
    r"(?P<release>\d{2}\.\d{2})-py3(?P<flavour>(?:-[a-z0-9]+)*)$"
)
_NOT_SERVING = {"-sdk": "the client SDK image", "-min": "the image without backends"}

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Release:
    """The serving image and the images of the same release that build for and measure it."""

    triton_image: str
    release: str
    tensorrt_image: str
    sdk_image: str


@dataclass(frozen=True, slots=True)
class Profile:
    input_name: str
    width: int
    min_rows: int
    opt_rows: int
    max_rows: int
    request_rows: int

    def shape(self, rows: int) -> str:
        return f"{self.input_name}:{rows}x{self.width}"

    @property
    def shapes(self) -> dict[str, str]:
        return {
            "min": self.shape(self.min_rows),
            "opt": self.shape(self.opt_rows),
            "max": self.shape(self.max_rows),
        }


@dataclass(frozen=True, slots=True)
class Command:
    stage: str  # "build": run here when there is a GPU; "verify": printed for the operator
    purpose: str
    argv: tuple[str, ...]

    @property
    def shell(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True, slots=True)
class BuildOptions:
    world: Path
    config: Path
    out: Path
    triton_image: str
    precision: str = "fp16"
    engine: str = "ort-trt"
    calibration_rows: int = CALIBRATION_ROWS
    request_rows: int = REQUEST_ROWS
    cache_volume: str = DEFAULT_CACHE_VOLUME
    dry_run: bool = False


@dataclass(slots=True)
class EngineReport:
    world: str
    config: str
    out: str
    model: str
    engine: str
    precision: str
    release: Release
    profile: Profile
    checks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    dry_run: str | None = None  # why the build commands were not run; None when they ran
    timings_s: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        report = asdict(self)
        report["profile"] = asdict(self.profile) | {"shapes": self.profile.shapes}
        report["commands"] = [asdict(c) | {"shell": c.shell} for c in self.commands]
        return report


# --- the serving image and its release -------------------------------------------------


def quadlet_value(path: Path, key: str) -> str | None:
    """The value of `key=` in a quadlet unit, None when the file or the key is absent."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        name, sep, value = line.strip().partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return None


def release_of(image: str) -> Release:
    """The release (YY.MM) of a tritonserver image, and the same release's TensorRT image."""
    found = _IMAGE.match(image)
    if found is None:
        raise ConfigError(
            f"serving image {image!r} has no release tag (REGISTRY/tritonserver:YY.MM-py3): pin "
            "the tag the service runs (an engine loads only in the TensorRT that built it)"
        )
    repo, release, flavour = found["repo"], found["release"], found["flavour"]
    if not 1 <= int(release.split(".")[1]) <= 12:
        raise ConfigError(f"serving image {image!r}: {release} is not a YY.MM release")
    if flavour in _NOT_SERVING:
        raise ConfigError(
            f"serving image {image!r} is {_NOT_SERVING[flavour]}: give the one Triton serves "
            f"with ({repo}/tritonserver:{release}-py3)"
        )
    return Release(
        image,
        release,
        f"{repo}/tensorrt:{release}-py3{flavour}",
        f"{repo}/tritonserver:{release}-py3-sdk",
    )


# --- the model config and the ONNX file ------------------------------------------------


def read_config(path: Path) -> Any:
    """The config parsed with Triton's own model-config protobuf."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"--config {path}: {exc.strerror}; give the model's config.pbtxt"
        ) from None
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"--config {path} is not a Triton model config ({exc}): fix it") from None
    return config


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    elem_type: int
    dims: tuple[int | str, ...]  # a str for a dimension without a fixed size


def _tensor(value_info: Any) -> Tensor:
    tensor_type = value_info.type.tensor_type
    dims = tuple(
        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
        for d in tensor_type.shape.dim
    )
    return Tensor(value_info.name, int(tensor_type.elem_type), dims)


def graph_io(model: Any) -> tuple[list[Tensor], list[Tensor]]:
    weights = {init.name for init in model.graph.initializer}
    inputs = [_tensor(vi) for vi in model.graph.input if vi.name not in weights]
    return inputs, [_tensor(vi) for vi in model.graph.output]


def _one(kind: str, model: list[Tensor], config: Any, where: str) -> tuple[Tensor, Any]:
    if len(model) != 1 or len(config) != 1:
        raise ConfigError(
            f"the ranker has {len(model)} {kind}s and {where} declares {len(config)}: the "
            f"service sends one packed row matrix and reads one score per row"
        )
    return model[0], config[0]


def check_signature(config: Any, model: Any, schema: FeatureSchema, where: str) -> list[str]:
    """Refuse a model, config and schema that disagree on names, types or widths."""
    from tritonclient.grpc import model_config_pb2

    fp32 = model_config_pb2.TYPE_FP32
    inputs, outputs = graph_io(model)
    m_in, c_in = _one("input", inputs, config.input, where)
    m_out, c_out = _one("output", outputs, config.output, where)
    fix = "rebuild the world, or correct the config"
    for kind, m, c, expected in (
        ("input", m_in, c_in, schema.input_name),
        ("output", m_out, c_out, schema.output_name),
    ):
        if not m.name == c.name == expected:
            raise ConfigError(
                f"{kind} name: model.onnx says {m.name!r}, {where} {c.name!r}, the world's "
                f"schema {expected!r}: {fix}"
            )
        if m.elem_type != ONNX_FLOAT or c.data_type != fp32 or schema.datatype != "FP32":
            raise ConfigError(
                f"{kind} {m.name!r} type: model.onnx has ONNX type {m.elem_type}, {where} "
                f"{model_config_pb2.DataType.Name(c.data_type)}; both must be FP32: {fix}"
            )
    _check_widths(m_in, list(c_in.dims), schema.width, where)
    if len(m_out.dims) != 2 or m_out.dims[1] != 1 or list(c_out.dims) != [1]:
        raise ConfigError(
            f"output {m_out.name!r}: model.onnx gives {m_out.dims}, {where} dims "
            f"{list(c_out.dims)}; one score per row is [n, 1] and dims [1]: {fix}"
        )
    if config.name != schema.model_name:
        raise ConfigError(
            f"{where} names the model {config.name!r}, the service asks Triton for "
            f"{schema.model_name!r} (the schema's model name): correct the config's name"
        )
    return [
        f"model.onnx, {where} and the schema agree: input {m_in.name!r} FP32 [n, {schema.width}],"
        f" output {m_out.name!r} FP32 [n, 1], model {config.name!r}"
    ]


def _check_widths(m_in: Tensor, config_dims: list[int], width: int, where: str) -> None:
    if len(m_in.dims) != 2 or not isinstance(m_in.dims[0], str):
        raise ConfigError(
            f"input {m_in.name!r}: model.onnx has shape {list(m_in.dims)}; TensorRT's profile "
            "needs [n, width] with n free: export the model with a dynamic batch dimension"
        )
    if config_dims != [width] or m_in.dims[1] != width:
        raise ConfigError(
            f"input width: model.onnx takes {m_in.dims[1]}, {where} declares dims {config_dims}, "
            f"the world's schema packs {width}: rebuild the world, or correct the config's dims"
        )


def check_serving(config: Any, engine: str, where: str) -> list[str]:
    """Refuse what Triton would refuse to load, or would not run on TensorRT."""
    from tritonclient.grpc import model_config_pb2

    if config.max_batch_size < 1:
        raise ConfigError(
            f"{where} has max_batch_size {config.max_batch_size}: the rows are the batch "
            "dimension; set it (the service chunks requests to it)"
        )
    for group in config.instance_group:
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU:
            raise ConfigError(
                f"{where} puts instance group {group.name or 'unnamed'} on the CPU: TensorRT "
                "runs on GPU instances; set kind: KIND_GPU"
            )
    onnxruntime = config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime"
    if engine == "ort-trt" and not onnxruntime:
        raise ConfigError(
            f"{where} serves with platform {config.platform!r} backend {config.backend!r}: "
            f"--engine ort-trt needs the onnxruntime backend; start from {DEFAULT_CONFIG}"
        )
    for warmup in config.model_warmup:
        if not 1 <= warmup.batch_size <= config.max_batch_size:
            raise ConfigError(
                f"{where} warms up {warmup.name!r} with {warmup.batch_size} rows, outside 1.."
                f"{config.max_batch_size} (max_batch_size): Triton refuses the model; fix it"
            )
    return [f"{where}: max_batch_size {config.max_batch_size}, GPU instances, warmups in range"]


def profile_for(config: Any, request_rows: int) -> Profile:
    """min 1; opt the chunk a typical request is sent in; max the largest chunk, max_batch_size."""
    from app.clients.ranking_model import chunk_bounds

    top = int(config.max_batch_size)
    opt = max(end - start for start, end in chunk_bounds(request_rows, top))
    return Profile(config.input[0].name, int(config.input[0].dims[-1]), 1, opt, top, request_rows)


# --- a graph TensorRT takes whole ------------------------------------------------------


def tensorrt_graph(model: Any) -> tuple[Any, int]:
    """A copy with each ai.onnx.ml Scaler written as Sub and Mul, and how many were rewritten.

    TensorRT's ONNX parser has no ai.onnx.ml operators: a Scaler (the exported ranker's input
    standardisation) stops trtexec, and under onnxruntime it runs on the CPU outside the
    engine. (x - offset) * scale in the standard domain is the same arithmetic.
    """
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    floats = _float_tensors(copy)
    nodes, rewritten = [], 0
    for node in copy.graph.node:
        if node.domain == ML_DOMAIN and node.op_type == "Scaler" and node.input[0] in floats:
            nodes.extend(_sub_mul(copy.graph, node))
            rewritten += 1
        else:
            nodes.append(node)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    if not any(node.domain == ML_DOMAIN for node in copy.graph.node):
        kept = [op for op in copy.opset_import if op.domain != ML_DOMAIN]
        del copy.opset_import[:]
        copy.opset_import.extend(kept)
    return copy, rewritten


def _float_tensors(model: Any) -> set[str]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    infos = [*graph.input, *graph.value_info, *graph.output]
    return {vi.name for vi in infos if vi.type.tensor_type.elem_type == ONNX_FLOAT}


def _sub_mul(graph: Any, node: Any) -> list[Any]:
    import numpy as np
    from onnx import helper, numpy_helper

    attributes = {a.name: list(a.floats) for a in node.attribute}
    base = f"{node.name or node.output[0]}_trt"
    offset, scale, centred = f"{base}_offset", f"{base}_scale", f"{base}_centred"
    for name, values, default in ((offset, "offset", 0.0), (scale, "scale", 1.0)):
        array = np.asarray(attributes.get(values) or [default], dtype=np.float32)
        graph.initializer.append(numpy_helper.from_array(array, name))
    return [
        helper.make_node("Sub", [node.input[0], offset], [centred], name=f"{base}_sub"),
        helper.make_node("Mul", [centred, scale], [node.output[0]], name=f"{base}_mul"),
    ]


def foreign_ops(model: Any) -> list[str]:
    """Operators outside the standard ONNX domain, which TensorRT cannot build."""
    return sorted(
        {f"{n.domain}.{n.op_type}" for n in model.graph.node if n.domain not in ("", "ai.onnx")}
    )


def _session(model: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # a check, not a benchmark: leave the cores alone
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def scores(model: Any, rows: FloatArray) -> FloatArray:
    import numpy as np

    session = _session(model)
    (out,) = session.run(None, {session.get_inputs()[0].name: rows})
    flat: FloatArray = np.asarray(out, dtype=np.float32).reshape(-1)
    return flat


def check_identity(original: Any, ready: Any, width: int, rewritten: int) -> str:
    """The copy TensorRT gets must score exactly as the world's model does."""
    import numpy as np

    rows = np.random.default_rng(0).normal(size=(IDENTITY_ROWS, width)).astype(np.float32)
    diff = float(np.abs(scores(original, rows) - scores(ready, rows)).max())
    if not diff <= IDENTITY_TOLERANCE:
        raise ConfigError(
            f"the TensorRT-ready copy of model.onnx scores differently (max |diff| {diff:g} "
            f"over {IDENTITY_ROWS} rows): serve the world's model as it is (recsys install-model)"
        )
    what = f"{rewritten} ai.onnx.ml Scaler written as Sub+Mul" if rewritten else "unchanged"
    return f"model.onnx for TensorRT ({what}) scores as the world's: max |diff| {diff:g}"


# --- INT8: calibration on real packed rows ---------------------------------------------


class _Batches:
    """Rows in the chunks the service sends, in the form onnxruntime's calibrators read."""

    def __init__(self, input_name: str, rows: FloatArray, batch: int) -> None:
        self._feeds = [{input_name: rows[i : i + batch]} for i in range(0, len(rows), batch)]

    def get_next(self) -> dict[str, FloatArray] | None:
        return self._feeds.pop(0) if self._feeds else None


def calibration_rows(holdout: Holdout, count: int) -> FloatArray:
    """The first `count` held-out rows, packed as the service packs them."""
    import numpy as np

    rows = np.ascontiguousarray(holdout.rows[:count], dtype=np.float32)
    if not len(rows) or not np.isfinite(rows).all():
        raise ConfigError(
            f"{holdout.source}: no rows, or rows with NaN or infinity: rebuild the world"
        )
    return rows


def write_calibration_table(
    model_path: Path, rows: FloatArray, profile: Profile, target: Path
) -> dict[str, float]:
    """onnxruntime's calibration table, which its TensorRT provider reads, as `target`.

    Symmetric min-max ranges: TensorRT quantizes symmetrically, and the table keeps one
    magnitude per tensor. Returns those magnitudes by tensor name.
    """
    import numpy as np
    from onnxruntime.quantization import CalibrationMethod, create_calibrator
    from onnxruntime.quantization import write_calibration_table as write_table

    with tempfile.TemporaryDirectory() as scratch:
        calibrator = create_calibrator(
            model_path,
            augmented_model_path=str(Path(scratch) / "augmented.onnx"),
            calibrate_method=CalibrationMethod.MinMax,
            providers=["CPUExecutionProvider"],
            extra_options={"symmetric": True},
        )
        calibrator.collect_data(_Batches(profile.input_name, rows, profile.opt_rows))
        ranges = calibrator.compute_data()
        write_table(ranges, dir=scratch)
        shutil.move(Path(scratch) / "calibration.flatbuffers", target)
    return {
        str(name): float(np.max(np.abs([data.lowest, data.highest])))
        for name, data in ranges.items()
    }


def check_table(magnitudes: dict[str, float], input_name: str) -> str:
    import math

    if input_name not in magnitudes or not all(
        math.isfinite(v) and v > 0 for v in magnitudes.values()
    ):
        raise ConfigError(
            f"the INT8 calibration misses {input_name!r} or holds zero or non-finite ranges: "
            "use more --calibration-rows, or check the held-out rows"
        )
    return (
        f"calibration table: {len(magnitudes)} tensors, {input_name!r} within "
        f"±{magnitudes[input_name]:g}"
    )


def write_qdq_model(source: Path, rows: FloatArray, profile: Profile, target: Path) -> None:
    """An explicitly quantized copy (QuantizeLinear/DequantizeLinear around each MatMul).

    trtexec cannot calibrate from data (its --calib only reads a cache), and TensorRT takes
    the scales from the Q/DQ nodes: symmetric INT8, zero points 0, as TensorRT requires.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    # It advises a pre-processing pass, which this exported MLP does not need: hush it.
    logging.disable(logging.WARNING)
    try:
        quantize_static(
            source,
            target,
            _Batches(profile.input_name, rows, profile.opt_rows),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul"],
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
    finally:
        logging.disable(logging.NOTSET)


def qdq_drift(holdout: Holdout, fp32: Path, qdq: Path, used: int) -> str:
    """How far the INT8 copy moves on held-out rows it was not calibrated on (CPU)."""
    import numpy as np

    from recsys_tools.world.train import auc

    rows, labels = holdout.rows[used:], holdout.labels[used:]
    if len(np.unique(labels)) < 2:
        rows, labels, used = holdout.rows, holdout.labels, 0
    base, reduced = scores(str(fp32), rows), scores(str(qdq), rows)
    diff = float(np.abs(base - reduced).max())
    aucs = ""
    if len(np.unique(labels)) == 2:
        aucs = f", AUC {auc(labels, base):.4f} -> {auc(labels, reduced):.4f}"
    unseen = "not used for calibration" if used else "(all of them: too few others)"
    return (
        f"INT8 Q/DQ copy on the CPU over {len(rows)} held-out rows {unseen}: max |score diff| "
        f"{diff:.4f}{aucs}; TensorRT's kernels differ a little, so compare again on the GPU"
    )


# --- the config written ----------------------------------------------------------------


def _find_accelerator(config: Any) -> Any | None:
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    return next((a for a in accelerators if a.name == TENSORRT_ACCELERATOR), None)


def _accelerator(config: Any) -> Any:
    """The config's TensorRT accelerator, added when it has none."""
    found = _find_accelerator(config)
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    return found if found is not None else accelerators.add(name=TENSORRT_ACCELERATOR)


def serving_config(
    source: Any, options: BuildOptions, profile: Profile, table: str | None, world_id: str | None
) -> Any:
    """The source config with the engine's platform, precision and profile (and world id)."""
    from app.world import WORLD_ID_PARAMETER

    config = type(source)()
    config.CopyFrom(source)
    if options.engine == "plan":
        config.platform, config.backend, config.default_model_filename = "tensorrt_plan", "", ""
        config.optimization.ClearField("execution_accelerators")
        if not config.optimization.ListFields():
            config.ClearField("optimization")
    else:
        parameters = _accelerator(config).parameters
        parameters["precision_mode"] = options.precision.upper()
        for bound, shape in profile.shapes.items():
            parameters[f"trt_profile_{bound}_shapes"] = shape
        for key in ("int8_calibration_table_name", "int8_use_native_calibration_table"):
            parameters.pop(key, None)
        if table is not None:
            parameters["int8_calibration_table_name"] = table
            parameters["int8_use_native_calibration_table"] = "0"  # onnxruntime's own format
    if world_id:
        config.parameters[WORLD_ID_PARAMETER].string_value = world_id
    return config


def check_accelerator(config: Any, options: BuildOptions, where: str) -> list[str]:
    if options.engine == "plan":
        return []
    accelerator = _find_accelerator(config)
    parameters = dict(accelerator.parameters) if accelerator is not None else {}
    unknown = sorted(set(parameters) - ACCELERATOR_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: the onnxruntime backend refuses TensorRT parameters {unknown}: remove them"
        )
    if options.precision == "int8" and not parameters.get("trt_engine_cache_path"):
        raise ConfigError(
            f"{where} sets no trt_engine_cache_path: onnxruntime reads the INT8 calibration "
            "table from the engine cache directory; set it (e.g. /trt-cache, as the GPU config)"
        )
    return ["the TensorRT accelerator's parameters are all ones the onnxruntime backend accepts"]


def config_text(config: Any, options: BuildOptions, profile: Profile) -> str:
    from google.protobuf import text_format

    engine = (
        "a TensorRT plan (model.plan) built by trtexec"
        if options.engine == "plan"
        else "onnxruntime with the TensorRT accelerator, which builds the engine at load"
    )
    shapes = ", ".join(f"{k} {v}" for k, v in profile.shapes.items())
    header = (
        f"# Written by `recsys model build-engine` from {_shown(options.config)}\n"
        f"# for the world {_shown(options.world)}, served by {options.triton_image}:\n"
        f"# {engine}, {options.precision.upper()}.\n"
        f"# One optimisation profile: {shapes}.\n"
        "# docs/engines.md explains how it was made and how to check it.\n"
    )
    body: str = text_format.MessageToString(config)
    return header + body


# --- the commands ----------------------------------------------------------------------


def _gpu() -> tuple[str, ...]:
    """A one-off container with every GPU, through the CDI spec (as the quadlet does)."""
    return ("podman", "run", "--rm", "--device", "nvidia.com/gpu=all")


def plan_build(options: BuildOptions, release: Release, profile: Profile, onnx: str) -> Command:
    """trtexec in the TensorRT image of the serving release (its TensorRT is Triton's)."""
    flags = {"fp32": (), "fp16": ("--fp16",), "int8": ("--int8", "--fp16")}[options.precision]
    argv = (
        *_gpu(),
        "-v",
        f"{options.out.resolve()}:/model:z",
        release.tensorrt_image,
        "trtexec",
        f"--onnx=/model/{BUILD_DIR}/{onnx}",
        f"--saveEngine=/model/{VERSION_DIR}/model.plan",
        f"--minShapes={profile.shapes['min']}",
        f"--optShapes={profile.shapes['opt']}",
        f"--maxShapes={profile.shapes['max']}",
        *flags,
        "--skipInference",
    )
    return Command("build", f"build the plan with TensorRT {release.release}", argv)


def serve_commands(
    options: BuildOptions, release: Release, profile: Profile, stage: str
) -> list[Command]:
    """A throwaway Triton of the serving image on the new model, then perf_analyzer per shape."""
    model, repository = options.out.name, options.out.resolve().parent
    cache = ("-v", f"{options.cache_volume}:/trt-cache") if options.engine == "ort-trt" else ()
    start = (
        "podman", "run", "-d", "--rm", "--name", CHECK_CONTAINER,
        "--device", "nvidia.com/gpu=all", "--user", TRITON_USER,
        "-v", f"{repository}:/models:ro,z", *cache,
        "-p", f"127.0.0.1:{CHECK_HTTP_PORT}:8000", "-p", f"127.0.0.1:{CHECK_GRPC_PORT}:8001",
        release.triton_image, "tritonserver", "--model-repository=/models",
        "--model-control-mode=explicit", f"--load-model={model}",
    )  # fmt: skip
    ready = (
        f"for i in $(seq {READY_POLLS}); do curl -sf -o /dev/null "
        f"http://127.0.0.1:{CHECK_HTTP_PORT}/v2/models/{model}/ready && exit 0; "
        f"podman container exists {CHECK_CONTAINER} || exit 1; sleep {READY_POLL_S}; done; exit 1"
    )
    commands = [
        Command(stage, f"start Triton {release.release} on {model}", start),
        Command(stage, "wait until the model is ready (engine, warmup)", ("sh", "-c", ready)),
    ]
    for rows in sorted({profile.min_rows, profile.opt_rows, profile.max_rows}):
        perf = (
            "podman", "run", "--rm", "--network", "host", release.sdk_image, "perf_analyzer",
            "-m", model, "-u", f"127.0.0.1:{CHECK_GRPC_PORT}", "-i", "grpc", "-b", str(rows),
            "--concurrency-range", PERF_CONCURRENCY,
        )  # fmt: skip
        commands.append(Command("verify", f"latency and throughput at {rows} rows", perf))
    commands.append(Command("verify", "stop the check server", ("podman", "stop", CHECK_CONTAINER)))
    return commands


def copy_table_command(options: BuildOptions, release: Release, table: str) -> Command:
    """onnxruntime reads the table from the engine cache, which is a volume, not the model."""
    source = options.out.resolve() / CALIBRATION_DIR
    argv = (
        "podman", "run", "--rm", "--user", TRITON_USER,
        "-v", f"{source}:/calibration:ro,z", "-v", f"{options.cache_volume}:/trt-cache",
        release.triton_image, "cp", f"/calibration/{table}", f"/trt-cache/{table}",
    )  # fmt: skip
    return Command("build", "put the INT8 calibration table into the engine cache", argv)


def commands_for(
    options: BuildOptions, release: Release, profile: Profile, onnx: str, table: str | None
) -> list[Command]:
    if options.engine == "plan":
        build = plan_build(options, release, profile, onnx)
        return [build, *serve_commands(options, release, profile, "verify")]
    first = [copy_table_command(options, release, table)] if table else []
    return [*first, *serve_commands(options, release, profile, "build")]


def missing_gpu() -> str | None:
    """Why this host cannot run the build commands; None when it can."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no GPU here (nvidia-smi is not on PATH)"
    try:
        probe = subprocess.run([smi, "-L"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no usable GPU here (nvidia-smi -L: {exc})"
    if probe.returncode != 0:
        return f"no usable GPU here (nvidia-smi -L exited {probe.returncode})"
    return "podman is not on PATH" if shutil.which("podman") is None else None


def run_build(commands: list[Command]) -> dict[str, float]:
    """Run the build commands in order, timing each; stop at the first that fails."""
    timings: dict[str, float] = {}
    for command in (c for c in commands if c.stage == "build"):
        log.info("%s: %s", command.purpose, command.shell)
        started = time.perf_counter()
        result = subprocess.run(command.argv, check=False)
        timings[command.purpose] = round(time.perf_counter() - started, 1)
        if result.returncode != 0:
            raise ConfigError(
                f"{command.purpose!r} exited {result.returncode} ({command.argv[0]}): see its "
                f"output above; `podman stop {CHECK_CONTAINER}` if it was left running"
            )
    return timings


# --- the whole build -------------------------------------------------------------------


def _prepare_out(out: Path, model_name: str) -> Path:
    """A staging directory beside `out`, renamed into place once everything is written."""
    if out.name != model_name:
        raise ConfigError(
            f"--out {out}: Triton names a model after its directory; name it {model_name} "
            f"(e.g. {out.parent / model_name})"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty directory: name a new one")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would lock out Triton's own user (uid 1000)
    return staging


def _shown(path: Path) -> str:
    """A path as short as it can be said from here, for messages."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _load_world(world: Path) -> tuple[FeatureSchema, Any]:
    import onnx

    from app.catalog import MODEL_FILE
    from app.world import world_schema

    path = world / MODEL_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing: build the world (recsys build-world or build-demo)")
    return world_schema(world, None), onnx.load(str(path))


def build_engine(options: BuildOptions) -> EngineReport:
    """Check everything, write the model directory, then run or print the GPU steps."""
    from app.world import read_stamp

    where = f"--config {_shown(options.config)}"
    schema, model = _load_world(options.world)
    source = read_config(options.config)
    release = release_of(options.triton_image)
    checks = check_signature(source, model, schema, where) + check_serving(
        source, options.engine, where
    )
    profile = profile_for(source, options.request_rows)
    checks += check_accelerator(source, options, where)
    ready, rewritten = tensorrt_graph(model)
    foreign = foreign_ops(ready)
    if foreign and options.engine == "plan":
        raise ConfigError(
            f"model.onnx uses {foreign}, which TensorRT's ONNX parser lacks: use --engine "
            "ort-trt (onnxruntime runs them outside the engine), or export without them"
        )
    checks.append(check_identity(model, ready, schema.width, rewritten))
    stamp = read_stamp(options.world)
    report = EngineReport(
        str(options.world), str(options.config), str(options.out), source.name, options.engine,
        options.precision, release, profile, checks,
    )  # fmt: skip
    report.checks.append(
        f"release {release.release}: served by {release.triton_image}, plans built in "
        f"{release.tensorrt_image} (the same release, so the same TensorRT)"
    )
    report.notes.extend(_notes(options, profile, foreign))
    staging = _prepare_out(options.out, source.name)
    try:
        onnx_name, table = _write(staging, options, schema, ready, profile, report)
        world_id = stamp.world_id if stamp is not None else None
        config = serving_config(source, options, profile, table, world_id)
        (staging / "config.pbtxt").write_text(config_text(config, options, profile))
        read_config(staging / "config.pbtxt")  # what Triton will parse, parsed back
        if options.out.exists():
            options.out.rmdir()
        os.replace(staging, options.out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report.checks.append(f"{options.out / 'config.pbtxt'} parses as a Triton ModelConfig")
    report.files = sorted(str(p) for p in options.out.rglob("*") if p.is_file())
    report.commands = commands_for(options, release, profile, onnx_name, table)
    report.dry_run = "--dry-run" if options.dry_run else missing_gpu()
    if report.dry_run is None:
        report.timings_s = run_build(report.commands)
    return report


def _write(
    staging: Path,
    options: BuildOptions,
    schema: FeatureSchema,
    ready: Any,
    profile: Profile,
    report: EngineReport,
) -> tuple[str, str | None]:
    """The model (and calibration) files; returns the ONNX file to build from and the table."""
    import numpy as np
    import onnx

    from app.catalog import MODEL_FILE

    home = staging / (BUILD_DIR if options.engine == "plan" else VERSION_DIR)
    home.mkdir()
    (staging / VERSION_DIR).mkdir(exist_ok=True)
    onnx.save(ready, str(home / MODEL_FILE))
    if options.precision != "int8":
        return MODEL_FILE, None
    from recsys_tools.model_compare import load_holdout

    holdout = load_holdout(options.world, schema)
    rows = calibration_rows(holdout, options.calibration_rows)
    calibration = staging / CALIBRATION_DIR
    calibration.mkdir()
    np.save(calibration / "rows.npy", rows)
    report.notes.append(f"calibration set: the first {len(rows)} held-out rows ({holdout.source})")
    if options.engine == "plan":
        qdq = "model.int8.onnx"
        write_qdq_model(home / MODEL_FILE, rows, profile, home / qdq)
        report.checks.append(qdq_drift(holdout, home / MODEL_FILE, home / qdq, len(rows)))
        return qdq, None
    written = calibration / "table.flatbuffers"
    magnitudes = write_calibration_table(home / MODEL_FILE, rows, profile, written)
    report.checks.append(check_table(magnitudes, profile.input_name))
    (calibration / "ranges.json").write_text(json.dumps(magnitudes, indent=2, sort_keys=True))
    # Named by content: the engine cache is shared, and a new table must not pass for an old.
    digest = hashlib.sha256(written.read_bytes()).hexdigest()[:12]
    table = f"{schema.model_name}.{digest}.calibration.flatbuffers"
    written.rename(calibration / table)
    return MODEL_FILE, table


def _notes(options: BuildOptions, profile: Profile, foreign: list[str]) -> list[str]:
    notes = [
        f"opt {profile.opt_rows} rows: a request of {profile.request_rows} rows goes out in "
        f"chunks of at most {profile.max_rows} (max_batch_size)"
    ]
    if foreign:
        notes.append(f"{foreign} run on the CPU outside the TensorRT engine (onnxruntime)")
    if options.engine == "ort-trt":
        notes.append(
            f"engines are built into the {options.cache_volume} volume by the serving image "
            "itself; remove the volume when the image tag changes"
        )
    if options.engine == "ort-trt" and options.precision == "int8":
        notes.append(
            "precision_mode INT8 enables INT8 only: layers without an INT8 kernel run in FP32. "
            "A new table for the same model needs that model's engines removed from the cache"
        )
    if options.engine == "plan":
        notes.append(
            f"{BUILD_DIR}/ holds what the plan is built from; Triton skips it (not a version)"
        )
    return notes


# --- output and the command line -------------------------------------------------------


def render_text(report: EngineReport) -> str:
    shapes = ", ".join(f"{k} {v}" for k, v in report.profile.shapes.items())
    lines = [
        f"{report.model} from {report.world}: {report.engine}, {report.precision.upper()}, "
        f"serving image {report.release.triton_image} (release {report.release.release})",
        f"profile: {shapes}",
        "checks passed:",
        *(f"  - {check}" for check in report.checks),
        "notes:",
        *(f"  - {note}" for note in report.notes),
        "files written:",
        *(f"  {path}" for path in report.files),
    ]
    ran = "dry run: " + report.dry_run if report.dry_run else "build commands ran"
    lines.append(f"commands ({ran}):")
    for command in report.commands:
        lines += [f"  # {command.stage}: {command.purpose}", f"  {command.shell}"]
    lines += [f"{purpose}: {seconds:.1f} s" for purpose, seconds in report.timings_s.items()]
    if report.dry_run is None and report.engine == "ort-trt":
        lines.append(
            f"{CHECK_CONTAINER} is left running for the verify commands; the last stops it"
        )
    return "\n".join(lines)


def _options(args: argparse.Namespace) -> BuildOptions:
    from recsys_tools.localstack import project_root

    root = project_root()
    for flag in ("calibration_rows", "request_rows"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: give >= 1")
    image = args.triton_image or quadlet_value(root / TRITON_QUADLET, "Image")
    if not image:
        raise ConfigError(f"{root / TRITON_QUADLET} names no Image=: give --triton-image")
    volume = quadlet_value(root / CACHE_QUADLET, "VolumeName") or DEFAULT_CACHE_VOLUME
    return BuildOptions(
        world=args.world,
        config=args.config or root / DEFAULT_CONFIG,
        out=args.out,
        triton_image=image,
        precision=args.precision,
        engine=args.engine,
        calibration_rows=args.calibration_rows,
        request_rows=args.request_rows,
        cache_volume=volume,
        dry_run=args.dry_run,
    )


def _build_engine(args: argparse.Namespace) -> None:
    report = build_engine(_options(args))
    print(json.dumps(report.as_dict(), indent=2) if args.json else render_text(report))


def add_build_engine_parser(
    model_commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """`model build-engine` and its options, run through `args.run` like every other command."""
    parser = model_commands.add_parser(
        "build-engine",
        help="a TensorRT engine (or onnxruntime-TensorRT config) for the serving Triton",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--world", type=Path, required=True, help="the world directory (holds model.onnx)")
    add("--config", type=Path, default=None, help=f"the source config; default {DEFAULT_CONFIG}")
    add(
        "--out",
        type=Path,
        required=True,
        help="the model directory to write, named as the model (e.g. NEW_REPO/ranking_model)",
    )
    add("--precision", choices=PRECISIONS, default="fp16", help="default: fp16")
    add(
        "--engine",
        choices=ENGINES,
        default="ort-trt",
        help="ort-trt: Triton's onnxruntime backend builds at load (default); plan: trtexec",
    )
    add("--triton-image", default=None, help=f"default: the Image= of {TRITON_QUADLET}")
    add(
        "--calibration-rows",
        type=int,
        default=CALIBRATION_ROWS,
        help=f"held-out rows to calibrate INT8 on (default {CALIBRATION_ROWS})",
    )
    add(
        "--request-rows",
        type=int,
        default=REQUEST_ROWS,
        help=f"rows of a typical request, for the opt shape (default {REQUEST_ROWS})",
    )
    add("--dry-run", action="store_true", help="print the GPU commands, run none (no GPU: always)")
    add("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=_build_engine)
