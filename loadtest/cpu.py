"""CPU seconds used by processes and their descendants, from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

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
