"""`recsys-serve`: the API, configured by RECSYS_* environment variables.

The image runs only this. Building worlds, loading Redis, the local stack and host checks
are the operator's tools (`recsys`, in the recsys-tools package), not part of the server.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)


def serve(workers: int = 1, log_level: str = "info", access_log: bool = False) -> None:
    import uvicorn

    from app.settings import Settings

    settings = Settings()  # validated here, once, before any worker starts
    # uvicorn raises the signal that stopped it again once it has shut down; a SIGTERM that
    # drained and finished every request is a normal stop, so the process exits 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
    )


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--access-log", action="store_true", help="log every request (costs CPU under load)"
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(prog="recsys-serve", description=__doc__)
    add_serve_options(parser)
    args = parser.parse_args(argv)
    serve(args.workers, args.log_level, args.access_log)
    return 0
