"""Every check runs before the model directory is written, and it appears only when complete.

Files go to a staging directory beside --out, renamed into place at the end, so a refused or
failed build never leaves a half-written model where Triton could load it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.errors import ConfigError
from app.world.layout import MODEL_FILE
from app.world.schema import HEADS_OUTPUT, world_schema
from app.world.stamp import read_stamp
from recsys_tools.model.engine.calibration import (
    calibration_rows,
    check_table,
    qdq_drift,
    write_calibration_table,
    write_qdq_model,
)
from recsys_tools.model.engine.checks import check_accelerator, check_serving, check_signature
from recsys_tools.model.engine.commands import commands_for
from recsys_tools.model.engine.config import config_text, read_config, serving_config
from recsys_tools.model.engine.graph import graph_io
from recsys_tools.model.engine.layout import BUILD_DIR, CALIBRATION_DIR, VERSION_DIR
from recsys_tools.model.engine.options import BuildOptions, shown
from recsys_tools.model.engine.profile import Profile, profile_for
from recsys_tools.model.engine.release import release_of
from recsys_tools.model.engine.report import EngineReport
from recsys_tools.model.engine.rewrite import check_identity, foreign_ops, tensorrt_graph
from recsys_tools.model.engine.runner import missing_gpu, run_build
from recsys_tools.model.holdout import load_holdout
from recsys_tools.model.precision import score_tail

if TYPE_CHECKING:
    from app.world.schema import FeatureSchema


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


def _load_world(world: Path) -> tuple[FeatureSchema, Any]:
    import onnx

    path = world / MODEL_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing: build the world (recsys build-world or build-demo)")
    return world_schema(world, None), onnx.load(str(path))


def build_engine(options: BuildOptions) -> EngineReport:
    """Check everything, write the model directory, then run or print the GPU steps."""
    where = f"--config {shown(options.config)}"
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
        heads = any(tensor.name == HEADS_OUTPUT for tensor in graph_io(model)[1])
        config = serving_config(source, options, profile, table, world_id, heads)
        (staging / "config.pbtxt").write_text(config_text(config, options, profile))
        read_config(staging / "config.pbtxt")  # what Triton will parse, parsed back
        if options.out.exists():
            options.out.rmdir()
        os.replace(staging, options.out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report.checks.append(f"{options.out / 'config.pbtxt'} parses as a Triton ModelConfig")
    report.files = sorted(str(p) for p in options.out.rglob("*") if p.is_file())
    tail = tuple(score_tail(ready))
    report.commands = commands_for(options, release, profile, onnx_name, table, tail)
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

    home = staging / (BUILD_DIR if options.engine == "plan" else VERSION_DIR)
    home.mkdir()
    (staging / VERSION_DIR).mkdir(exist_ok=True)
    onnx.save(ready, str(home / MODEL_FILE))
    if options.precision != "int8":
        return MODEL_FILE, None

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
