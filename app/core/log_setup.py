"""The service's log lines: one format for the API's workers and the ingest consumer."""

from __future__ import annotations

import logging

# The process id tells the workers' lines apart (several write to one journal).
LOG_FORMAT = "%(asctime)s [%(process)d] %(name)s %(message)s"


def configure_logging() -> None:
    """The service's own log lines at INFO, unless logging is set up already.

    Called in the supervisor and again in each worker: a worker is a new interpreter, and
    uvicorn configures only its own loggers there, so reloads and start-up reports would
    otherwise go unlogged with several workers.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
