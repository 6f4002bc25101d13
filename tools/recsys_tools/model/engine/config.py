"""The config Triton loads: the source config, changed only where the engine needs it.

Instances, batching and warmups stay as the operator tuned them; only the platform, the
precision, the profile and the world id change. It is parsed back with Triton's own protobuf
so a config Triton would not load never leaves this host.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.errors import ConfigError
from app.world.schema import HEADS_OUTPUT
from app.world.stamp import WORLD_ID_PARAMETER
from recsys_tools.model.engine.options import shown

if TYPE_CHECKING:
    from recsys_tools.model.engine.options import BuildOptions
    from recsys_tools.model.engine.profile import Profile

TENSORRT_ACCELERATOR = "tensorrt"


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


def find_accelerator(config: Any) -> Any | None:
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    return next((a for a in accelerators if a.name == TENSORRT_ACCELERATOR), None)


def _accelerator(config: Any) -> Any:
    """The config's TensorRT accelerator, added when it has none."""
    found = find_accelerator(config)
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    return found if found is not None else accelerators.add(name=TENSORRT_ACCELERATOR)


def serving_config(
    source: Any,
    options: BuildOptions,
    profile: Profile,
    table: str | None,
    world_id: str | None,
    heads: bool = True,
) -> Any:
    """The source config with the engine's platform, precision and profile (and world id);
    without the heads output where the model has none (`heads`)."""
    config = type(source)()
    config.CopyFrom(source)
    if not heads:
        # Triton refuses a config naming an output its model lacks.
        kept = [output for output in config.output if output.name != HEADS_OUTPUT]
        del config.output[:]
        config.output.extend(kept)
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


def config_text(config: Any, options: BuildOptions, profile: Profile) -> str:
    from google.protobuf import text_format

    engine = (
        "a TensorRT plan (model.plan) built by trtexec"
        if options.engine == "plan"
        else "onnxruntime with the TensorRT accelerator, which builds the engine at load"
    )
    shapes = ", ".join(f"{k} {v}" for k, v in profile.shapes.items())
    header = (
        f"# Written by `recsys model build-engine` from {shown(options.config)}\n"
        f"# for the world {shown(options.world)}, served by {options.triton_image}:\n"
        f"# {engine}, {options.precision.upper()}.\n"
        f"# One optimisation profile: {shapes}.\n"
        "# docs/engines.md explains how it was made and how to check it.\n"
    )
    body: str = text_format.MessageToString(config)
    return header + body
