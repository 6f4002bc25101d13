"""CPU seconds used by processes and their descendants, from /proc (Linux), and the CPU a
steady load costs each of the stack's processes per request."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.openloop import Load, run, summarize

TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    return text[text.rindex(")") + 2 :].split()


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and every live descendant (Triton's backend stubs, say)."""
    tree = _children()
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        fields = _stat_fields(current)
        if fields is not None:
            total += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
        stack.extend(tree.get(current, []))
    return total


@dataclass(frozen=True, slots=True)
class Processes:
    api: int
    redis: int
    triton: int


def _cpu(processes: Processes) -> dict[str, float]:
    return {
        name: tree_cpu_seconds(pid)
        for name, pid in (
            ("api", processes.api),
            ("redis", processes.redis),
            ("triton", processes.triton),
        )
    }


async def cpu_per_request(
    load: Load, processes: Processes, rate: float, duration_s: float
) -> dict[str, Any]:
    before = _cpu(processes)
    result = await run(load, rate, duration_s)
    after = _cpu(processes)
    summary = summarize(result)
    answered = max(summary.ok, 1)
    return {
        "rate": rate,
        "requests": summary.requests,
        "ok": summary.ok,
        "p50_ms": summary.latency.p50_ms,
        "p99_ms": summary.latency.p99_ms,
        "cpu_ms_per_request": {
            name: round((after[name] - before[name]) * 1000.0 / answered, 3) for name in before
        },
    }
