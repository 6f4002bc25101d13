"""Where a retrain is: retrain.state, written as each step starts, and what a stopped run
left behind, said and cleared by the next."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.atomic_files import write_atomically

log = logging.getLogger("recsys.retrain")
STATE_FILE = "retrain.state"


@dataclass(slots=True)
class Progress:
    """Where the run is, written to retrain.state at each step."""

    worlds: Path
    started: float = field(default_factory=time.time)
    step: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    def save(self, **more: Any) -> None:
        body = {"step": self.step, "started": self.started, "pid": os.getpid(), **more}
        write_atomically(self.worlds / STATE_FILE, json.dumps(body).encode())

    @contextmanager
    def step_in(self, name: str, said: str) -> Iterator[None]:
        self.step = name
        self.save()
        log.info("%s", said)
        began = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - began, 2)


def said_stopped(worlds: Path) -> None:
    state = worlds / STATE_FILE
    if not state.is_file():
        return
    try:
        last = json.loads(state.read_text())
    except ValueError:
        last = {}
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(last.get("started", 0))))
    log.warning(
        "the last retrain (started %s UTC, pid %s) stopped during its %s step; its "
        "unfinished files are cleared, the world serving was never touched",
        when,
        last.get("pid", "?"),
        last.get("step", "?"),
    )
    for leftover in worlds.glob(".building-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    state.unlink()
