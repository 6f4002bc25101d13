"""The build commands run only where they can; elsewhere the report says why.

Without a GPU or podman the same build prints its commands instead, so the command is useful
(and testable) on any host.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time

from app.core.errors import ConfigError
from recsys_tools.model.engine.commands import CHECK_CONTAINER, Command

log = logging.getLogger(__name__)


def missing_gpu() -> str | None:
    """Why this host cannot run the build commands; None when it can."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no GPU here (nvidia-smi is not on PATH)"
    try:
        probe = subprocess.run([smi, "-L"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no usable GPU here (nvidia-smi -L: {exc})"
    if probe.returncode != 0:
        return f"no usable GPU here (nvidia-smi -L exited {probe.returncode})"
    return "podman is not on PATH" if shutil.which("podman") is None else None


def run_build(commands: list[Command]) -> dict[str, float]:
    """Run the build commands in order, timing each; stop at the first that fails."""
    timings: dict[str, float] = {}
    for command in (c for c in commands if c.stage == "build"):
        log.info("%s: %s", command.purpose, command.shell)
        started = time.perf_counter()
        result = subprocess.run(command.argv, check=False)
        timings[command.purpose] = round(time.perf_counter() - started, 1)
        if result.returncode != 0:
            raise ConfigError(
                f"{command.purpose!r} exited {result.returncode} ({command.argv[0]}): see its "
                f"output above; `podman stop {CHECK_CONTAINER}` if it was left running"
            )
    return timings
