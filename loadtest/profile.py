"""Where the API's CPU goes under load: a sampling profile, as a flame graph and a table.

Starts the local stack on a world and the API as its own process, offers it an open-loop
load, and samples the API with py-spy (on-CPU samples only, without pausing it) for the
run's length. Writes, under --out:

- `flame.svg`: the flame graph, to open in a browser;
- `stacks.txt`: the collapsed stacks (what flame graph tools and speedscope read); py-spy
  writes one format a run, so the flame graph samples a second turn of the same load;
- `native.txt`: a third turn's stacks with the native frames under the Python ones;
- `profile.json`: the table below, with the API's CPU a request and the load's figures.

The table splits the samples by part of the request path: a sample anywhere below a stage
counts for that stage (its I/O clients and numpy included), any other for the innermost
part of the edge it is in (the route, the gate, the framework, the HTTP server, metrics) or
the event loop. The same table before and after a change says what the change paid for.

Beside each part, the floor: how much of it is the work itself (FAISS's scan, numpy's
gathers and products, BLAS, protobuf's serialisation, onnxruntime), from the third turn,
whose samples name the native code they were taken in. A sample whose innermost frame
(past the C library's copies) is in one of those libraries is work; the interpreter, the
event loop and the clients' machinery around them are not. That turn pauses the API for
each sample (native stacks cannot be read otherwise), so it gives shares, not CPU.

    python -m loadtest.profile --rate 200 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from loadtest.cpu import tree_cpu_seconds
from loadtest.openloop import Load, demo_bodies, run, summarize
from loadtest.openloop.stats import Summary
from loadtest.service import ApiProcess, local_service

WARMUP_S = 3.0
# Over a 30 s turn, each part of the table's share within about a percent.
SAMPLES_PER_S = 50

# The stages, by the files their work runs in: the innermost one on a stack takes the sample.
STAGE_FILES: tuple[tuple[str, str], ...] = (
    ("app/pipeline/stages/features.py", "features"),
    ("app/pipeline/stages/recall.py", "recall"),
    ("app/pipeline/sources/", "recall"),
    ("app/pipeline/stages/prerank.py", "pre-rank"),
    ("app/pipeline/signals.py", "pre-rank"),
    ("app/pipeline/stages/filter.py", "filter"),
    ("app/pipeline/filters/", "filter"),
    ("app/pipeline/stages/fetch.py", "fetch"),
    ("app/pipeline/stages/pack.py", "pack"),
    ("app/pipeline/packing.py", "pack"),
    ("app/pipeline/stages/rank.py", "rank"),
    ("app/pipeline/stages/rerank.py", "rerank"),
    ("app/pipeline/selectors/", "rerank"),
)
# Outside every stage: the innermost of these on the stack takes the sample.
EDGE_FILES: tuple[tuple[str, str], ...] = (
    ("app/pipeline/shadow.py", "shadow calls"),
    ("app/pipeline/", "pipeline (step order, timings, trace)"),
    ("app/api/recommend.py", "answer (validation, JSON, notes)"),
    ("app/api/routes.py", "route"),
    ("app/api/models.py", "route"),
    ("app/api/gate.py", "gate"),
    ("app/api/precheck.py", "gate"),
    ("app/process/admission.py", "gate"),
    ("app/process/concurrency_limit.py", "gate"),
    ("app/core/metrics.py", "metrics"),
    ("prometheus_client/", "metrics"),
    ("redis/", "Redis client (callbacks)"),
    ("grpc/", "gRPC client (callbacks)"),
    ("tritonclient/", "gRPC client (callbacks)"),
    ("fastapi/", "framework (FastAPI, Starlette, pydantic)"),
    ("starlette/", "framework (FastAPI, Starlette, pydantic)"),
    ("pydantic/", "framework (FastAPI, Starlette, pydantic)"),
    ("uvicorn/", "HTTP server"),
    ("asyncio/", "event loop"),
    ("uvloop/", "event loop"),
)
ELSEWHERE = "elsewhere"
# Native libraries whose code is the request's work itself, by a piece of their file name.
WORK_LIBRARIES = (
    "swigfaiss",
    "faiss/",
    "numpy/",
    "openblas",
    "libgomp",
    "_upb",
    "protobuf",
    "onnxruntime",
)
# Native frames that take the work of whoever called them (copies, allocation).
PASSED_THROUGH = ("libc.so", "libc-", "ld-linux", "libm.so")


def _file(frame: str) -> str:
    """The file of a collapsed frame, `function (path:line)`."""
    start = frame.rfind(" (")
    return frame[start + 2 :] if start >= 0 else frame


def _innermost(files: Sequence[str], parts: Iterable[tuple[str, str]]) -> str | None:
    rules = tuple(parts)
    for path in reversed(files):
        for marker, part in rules:
            if marker in path:
                return part
    return None


def part_of(stack: str) -> str:
    """The part of the request path one collapsed stack (root first) counts for."""
    files = [_file(frame) for frame in stack.split(";")]
    return _innermost(files, STAGE_FILES) or _innermost(files, EDGE_FILES) or ELSEWHERE


def shares(collapsed: Iterable[str]) -> dict[str, float]:
    """Each part's share of the samples (0 to 1), largest first, from collapsed lines."""
    counts: Counter[str] = Counter()
    for line in collapsed:
        stack, _, number = line.rstrip("\n").rpartition(" ")
        if stack and number.isdigit():
            counts[part_of(stack)] += int(number)
    total = sum(counts.values()) or 1
    return {part: round(n / total, 4) for part, n in counts.most_common()}


def is_work(stack: str) -> bool:
    """Whether a native stack's innermost frame, past the C library's, is the work itself."""
    for frame in reversed(stack.split(";")):
        where = _file(frame)
        if frame.startswith("0x") or any(lib in where for lib in PASSED_THROUGH):
            continue
        return ".py:" not in where and any(lib in where for lib in WORK_LIBRARIES)
    return False


def work_shares(collapsed: Iterable[str]) -> dict[str, float]:
    """Of each part's native samples, the share that was the work itself (0 to 1)."""
    samples: Counter[str] = Counter()
    work: Counter[str] = Counter()
    for line in collapsed:
        stack, _, number = line.rstrip("\n").rpartition(" ")
        if stack and number.isdigit():
            part = part_of(stack)
            samples[part] += int(number)
            if is_work(stack):
                work[part] += int(number)
    return {part: round(work[part] / n, 4) for part, n in samples.items() if n}


def _py_spy() -> str:
    found = shutil.which("py-spy") or shutil.which("py-spy", path=sysconfig.get_path("scripts"))
    if found is None:
        raise SystemExit("py-spy is not installed: pip install py-spy (make setup installs it)")
    return found


def _sampler(
    pid: int, seconds: float, form: str, out: Path, native: bool
) -> subprocess.Popen[bytes]:
    command = [_py_spy(), "record", "--pid", str(pid), "--duration", str(round(seconds))]
    command += ["--rate", str(SAMPLES_PER_S), "--format", form, "-o", str(out)]
    command += ["--native"] if native else ["--nonblocking"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def _sampled(
    api: ApiProcess,
    load: Load,
    rate: float,
    seconds: float,
    form: str,
    out: Path,
    native: bool = False,
) -> tuple[Summary, float]:
    """One turn of the load under one sampler: what it answered, and the API's CPU seconds."""
    sampler = _sampler(api.pid, seconds, form, out, native)
    before = tree_cpu_seconds(api.pid)
    result = summarize(await run(load, rate, seconds))
    used = tree_cpu_seconds(api.pid) - before
    _, error = sampler.communicate(timeout=seconds + 30.0)
    if sampler.returncode != 0:
        raise RuntimeError(f"py-spy failed: {error.decode(errors='replace')[-2000:]}")
    return result, used


async def profile(api: ApiProcess, rate: float, seconds: float, out: Path) -> dict[str, Any]:
    bodies = demo_bodies(1000, 20)
    load = Load(f"{api.url}/recommend", bodies)
    await run(load, rate, WARMUP_S)
    # One sampler a turn: two on one process at once slowed it past the load (on a 2-core
    # machine, half of 200 requests/s shed), one at this rate changes nothing measurable.
    result, used = await _sampled(api, load, rate, seconds, "raw", out / "stacks.txt")
    await _sampled(api, load, rate, seconds, "flamegraph", out / "flame.svg")
    await _sampled(api, load, rate, seconds, "raw", out / "native.txt", native=True)
    with (out / "stacks.txt").open() as stacks:
        table = shares(stacks)
    with (out / "native.txt").open() as stacks:
        work = work_shares(stacks)
    return {
        "rate": rate,
        "seconds": seconds,
        "answered": result.ok,
        "requests": result.requests,
        "p50_ms": result.latency.p50_ms,
        "p99_ms": result.latency.p99_ms,
        "api_cpu_ms_per_request": round(used * 1000.0 / max(result.ok, 1), 3),
        "shares": table,
        "work_shares": work,
    }


def _print(report: dict[str, Any]) -> None:
    print(
        f"{report['rate']:.0f}/s offered, {report['answered']} of {report['requests']} answered, "
        f"p50 {report['p50_ms']:.1f} ms, p99 {report['p99_ms']:.1f} ms, "
        f"API CPU {report['api_cpu_ms_per_request']:.2f} ms a request"
    )
    cpu_ms = report["api_cpu_ms_per_request"]
    print("  share    ms   work ms  part")
    floor = 0.0
    for part, share in report["shares"].items():
        work_ms = share * cpu_ms * report["work_shares"].get(part, 0.0)
        floor += work_ms
        print(f"  {share * 100:5.1f}%  {share * cpu_ms:5.2f}  {work_ms:5.2f}  {part}")
    print(f"  the work itself: {floor:.2f} ms of {cpu_ms:.2f} ms a request")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s, open loop")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to sample")
    parser.add_argument("--out", type=Path, default=Path("var/profile"))
    args = parser.parse_args(argv)
    _py_spy()
    args.out.mkdir(parents=True, exist_ok=True)
    with local_service(args.world) as (api, _stack):
        report = asyncio.run(profile(api, args.rate, args.seconds, args.out))
    (args.out / "profile.json").write_text(json.dumps(report, indent=2) + "\n")
    _print(report)
    print(f"flame graph: {args.out / 'flame.svg'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
