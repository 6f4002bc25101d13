"""The files `recsys tune batching --out DIR` writes: the report, a plot, the chosen config."""

from __future__ import annotations

import json
from pathlib import Path

from recsys_tools.tune.config import config_text
from recsys_tools.tune.report import MEETS, TuneReport, number, report_json, verdict


def write_plot(report: TuneReport, path: Path) -> str | None:
    """p99 and throughput per setting; the reason when there is no plot."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    results, target = report.results, report.p99_target_ms
    labels = [r.setting.label for r in results]
    chosen = report.recommendation.index if report.recommendation else -1
    figure = Figure(figsize=(max(6.0, 1.1 * len(results) + 2), 6.5), layout="constrained")
    latency, rate = figure.subplots(2, 1, sharex=True)
    colors = ["tab:green" if verdict(r, target) == MEETS else "tab:red" for r in results]
    bars = latency.bar(labels, [r.p99_ms or 0.0 for r in results], color=colors)
    latency.axhline(target, color="black", linestyle="--", label=f"p99 target {target:g} ms")
    latency.set_ylabel("p99 ms (from due time)")
    latency.set_ylim(0, 1.3 * max(target, *(r.p99_ms or 0.0 for r in results)))
    latency.legend(loc="upper right")
    rate.bar(labels, [r.throughput_rps for r in results], color="tab:blue")
    rate.axhline(report.rate, color="black", linestyle="--", label=f"offered {report.rate:g}/s")
    rate.set_ylabel("answered requests/s")
    rate.set_ylim(0, 1.3 * max(report.rate, *(r.throughput_rps for r in results)))
    rate.legend(loc="upper right")
    rate.set_xlabel("max_queue_delay_microseconds / max_batch_size / instances")
    rate.tick_params(axis="x", labelrotation=30)
    if chosen >= 0:
        bars[chosen].set_edgecolor("black")
        bars[chosen].set_linewidth(2.5)
    figure.suptitle(
        f"{report.model}: {report.rate:g} requests/s of {report.rows} rows"
        + (f"; chosen {labels[chosen]}" if chosen >= 0 else "")
    )
    figure.savefig(path, dpi=100)
    return None


def write_outputs(report: TuneReport, out: Path) -> list[str]:
    """tuning.json, tuning.png and the chosen config.pbtxt in `out`; returns what it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "tuning.json").write_text(json.dumps(report_json(report), indent=2) + "\n")
    notes = [f"wrote {out / 'tuning.json'}"]
    chosen = report.chosen
    if chosen is not None:
        met = report.recommendation is not None and report.recommendation.met_target
        s = chosen.setting
        header = (
            f"Chosen by recsys tune batching at {report.rate:g} requests/s of {report.rows} "
            f"rows: p99 {number(chosen.p99_ms)} ms "
            + (f"within {report.p99_target_ms:g} ms" if met else "(target not met)"),
            f"max_queue_delay_microseconds {s.delay_us} (0 is left out below), max_batch_size "
            f"{s.max_batch_size}, {s.instances} instance(s).",
            "Measured on the host the sweep ran on; measure again on the serving device.",
        )
        (out / "config.pbtxt").write_text(config_text(chosen.config, header))
        notes.append(f"wrote {out / 'config.pbtxt'} ({chosen.setting.label})")
    skipped = write_plot(report, out / "tuning.png")
    notes.append(skipped or f"wrote {out / 'tuning.png'}")
    return notes
