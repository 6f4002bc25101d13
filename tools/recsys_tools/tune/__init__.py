"""`recsys tune batching`: the dynamic batcher's settings measured against a running Triton.

For each max_queue_delay_microseconds (and max_batch_size, instance count) it loads the model
with that config through Triton's model control, drives open-loop load at the target rate,
and reads Triton's batch statistics over the window: p99, throughput, and how many rows and
requests each execution merged. It recommends the setting with the most headroom under the
p99 target and puts the original config back at the end (--keep leaves the chosen one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path

from app.core.cascade import PRERANK_KEEP
from app.core.errors import ConfigError
from app.world.schema import load_schema
from recsys_tools.commands import Commands
from recsys_tools.tune.files import write_outputs
from recsys_tools.tune.report import render_text, report_json
from recsys_tools.tune.sweep import TuneOptions, tune_batching

# One service request's rows: what pre-rank keeps of the pool.
ROWS: int = PRERANK_KEEP


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers, comma-separated") from None
    if not values:
        raise argparse.ArgumentTypeError("give at least one value")
    return values


def _positive(flag: str, value: float, zero_ok: bool = False) -> None:
    # Written as `not (...)` so that NaN fails too.
    if not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        raise ConfigError(f"{flag} must be {'>=' if zero_ok else '>'} 0 and finite (got {value:g})")


def options_from(args: argparse.Namespace) -> TuneOptions:
    """The sweep's options, checked: every bad value is refused before Triton is touched."""
    for flag, value in (("--rate", args.rate), ("--duration", args.duration)):
        _positive(flag, value)
    _positive("--p99-ms", args.p99_ms)
    _positive("--timeout-s", args.timeout_s)
    _positive("--warmup", args.warmup, zero_ok=True)
    _positive("--rows", args.rows)
    lists = (("--delays", args.delays, 0), ("--max-batch-sizes", args.max_batch_sizes, 1))
    for flag, values, least in (*lists, ("--instances", args.instances, 1)):
        if values is not None and min(values) < least:
            raise ConfigError(f"{flag} {min(values)}: each value must be >= {least}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: name a directory")
    return TuneOptions(
        url=args.url,
        model=args.model,
        rate=args.rate,
        rows=args.rows,
        delays=args.delays,
        max_batch_sizes=args.max_batch_sizes,
        instances=args.instances,
        duration_s=args.duration,
        warmup_s=args.warmup,
        p99_ms=args.p99_ms,
        world=args.world,
        timeout_s=args.timeout_s,
        keep=args.keep,
    )


def _run_batching(args: argparse.Namespace) -> None:
    report = asyncio.run(tune_batching(options_from(args)))
    notes = write_outputs(report, args.out) if args.out is not None else []
    if args.json:
        print(json.dumps(report_json(report) | {"files": notes}, indent=2))
    else:
        print(render_text(report, notes))


def register(commands: Commands) -> None:
    """`tune batching` and its options, run through `args.run` like every other command."""
    tune = commands.add_parser("tune", help="measure serving settings against a running Triton")
    batching = tune.add_subparsers(dest="tune_command", required=True).add_parser(
        "batching",
        help="sweep the dynamic batcher's delay (and batch size, instances) at a target rate",
        description=__doc__,
    )
    add = batching.add_argument
    add("--url", default="127.0.0.1:8001", help="Triton's gRPC address (default 127.0.0.1:8001)")
    model = load_schema().model_name
    add("--model", default=model, help=f"default: the feature schema's, {model}")
    add("--rate", type=float, required=True, help="the target: requests/s, sent open-loop")
    add("--rows", type=int, default=ROWS, help=f"rows per request (default {ROWS})")
    add(
        "--delays",
        type=_int_list,
        required=True,
        help="max_queue_delay_microseconds values, comma-separated: 0,500,2000",
    )
    add("--max-batch-sizes", type=_int_list, help="comma-separated; default: the loaded one")
    add("--instances", type=_int_list, help="instance counts, comma-separated; default: loaded")
    add("--duration", type=float, default=10.0, help="measured seconds per setting (default 10)")
    add("--warmup", type=float, default=2.0, help="seconds of load before each (default 2)")
    add("--p99-ms", type=float, required=True, help="the p99 target, from each due time")
    add("--timeout-s", type=float, default=5.0, help="a request unanswered this long is an error")
    add("--world", type=Path, help="send this world's held-out rows; default: random rows")
    add("--out", type=Path, help="write tuning.json, tuning.png and the chosen config.pbtxt")
    add("--keep", action="store_true", help="leave the chosen config loaded, not the original")
    add("--json", action="store_true", help="print the report as JSON")
    batching.set_defaults(run=_run_batching)
