"""Refusals made here, before anything is written, rather than at load on the GPU host.

Triton and the onnxruntime backend reject a mismatched model or config only when the model
loads, with an error that names no fix; each check here names the file to correct.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.core.errors import ConfigError
from app.world.schema import HEAD_NAMES, HEADS_OUTPUT
from recsys_tools.model.engine.config import find_accelerator
from recsys_tools.model.engine.graph import ONNX_FLOAT, Tensor, graph_io
from recsys_tools.model.engine.options import DEFAULT_CONFIG

if TYPE_CHECKING:
    from app.world.schema import FeatureSchema
    from recsys_tools.model.engine.options import BuildOptions

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


def _one(kind: str, model: list[Tensor], config: Any, where: str) -> tuple[Tensor, Any]:
    if len(model) != 1 or len(config) != 1:  # a second output is checked apart (the heads)
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
    heads = _heads_checked(outputs[1:], config.output[1:], where)
    m_out, c_out = _one("output", outputs[:1], config.output[:1], where)
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
        f" output {m_out.name!r} FP32 [n, 1]{heads}, model {config.name!r}"
    ]


def _heads_checked(model: list[Tensor], config: Any, where: str) -> str:
    """The outputs after the score may only be the heads, [n, 2] and dims [2]; the config
    may leave them out (the build then serves the score alone), never add them."""
    shape = [len(HEAD_NAMES)]
    for tensor in model:
        if tensor.name != HEADS_OUTPUT or len(tensor.dims) != 2 or tensor.dims[1] != shape[0]:
            raise ConfigError(
                f"model.onnx output {tensor.name!r} {list(tensor.dims)}: after the score the "
                f"ranker may only answer {HEADS_OUTPUT!r} [n, {shape[0]}]"
            )
    for output in config:
        if output.name != HEADS_OUTPUT or list(output.dims) != shape:
            raise ConfigError(
                f"{where} output {output.name!r} dims {list(output.dims)}: after the score a "
                f"config may only declare {HEADS_OUTPUT!r} dims {shape}"
            )
    return f" and {HEADS_OUTPUT!r} FP32 [n, {shape[0]}]" if model else ""


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


def check_accelerator(config: Any, options: BuildOptions, where: str) -> list[str]:
    if options.engine == "plan":
        return []
    accelerator = find_accelerator(config)
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
