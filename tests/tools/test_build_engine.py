"""`recsys model build-engine` on a tiny world, without a GPU: what it writes, prints and refuses.

The configs it writes are parsed back with Triton's own model-config protobuf; the INT8
calibration is read back from onnxruntime's table format.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from recsys_tools.localstack import project_root
from recsys_tools.model import engine
from recsys_tools.model.engine import (
    BuildOptions,
    Command,
    EngineReport,
    build_engine,
    profile_for,
    quadlet_value,
    release_of,
    run_build,
)
from recsys_tools.world.learn.ranker.export import export_net
from recsys_tools.world.learn.ranker.fit import fit_net
from recsys_tools.world.learn.ranker.net import MLP
from tritonclient.grpc import model_config_pb2

from app.core.errors import ConfigError
from app.core.settings import Settings
from app.world.layout import HOLDOUT_FILE, MANIFEST_FILE, MODEL_FILE, SCHEMA_FILE
from app.world.schema import load_schema

SCHEMA = load_schema()
WIDTH = SCHEMA.width
IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
WORLD_ID = "20250101-000000-abcdef"
HOLDOUT_ROWS = 600
CALIBRATION = 300
# A request of 1100 rows against max_batch_size 512 goes out as three chunks of 367/366/367.
REQUEST_ROWS, MAX_BATCH, OPT = 1100, 512, 367


def _config(
    width: int = WIDTH,
    input_name: str = "features",
    extra: str = "",
    cache: str = 'parameters { key: "trt_engine_cache_path" value: "/trt-cache" }',
) -> str:
    return f"""
name: "ranking_model"
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH}
input [ {{ name: "{input_name}" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "score" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
dynamic_batching {{ }}
optimization {{ execution_accelerators {{ gpu_execution_accelerator: [ {{
  name: "tensorrt"
  parameters {{ key: "precision_mode" value: "FP16" }}
  parameters {{ key: "trt_engine_cache_enable" value: "1" }}
  {cache}
  {extra}
}} ] }} }}
model_warmup [ {{ name: "chunk" batch_size: {MAX_BATCH} inputs {{ key: "features"
  value: {{ data_type: TYPE_FP32 dims: [ {width} ] random_data: true }} }} }} ]
"""


def _ranker(extra_ml_op: bool = False) -> onnx.ModelProto:
    """The exported ranker's shape: an ai.onnx.ml Scaler, then an MLP head to one score."""
    rng = np.random.default_rng(3)
    weights = numpy_helper.from_array(rng.normal(size=(WIDTH, 1)).astype(np.float32), "w")
    nodes = [
        helper.make_node(
            "Scaler",
            ["features"],
            ["scaled"],
            domain="ai.onnx.ml",
            offset=rng.normal(size=WIDTH).tolist(),
            scale=rng.uniform(0.5, 2.0, size=WIDTH).tolist(),
        ),
        helper.make_node("MatMul", ["scaled", "w"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["score"]),
    ]
    if extra_ml_op:
        nodes[1] = helper.make_node("MatMul", ["normal", "w"], ["logit"])
        nodes.insert(1, helper.make_node("Normalizer", ["scaled"], ["normal"], domain="ai.onnx.ml"))
    graph = helper.make_graph(
        nodes,
        "ranker",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", WIDTH])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["n", 1])],
        [weights],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("engine") / "world"
    path.mkdir()
    onnx.save(_ranker(), str(path / MODEL_FILE))
    (path / SCHEMA_FILE).write_text(SCHEMA.source, encoding="utf-8")
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(HOLDOUT_ROWS, WIDTH)).astype(np.float32)
    labels = (rng.random(HOLDOUT_ROWS) < 0.3).astype(np.int8)
    np.savez(path / HOLDOUT_FILE, rows=rows, labels=labels)
    (path / MANIFEST_FILE).write_text(json.dumps({"world_id": WORLD_ID, "files": {}}))
    return path


def _options(
    world: Path, tmp_path: Path, config: str | None = None, **changes: Any
) -> BuildOptions:
    config_path = tmp_path / "source.pbtxt"
    config_path.write_text(config or _config())
    fields: dict[str, Any] = {
        "world": world,
        "config": config_path,
        "out": tmp_path / "repo" / "ranking_model",
        "triton_image": IMAGE,
        "calibration_rows": CALIBRATION,
        "request_rows": REQUEST_ROWS,
        "dry_run": True,
    }
    return BuildOptions(**(fields | changes))


def _written(report: EngineReport) -> Any:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((Path(report.out) / "config.pbtxt").read_text(), config)
    return config


def _trt_parameters(config: Any) -> dict[str, str]:
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    return dict(accelerator.parameters)


def _scores(model: onnx.ModelProto | str, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    (out,) = session.run(["score"], {"features": rows})
    return np.asarray(out).reshape(-1)


def test_ort_trt_fp16_config_parses_with_the_chunk_profile(world: Path, tmp_path: Path) -> None:
    report = build_engine(_options(world, tmp_path))
    config = _written(report)

    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == MAX_BATCH
    parameters = _trt_parameters(config)
    assert parameters["precision_mode"] == "FP16"
    assert parameters["trt_profile_min_shapes"] == f"features:1x{WIDTH}"
    assert parameters["trt_profile_opt_shapes"] == f"features:{OPT}x{WIDTH}"
    assert parameters["trt_profile_max_shapes"] == f"features:{MAX_BATCH}x{WIDTH}"
    assert parameters["trt_engine_cache_path"] == "/trt-cache"  # kept from the source
    assert "int8_calibration_table_name" not in parameters
    assert config.parameters["world_id"].string_value == WORLD_ID
    assert (report.profile.min_rows, report.profile.opt_rows) == (1, OPT)
    assert report.dry_run == "--dry-run"
    assert report.timings_s == {}
    assert sorted(Path(p).relative_to(report.out).as_posix() for p in report.files) == [
        "1/model.onnx",
        "config.pbtxt",
    ]


def test_the_model_written_is_standard_onnx_and_scores_as_the_worlds(
    world: Path, tmp_path: Path
) -> None:
    report = build_engine(_options(world, tmp_path))
    written = onnx.load(str(Path(report.out) / "1" / MODEL_FILE))

    assert [node.op_type for node in written.graph.node] == ["Sub", "Mul", "MatMul", "Sigmoid"]
    assert all(op.domain in ("", "ai.onnx") for op in written.opset_import)
    rows = np.random.default_rng(9).normal(size=(50, WIDTH)).astype(np.float32)
    original = _scores(onnx.load(str(world / MODEL_FILE)), rows)
    assert np.array_equal(_scores(written, rows), original)
    assert np.ptp(original) > 0.1  # the rows do exercise the model


def test_int8_ort_trt_calibrates_on_the_held_out_rows(world: Path, tmp_path: Path) -> None:
    from onnxruntime.quantization.CalTableFlatBuffers.TrtTable import TrtTable

    report = build_engine(_options(world, tmp_path, precision="int8"))
    parameters = _trt_parameters(_written(report))
    table_name = parameters["int8_calibration_table_name"]
    calibration = Path(report.out) / "calibration"

    assert parameters["precision_mode"] == "INT8"
    assert parameters["int8_use_native_calibration_table"] == "0"
    assert table_name.startswith("ranking_model.")
    assert table_name.endswith(".flatbuffers")
    with np.load(world / HOLDOUT_FILE) as holdout:
        expected_rows = holdout["rows"][:CALIBRATION]
    assert np.array_equal(np.load(calibration / "rows.npy"), expected_rows)
    raw = (calibration / table_name).read_bytes()
    table = TrtTable.GetRootAsTrtTable(raw, 0)
    ranges = {
        table.Dict(i).Key().decode(): float(table.Dict(i).Value())
        for i in range(table.DictLength())
    }
    # The input's range is the largest |value| among the calibration rows themselves.
    assert ranges["features"] == pytest.approx(float(np.abs(expected_rows).max()), rel=1e-6)
    assert {"scaled", "logit", "score"} <= set(ranges)
    copy = report.commands[0]
    assert copy.stage == "build"
    assert f"/trt-cache/{table_name}" in copy.argv


def test_plan_fp16_prints_trtexec_in_the_same_release_tensorrt_image(
    world: Path, tmp_path: Path
) -> None:
    report = build_engine(_options(world, tmp_path, engine="plan"))
    config = _written(report)
    build = report.commands[0]
    out = Path(report.out).resolve()

    assert config.platform == "tensorrt_plan"
    assert not config.HasField("optimization")
    assert (out / "build" / MODEL_FILE).is_file()
    assert (out / "1").is_dir()
    assert not any((out / "1").iterdir())
    assert build.stage == "build"
    assert build.argv[:5] == ("podman", "run", "--rm", "--device", "nvidia.com/gpu=all")
    image_at = build.argv.index("nvcr.io/nvidia/tensorrt:24.10-py3")
    assert build.argv[image_at + 1 :] == (
        "trtexec",
        f"--onnx=/model/build/{MODEL_FILE}",
        "--saveEngine=/model/1/model.plan",
        f"--minShapes=features:1x{WIDTH}",
        f"--optShapes=features:{OPT}x{WIDTH}",
        f"--maxShapes=features:{MAX_BATCH}x{WIDTH}",
        "--fp16",
        "--skipInference",
    )
    assert f"{out}:/model:z" in build.argv
    assert all(command.stage == "verify" for command in report.commands[1:])
    perf = [c.argv for c in report.commands if "perf_analyzer" in c.argv]
    assert [argv[argv.index("-b") + 1] for argv in perf] == ["1", str(OPT), str(MAX_BATCH)]
    assert all("nvcr.io/nvidia/tritonserver:24.10-py3-sdk" in argv for argv in perf)


def test_plan_int8_builds_from_an_explicitly_quantized_copy(world: Path, tmp_path: Path) -> None:
    report = build_engine(_options(world, tmp_path, engine="plan", precision="int8"))
    qdq = onnx.load(str(Path(report.out) / "build" / "model.int8.onnx"))
    ops = [node.op_type for node in qdq.graph.node]
    zero_points = [
        numpy_helper.to_array(init)
        for init in qdq.graph.initializer
        if init.name.endswith("zero_point")
    ]

    assert "QuantizeLinear" in ops
    assert "DequantizeLinear" in ops
    assert zero_points
    assert all(not point.any() for point in zero_points)
    assert "--onnx=/model/build/model.int8.onnx" in report.commands[0].argv
    assert {"--int8", "--fp16"} <= set(report.commands[0].argv)
    drift = next(check for check in report.checks if check.startswith("INT8 Q/DQ copy"))
    assert f"over {HOLDOUT_ROWS - CALIBRATION} held-out rows not used" in drift


@pytest.mark.parametrize(
    ("changes", "config", "message"),
    [
        ({}, _config(width=WIDTH - 1), "input width: model.onnx takes"),
        ({}, _config(input_name="feats"), "input name: model.onnx says 'features'"),
        ({"triton_image": "nvcr.io/nvidia/tritonserver:latest"}, None, "has no release tag"),
        ({"triton_image": "nvcr.io/nvidia/tritonserver:24.10-py3-sdk"}, None, "client SDK"),
        ({"triton_image": "nvcr.io/nvidia/tritonserver:24.13-py3"}, None, "not a YY.MM"),
        ({}, _config(extra='parameters { key: "fp16" value: "1" }'), "refuses TensorRT param"),
        ({"precision": "int8"}, _config(cache=""), "sets no trt_engine_cache_path"),
    ],
)
def test_mismatches_are_refused_before_anything_is_written(
    world: Path, tmp_path: Path, changes: dict[str, Any], config: str | None, message: str
) -> None:
    options = _options(world, tmp_path, config, **changes)
    with pytest.raises(ConfigError, match=message):
        build_engine(options)
    assert not options.out.parent.exists() or not any(options.out.parent.iterdir())


def test_the_out_directory_must_be_named_as_the_model(world: Path, tmp_path: Path) -> None:
    options = _options(world, tmp_path, out=tmp_path / "repo" / "ranker")
    with pytest.raises(ConfigError, match="name it ranking_model"):
        build_engine(options)


def test_a_plan_refuses_operators_tensorrt_lacks(tmp_path: Path, world: Path) -> None:
    other = tmp_path / "world"
    other.mkdir()
    for name in (SCHEMA_FILE, HOLDOUT_FILE):
        (other / name).write_bytes((world / name).read_bytes())
    onnx.save(_ranker(extra_ml_op=True), str(other / MODEL_FILE))
    with pytest.raises(ConfigError, match=r"\['ai.onnx.ml.Normalizer'\].*--engine ort-trt"):
        build_engine(_options(other, tmp_path, engine="plan"))
    report = build_engine(_options(other, tmp_path, engine="ort-trt"))
    assert any("ai.onnx.ml.Normalizer" in note for note in report.notes)


def test_the_production_config_and_image_pass(world: Path, tmp_path: Path) -> None:
    root = project_root()
    image = quadlet_value(root / engine.TRITON_QUADLET, "Image")
    assert image is not None
    options = _options(world, tmp_path, triton_image=image, request_rows=engine.REQUEST_ROWS)
    report = build_engine(replace(options, config=root / engine.DEFAULT_CONFIG))
    source = model_config_pb2.ModelConfig()
    text_format.Parse((root / engine.DEFAULT_CONFIG).read_text(), source)

    # The unit's image carries its pin (${RECSYS_TRITON_PIN}); the build image is that tag's.
    tag = image.split("${", 1)[0]
    assert report.release.tensorrt_image == tag.replace("/tritonserver:", "/tensorrt:")
    assert report.profile.max_rows == source.max_batch_size
    assert 1 <= report.profile.opt_rows <= source.max_batch_size
    assert _trt_parameters(_written(report))["trt_profile_opt_shapes"] == (
        f"features:{report.profile.opt_rows}x{WIDTH}"
    )


def test_the_built_config_names_the_heads_only_for_a_model_that_answers_them(
    world: Path, tmp_path: Path
) -> None:
    production = project_root() / engine.DEFAULT_CONFIG
    for part in ("a", "b", "c"):
        (tmp_path / part).mkdir()
    # The hand-made ranker has one output: the production config's heads are left out.
    headless = build_engine(replace(_options(world, tmp_path / "a"), config=production))
    assert [output.name for output in _written(headless).output] == ["score"]
    # The ranker build-world trains answers both.
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(400, WIDTH)).astype(np.float32)
    net = fit_net(rows, (rows[:, 0] > 0).astype(np.int8), None, replace(MLP, epochs=1))
    two = tmp_path / "two"
    shutil.copytree(world, two)
    (two / MODEL_FILE).write_bytes(export_net(net, "features", "score", WIDTH))
    both = build_engine(replace(_options(two, tmp_path / "b"), config=production))
    outputs = [(output.name, list(output.dims)) for output in _written(both).output]
    assert outputs == [("score", [1]), ("heads", [2])]
    assert any("'heads' FP32 [n, 2]" in check for check in both.checks)
    # A config may not declare another output of its own.
    extra = '{ name: "extra" data_type: TYPE_FP32 dims: [ 2 ] }'
    odd = _config().replace("dims: [ 1 ] } ]", f"dims: [ 1 ] }}, {extra} ]")
    assert extra in odd
    with pytest.raises(ConfigError, match="may only declare 'heads'"):
        build_engine(_options(two, tmp_path / "c", config=odd))


def test_the_shipped_gpu_config_has_the_profile_the_command_computes() -> None:
    """Its profile and warmups are the shapes a build from it would write and warm up."""
    source = model_config_pb2.ModelConfig()
    text_format.Parse((project_root() / engine.DEFAULT_CONFIG).read_text(), source)
    defaults = Settings.model_fields
    request_rows = defaults["prerank_keep"].default
    profile = profile_for(source, request_rows)

    assert profile.max_rows == source.max_batch_size
    assert {key: value for key, value in _trt_parameters(source).items() if "profile" in key} == {
        f"trt_profile_{bound}_shapes": shape for bound, shape in profile.shapes.items()
    }
    assert {warmup.name: warmup.batch_size for warmup in source.model_warmup} == {
        "one_request": profile.opt_rows,
        "largest_chunk": profile.max_rows,
    }


def test_release_of_a_mirrored_image() -> None:
    release = release_of("registry.local:5000/nvidia/tritonserver:25.01-py3")
    assert release.release == "25.01"
    assert release.tensorrt_image == "registry.local:5000/nvidia/tensorrt:25.01-py3"
    assert release.sdk_image == "registry.local:5000/nvidia/tritonserver:25.01-py3-sdk"


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="recsys")
    model = parser.add_subparsers(dest="command", required=True).add_parser("model")
    engine.register(model.add_subparsers(dest="model_command", required=True))
    return parser.parse_args(["model", "build-engine", *argv])


def test_the_command_prints_json_with_the_profile(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "source.pbtxt"
    config.write_text(_config())
    common = ["--world", str(world), "--config", str(config), "--triton-image", IMAGE]
    common += ["--request-rows", str(REQUEST_ROWS), "--dry-run", "--engine", "plan"]
    args = _cli([*common, "--out", str(tmp_path / "a" / "ranking_model"), "--json"])
    args.run(args)
    report = json.loads(capsys.readouterr().out)

    assert report["profile"]["opt_rows"] == OPT
    assert report["profile"]["shapes"]["max"] == f"features:{MAX_BATCH}x{WIDTH}"
    assert report["release"]["release"] == "24.10"
    assert report["dry_run"] == "--dry-run"
    assert report["commands"][0]["shell"].startswith("podman run --rm --device nvidia.com/gpu")
    assert "trtexec" in report["commands"][0]["argv"]

    args = _cli([*common, "--out", str(tmp_path / "b" / "ranking_model")])
    args.run(args)
    text = capsys.readouterr().out
    assert f"--optShapes=features:{OPT}x{WIDTH}" in text
    assert "commands (dry run: --dry-run):" in text


def test_without_a_gpu_nothing_is_run(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(subprocess, "run", never)
    report = build_engine(_options(world, tmp_path, dry_run=False))
    assert report.dry_run == "no GPU here (nvidia-smi is not on PATH)"
    assert report.timings_s == {}


def test_with_a_gpu_only_the_build_commands_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, ...]] = []

    def fake(argv: tuple[str, ...], check: bool) -> subprocess.CompletedProcess[bytes]:
        ran.append(tuple(argv))
        return subprocess.CompletedProcess(argv, 1 if argv[0] == "false" else 0)

    monkeypatch.setattr(subprocess, "run", fake)
    commands = [
        Command("build", "build", ("true", "build")),
        Command("verify", "measure", ("true", "perf")),
    ]
    assert list(run_build(commands)) == ["build"]
    assert ran == [("true", "build")]
    with pytest.raises(ConfigError, match="'fail' exited 1"):
        run_build([Command("build", "fail", ("false",))])


def test_a_plan_at_reduced_precision_holds_the_scores_tail_to_fp32(
    world: Path, tmp_path: Path
) -> None:
    from recsys_tools.model.engine.commands import plan_build

    options = _options(world, tmp_path, engine="plan")
    report = build_engine(options)
    tail = ("net_heads_m", "blend_abc", "score")
    argv = plan_build(options, report.release, report.profile, MODEL_FILE, tail).argv
    assert "--fp16" in argv
    assert "--precisionConstraints=obey" in argv
    assert "--layerPrecisions=net_heads_m:fp32,blend_abc:fp32,score:fp32" in argv
    full = plan_build(replace(options, precision="fp32"), report.release, report.profile, "m", tail)
    assert not any(flag.startswith("--layerPrecisions") for flag in full.argv)
