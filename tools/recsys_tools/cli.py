"""`recsys`: the operator's command line: worlds, Redis, the local stack, and the server.

Every expected failure ends in one line naming the cause and the fix, and a non-zero exit.
"""

from __future__ import annotations

import argparse
import logging

from app.core.errors import RecsysError
from app.core.log_setup import configure_logging
from recsys_tools import (
    callers,
    catalog_export,
    doctor,
    live_evaluation,
    loop_demo,
    outcomes,
    plan,
    replay,
    retrain,
    serve_commands,
    tune,
    verdict,
)
from recsys_tools.commands import Register
from recsys_tools.model import command as model
from recsys_tools.world import commands as world

log = logging.getLogger("recsys")

# Each module that owns commands registers them; this list is the whole command line.
GROUPS: tuple[Register, ...] = (
    world.register,
    serve_commands.register,
    doctor.register,
    plan.register,
    model.register,
    tune.register,
    replay.register,
    outcomes.register,
    verdict.register,
    retrain.register,
    loop_demo.register,
    live_evaluation.register,
    callers.register,
    catalog_export.register,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recsys", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for register in GROUPS:
        register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    args = _parser().parse_args(argv)
    try:
        args.run(args)
    except RecsysError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    return 0
