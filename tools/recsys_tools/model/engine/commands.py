"""The GPU steps are commands, not calls, so a host without a GPU can print them.

They run in the serving release's own images (trtexec in its TensorRT image, the check server
in the serving image, perf_analyzer in its SDK image), so the engine is built and measured by
the TensorRT that will load it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from recsys_tools.model.engine.layout import BUILD_DIR, CALIBRATION_DIR, VERSION_DIR
from recsys_tools.model.engine.options import BuildOptions
from recsys_tools.model.engine.profile import Profile
from recsys_tools.model.engine.release import ImageRelease

# The check server: loopback ports beside production's 8001/8002, and the image's own user.
CHECK_CONTAINER = "recsys-build-engine"
CHECK_HTTP_PORT = 18000
CHECK_GRPC_PORT = 18001
TRITON_USER = "1000:1000"
READY_POLLS, READY_POLL_S = 180, 5  # 15 minutes for the first engine build and the warmup
PERF_CONCURRENCY = "1:4"


@dataclass(frozen=True, slots=True)
class Command:
    stage: str  # "build": run here when there is a GPU; "verify": printed for the operator
    purpose: str
    argv: tuple[str, ...]

    @property
    def shell(self) -> str:
        return shlex.join(self.argv)


def _gpu() -> tuple[str, ...]:
    """A one-off container with every GPU, through the CDI spec (as the quadlet does)."""
    return ("podman", "run", "--rm", "--device", "nvidia.com/gpu=all")


def plan_build(
    options: BuildOptions,
    release: ImageRelease,
    profile: Profile,
    onnx: str,
    tail: tuple[str, ...] = (),
) -> Command:
    """trtexec in the TensorRT image of the serving release (its TensorRT is Triton's).

    At reduced precision the score's `tail` (precision.score_tail: the layers from the
    heads' logits to the score, and the blend) is held to FP32: a log-odds score rounded to
    FP16 steps by 1/64 near 30, and distinct candidates would tie."""
    flags = {"fp32": (), "fp16": ("--fp16",), "int8": ("--int8", "--fp16")}[options.precision]
    if flags and tail:
        layers = ",".join(f"{name}:fp32" for name in tail)
        flags = (*flags, "--precisionConstraints=obey", f"--layerPrecisions={layers}")
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
    options: BuildOptions, release: ImageRelease, profile: Profile, stage: str
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


def copy_table_command(options: BuildOptions, release: ImageRelease, table: str) -> Command:
    """onnxruntime reads the table from the engine cache, which is a volume, not the model."""
    source = options.out.resolve() / CALIBRATION_DIR
    argv = (
        "podman", "run", "--rm", "--user", TRITON_USER,
        "-v", f"{source}:/calibration:ro,z", "-v", f"{options.cache_volume}:/trt-cache",
        release.triton_image, "cp", f"/calibration/{table}", f"/trt-cache/{table}",
    )  # fmt: skip
    return Command("build", "put the INT8 calibration table into the engine cache", argv)


def commands_for(
    options: BuildOptions,
    release: ImageRelease,
    profile: Profile,
    onnx: str,
    table: str | None,
    tail: tuple[str, ...] = (),
) -> list[Command]:
    if options.engine == "plan":
        build = plan_build(options, release, profile, onnx, tail)
        return [build, *serve_commands(options, release, profile, "verify")]
    first = [copy_table_command(options, release, table)] if table else []
    return [*first, *serve_commands(options, release, profile, "build")]
