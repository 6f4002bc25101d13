"""The commands that run the service: serve (the API alone) and demo (a local stack)."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import add_serve_options, serve
from recsys_tools.commands import Commands
from recsys_tools.demo import run_demo, stack_options


def _serve(args: argparse.Namespace) -> None:
    serve(args.workers, args.log_level, args.access_log)


def _demo(args: argparse.Namespace) -> None:
    run_demo(stack_options(args.world), args.host, args.port)


def register(commands: Commands) -> None:
    world = argparse.ArgumentParser(add_help=False)
    world.add_argument("--world", type=Path, default=Path("var/world"), help="world directory")
    world.add_argument("--schema", type=Path, default=None, help="feature schema JSON")
    served = commands.add_parser("serve", help="run the API (configured by RECSYS_* variables)")
    add_serve_options(served)
    served.set_defaults(run=_serve)

    demo = commands.add_parser(
        "demo",
        parents=[world],
        help="serve a world (built if absent) on a local Redis + Triton + API",
    )
    demo.add_argument("--host", default=None, help="default: RECSYS_HOST, else 127.0.0.1")
    demo.add_argument("--port", type=int, default=None, help="default: RECSYS_PORT, else 8080")
    demo.set_defaults(run=_demo)
