"""`recsys-serve`: the API, configured by RECSYS_* environment variables.

The image runs only this. Building worlds, loading Redis, the local stack and host checks
are the operator's tools (`recsys`, in the recsys-tools package), not part of the server.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from collections.abc import MutableMapping
from types import FrameType
from typing import Any

from app.core.binding import bind_error, in_use
from app.core.errors import ConfigError, RecsysError
from app.core.log_setup import configure_logging

log = logging.getLogger("recsys")


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)


APP = "app.main:create_app"
# How long the supervisor waits for a worker's answer to "have you started?".
STARTED_CHECK_S = 1.0


def _supervisor() -> type[Any]:
    """uvicorn's worker supervisor, handing SIGUSR1 (a reload) on to every worker.

    uvicorn's supervisor takes over the signals, and calls its `handle_<signal>` method for
    each; it has none for SIGUSR1. A worker still starting gets the signal once it has
    started (uvicorn's health check says so): before its handler is in place the signal
    would kill it, and it may have read the files before they changed. The supervisor loads
    no part of the server, so the signal is app.process.reload.RELOAD_SIGNAL restated.
    """
    from uvicorn.supervisors import Multiprocess
    from uvicorn.supervisors.multiprocess import Process

    class Supervisor(Multiprocess):
        def __init__(self, config: Any, sockets: list[socket.socket]) -> None:
            super().__init__(config, sockets)
            self.owed: set[Process] = set()  # started workers still to be told to reload

        def handle_usr1(self) -> None:
            self.owed = set(self.processes)
            self._pay_reloads()

        def keep_subprocess_alive(self) -> None:
            super().keep_subprocess_alive()
            self._pay_reloads()

        def _pay_reloads(self) -> None:
            for worker in tuple(self.owed):
                if worker not in self.processes:
                    self.owed.discard(worker)  # replaced: the new one read the files afresh
                elif worker.pid is not None and worker.is_ready(timeout=STARTED_CHECK_S):
                    os.kill(worker.pid, signal.SIGUSR1)
                    self.owed.discard(worker)

    return Supervisor


def ensure_port_free(host: str, port: int) -> None:
    """Refuse a busy port before anything is loaded, rather than after."""
    error = bind_error(host, port)
    if error is not None:
        cause = "is in use" if in_use(error) else f"cannot be bound ({error})"
        raise ConfigError(
            f"port {port} on {host} {cause}: stop what holds it, or choose another port "
            "(RECSYS_PORT, or --port)"
        )


def serve(workers: int | None = None, log_level: str = "info", access_log: bool = False) -> None:
    import uvicorn

    from app.core.settings import load_settings
    from app.process.reload import hold_reload_signals
    from app.process.workers import shared_metrics

    # Validated here, once, before any worker starts; --workers gets the setting's bounds.
    settings = load_settings(**({} if workers is None else {"workers": workers}))
    ensure_port_free(settings.host, settings.port)
    count = settings.workers
    # Each worker reads its settings afresh: the count must reach them too (an /admin call
    # on one worker signals the others only when it knows there are others).
    os.environ["RECSYS_WORKERS"] = str(count)
    # uvicorn raises the signal that stopped it again once it has shut down; a SIGTERM that
    # drained and finished every request is a normal stop, so the process exits 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    hold_reload_signals()  # a `systemctl reload` during start-up must not kill the process
    options: dict[str, Any] = {
        "factory": True,
        "host": settings.host,
        "port": settings.port,
        "workers": count,
        "log_level": log_level,
        "access_log": access_log,
        "timeout_graceful_shutdown": max(1, round(settings.shutdown_grace_s)),
        # X-Forwarded-For only from the proxies named: uvicorn otherwise believes it from
        # 127.0.0.1, and a proxy on this host would make every client look local.
        "proxy_headers": bool(settings.trusted_proxies),
        "forwarded_allow_ips": settings.trusted_proxies or None,
    }
    with shared_metrics(count):
        if count == 1:
            uvicorn.run(APP, **options)
        else:
            config = uvicorn.Config(APP, **options)
            _supervisor()(config, sockets=[config.bind_socket()]).run()


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes on the one port (default: RECSYS_WORKERS, 1); one set of metrics",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--access-log", action="store_true", help="log every request (costs CPU under load)"
    )


# Requests run concurrently in a worker; a BLAS thread pool inside one request's products
# only contends with them (measured: 8-12% more API CPU a request with a tenth of the
# catalog added online, none on a world without). Set before numpy first loads OpenBLAS,
# which reads it once; an operator's own value wins.
BLAS_THREADS = "OPENBLAS_NUM_THREADS"


def limit_blas_threads(environ: MutableMapping[str, str]) -> None:
    environ.setdefault(BLAS_THREADS, "1")


def main(argv: list[str] | None = None) -> int:
    limit_blas_threads(os.environ)
    configure_logging()
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="recsys-serve", description=__doc__)
    add_serve_options(parser)
    args = parser.parse_args(argv)
    try:
        serve(args.workers, args.log_level, args.access_log)
    except RecsysError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
