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
import json
from pathlib import Path

from app.core.errors import ConfigError
from recsys_tools.commands import Commands
from recsys_tools.localstack import project_root
from recsys_tools.model.engine.build import build_engine
from recsys_tools.model.engine.calibration import CALIBRATION_ROWS
from recsys_tools.model.engine.commands import Command
from recsys_tools.model.engine.options import (
    CACHE_QUADLET,
    DEFAULT_CACHE_VOLUME,
    DEFAULT_CONFIG,
    ENGINES,
    PRECISIONS,
    TRITON_QUADLET,
    BuildOptions,
    quadlet_value,
)
from recsys_tools.model.engine.profile import REQUEST_ROWS, Profile, profile_for
from recsys_tools.model.engine.release import ImageRelease, release_of
from recsys_tools.model.engine.report import EngineReport, render_text
from recsys_tools.model.engine.runner import run_build

__all__ = [
    "DEFAULT_CONFIG",
    "REQUEST_ROWS",
    "TRITON_QUADLET",
    "BuildOptions",
    "Command",
    "EngineReport",
    "ImageRelease",
    "Profile",
    "build_engine",
    "profile_for",
    "quadlet_value",
    "register",
    "release_of",
    "render_text",
    "run_build",
]


def _options(args: argparse.Namespace) -> BuildOptions:
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


def register(model_commands: Commands) -> None:
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
