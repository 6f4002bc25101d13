"""The benchmark's figures as pictures, from its JSON report (matplotlib, no display needed).

python -m loadtest.plots docs/benchmarks.json      # redraws docs/benchmarks/*.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit
import matplotlib.pyplot as plt

PROCESSES = ("api", "redis", "triton")


def latency_against_load(report: dict[str, Any], path: Path) -> Path:
    steps = report["rate_steps"]
    rates = [step["rate"] for step in steps]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
        values = [step.get(key) for step in steps]
        if any(value is not None for value in values):
            ax.plot(rates, values, marker="o", label=label)
    ax.axhline(report["p99_bound_ms"], color="grey", linestyle="--", label="p99 bound")
    best = report.get("max_rate_at_p99")
    if best:
        ax.axvline(best, color="green", linestyle=":", label=f"highest passing: {best:g}/s")
    ax.set(xlabel="offered load (requests/s, open loop)", ylabel="latency (ms)")
    ax.set_title(f"Latency against offered load ({report['candidates']} candidates)")
    ax.legend()
    return _save(fig, path)


def cpu_by_process(report: dict[str, Any], path: Path) -> Path:
    cpu = report["cpu"]["cpu_ms_per_request"]
    names = [name for name in PROCESSES if name in cpu]
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    bars = ax.bar(names, [cpu[name] for name in names], color=["C0", "C1", "C2"][: len(names)])
    ax.bar_label(bars, fmt="%.2f")
    ax.set(ylabel="CPU ms per request")
    ax.set_title(f"CPU per request at {report['cpu']['rate']:g} requests/s")
    return _save(fig, path)


def stage_breakdown(report: dict[str, Any], path: Path) -> Path:
    stages = report["cpu"].get("stages", {})
    names = list(stages)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    positions = range(len(names))
    ax.barh([p + 0.2 for p in positions], [stages[n]["mean_ms"] for n in names], 0.4, label="mean")
    ax.barh([p - 0.2 for p in positions], [stages[n]["p99_ms"] for n in names], 0.4, label="p99")
    ax.set_yticks(list(positions), names)
    ax.invert_yaxis()  # the pipeline's order, top to bottom
    ax.set(xlabel="ms")
    ax.set_title("Time per stage (service histograms)")
    ax.legend()
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(report: dict[str, Any], folder: Path) -> list[Path]:
    return [
        latency_against_load(report, folder / "latency.png"),
        cpu_by_process(report, folder / "cpu.png"),
        stage_breakdown(report, folder / "stages.png"),
    ]


def main() -> None:
    source = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks.json")
    for path in write_plots(json.loads(source.read_text()), source.parent / source.stem):
        print(path)


if __name__ == "__main__":
    main()
