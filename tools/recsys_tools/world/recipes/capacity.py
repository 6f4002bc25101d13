"""Whether a log fits the local engine, said before it reads for minutes and dies.

The local engine holds the whole log and everything learnt from it in one process: its peak
grows by about BYTES_PER_ROW of resident memory per interaction (loadtest/world_scale.py).
Where the process has a limit of its own (an address-space limit, ulimit -v, or its cgroup's
memory limit) and the log's rows alone pass it, the build stops at once and names the Spark
engine; running out of memory part-way says the same.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pyarrow.parquet as pq

from app.core.errors import ConfigError
from recsys_tools.world.read.formats import COMPRESSED, FileLayout, file_format
from recsys_tools.world.read.tables import FLAGS

BYTES_PER_ROW = 240
SAMPLE_BYTES = 1 << 20
CGROUPS = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as a page-rounded 2**63 - 1; anything this large is none.
NO_LIMIT = 2**60
GIB = float(2**30)


def estimated_rows(path: Path, layout: FileLayout) -> int | None:
    """Parquet's own count, or a text file's size over its first lines' mean length; None
    for a compressed file (its size says little)."""
    kind = file_format(path, layout, FLAGS["log"])
    if kind == "parquet":
        return int(pq.ParquetFile(path).metadata.num_rows)
    if path.suffix.lower() in COMPRESSED:
        return None
    with path.open("rb") as handle:
        head = handle.read(SAMPLE_BYTES)
    lines = head.count(b"\n")
    if lines == 0:
        return 1
    return int(path.stat().st_size / (len(head) / lines))


def memory_limit() -> tuple[int, str] | None:
    """The tightest limit this process runs under, and what sets it."""
    limits = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft, "its address-space limit (ulimit -v)"))
    cgroup = _cgroup_limit()
    if cgroup is not None:
        limits.append((cgroup, "its cgroup's memory limit"))
    return min(limits) if limits else None


def _cgroup_limit() -> int | None:
    """memory.max (cgroup v2) or memory.limit_in_bytes (v1) of this process's own cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, where = line.split(":", 2)
        if controllers == "":
            path = CGROUPS / where.lstrip("/") / "memory.max"
        elif "memory" in controllers.split(","):
            path = CGROUPS / "memory" / where.lstrip("/") / "memory.limit_in_bytes"
        else:
            continue
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < NO_LIMIT:
            return int(text)
    return None


def too_big(path: Path, need: str) -> ConfigError:
    return ConfigError(
        f"{path.name} is too large for the local engine in this process ({need}): build it "
        "with --engine spark (README, Beyond one machine)"
    )


def check_fits(path: Path, layout: FileLayout) -> None:
    """Refuse a log whose estimated peak passes this process's own memory limit."""
    limit = memory_limit()
    if limit is None:
        return
    rows = estimated_rows(path, layout)
    if rows is None:
        return
    # The rows alone, without what the process maps before any (Python, PyTorch, onnxruntime:
    # 3 GB resident, 6 GB of address space, measured): a log refused here cannot fit, and one
    # let through may still run out, which the build then says in the same words.
    need = rows * BYTES_PER_ROW
    if need > limit[0]:
        raise too_big(
            path,
            f"about {rows:,} rows need more than {need / GIB:.1f} GiB, {limit[1]} is "
            f"{limit[0] / GIB:.1f} GiB",
        )
