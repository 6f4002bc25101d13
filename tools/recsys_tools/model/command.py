"""`recsys model`: the command group over the world's ranking model.

compare (FP32 against reduced copies), build-engine (TensorRT or a checked ONNX copy) and load
(a running Triton loads a new version), each registered here and nowhere else.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.core.errors import ConfigError
from app.world.schema import world_schema
from recsys_tools.commands import Commands
from recsys_tools.model import compare as compare_module
from recsys_tools.model import engine, load
from recsys_tools.model.compare import (
    CANDIDATES,
    PRECISIONS,
    CompareOptions,
    compare_models,
    render_text,
)


def _compare(args: argparse.Namespace) -> None:
    for flag in ("rows", "top", "candidates"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag} {value}: give a positive number")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: name a directory")
    precisions = PRECISIONS if args.precision == "all" else (args.precision,)
    options = CompareOptions(precisions, args.rows, args.top, args.candidates, args.out)
    report = compare_models(args.world, world_schema(args.world, None), options)
    print(json.dumps(report.as_dict(), indent=2) if args.json else render_text(report))


def register(commands: Commands) -> None:
    """`model compare` and its options, run through `args.run` like every other command."""
    model = commands.add_parser("model", help="the world's ranking model")
    subcommands = model.add_subparsers(dest="model_command", required=True)
    compare = subcommands.add_parser(
        "compare",
        help="FP32 against FP16 and INT8 copies: AUC, top-N agreement, size, latency",
        description=compare_module.__doc__,
    )
    add = compare.add_argument
    add("--world", type=Path, required=True, help="the world directory (holds model.onnx)")
    add("--precision", choices=(*PRECISIONS, "all"), default="all", help="default: all")
    add("--rows", type=int, default=None, help="held-out rows to use; default: all")
    add("--top", type=int, default=20, help="the top N compared per request (default 20)")
    add(
        "--candidates",
        type=int,
        default=CANDIDATES,
        help=f"rows per request (default {CANDIDATES})",
    )
    add("--out", type=Path, default=None, help="keep the converted models in this directory")
    add("--json", action="store_true", help="print the report as JSON")
    compare.set_defaults(run=_compare)
    engine.register(subcommands)
    load.register(subcommands)
