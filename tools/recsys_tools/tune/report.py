"""The recommendation and the report of `recsys tune batching`, as a table or JSON.

Pure, so the rule is checked on literal figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from app.clients.ranking_model import chunk_bounds
from recsys_tools.tune.config import Setting
from recsys_tools.tune.figures import SettingResult

# Under two requests per execution the batcher merges almost nothing, so a queue delay only
# adds its wait to every request (the seed article's pitfall 6.6).
FEW_REQUESTS_PER_EXECUTION = 2.0
# Busy shares this close count as equal: two runs of one setting on a shared CPU differ so much.
BUSY_TIE = 0.05
# A setting keeps up when it answers this share of the offered rate.
RATE_SHARE = 0.99

MEETS, ERRORS, P99_OVER, BEHIND = "meets", "errors", "p99 over", "behind"


def buys_nothing(result: SettingResult) -> bool:
    """A queue delay with batches of one or two requests: the wait is paid, nothing merges."""
    merged = result.triton.requests_per_execution
    return (
        result.setting.delay_us > 0 and merged is not None and merged < FEW_REQUESTS_PER_EXECUTION
    )


def verdict(result: SettingResult, p99_ms: float) -> str:
    if result.errors:
        return ERRORS
    if result.p99_ms is None or result.p99_ms > p99_ms:
        return P99_OVER
    if result.throughput_rps < RATE_SHARE * result.offered_rps:
        return BEHIND
    return MEETS


# The recommendation --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TuneChoice:
    index: int  # into the results
    met_target: bool
    reason: str


RULE = (
    "among settings with no errors, p99 within the target and at least "
    f"{RATE_SHARE:.0%} of the offered rate answered: skip those whose delay buys nothing "
    f"(under {FEW_REQUESTS_PER_EXECUTION:g} requests per execution) while another qualifies, "
    f"take the least busy instances (the most headroom; shares within {BUSY_TIE:.0%} count "
    "as equal), then the lowest p99"
)


def _p99(result: SettingResult) -> float:
    return math.inf if result.p99_ms is None else result.p99_ms


def recommend(results: Sequence[SettingResult], p99_ms: float) -> TuneChoice | None:
    """The setting to serve with, by RULE; the lowest p99 when none meets the target."""
    meets = [i for i, result in enumerate(results) if verdict(result, p99_ms) == MEETS]
    if meets:
        pool = [i for i in meets if not buys_nothing(results[i])] or meets
        busy = {i: results[i].busy_share for i in pool}
        known = [share for share in busy.values() if share is not None]
        if known:
            least = min(known)
            pool = [i for i in pool if (busy[i] or 0.0) <= least + BUSY_TIE]
        best = min(pool, key=lambda i: (_p99(results[i]), i))
        return TuneChoice(best, True, RULE)
    timed = [i for i, result in enumerate(results) if result.p99_ms is not None]
    if not timed:
        return None
    best = min(timed, key=lambda i: (results[i].errors, _p99(results[i]), i))
    return TuneChoice(
        best,
        False,
        f"no setting meets p99 <= {p99_ms:g} ms at the offered rate: the fewest errors, then "
        "the lowest p99; lower the rate, add instances or a faster device",
    )


# The report ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TuneReport:
    url: str
    model: str
    rate: float
    rows: int
    rows_source: str
    width: int
    duration_s: float
    warmup_s: float
    p99_target_ms: float
    original: Setting
    results: tuple[SettingResult, ...]
    recommendation: TuneChoice | None
    left_loaded: str  # "original" or "chosen": what Triton serves once the sweep is done

    @property
    def chosen(self) -> SettingResult | None:
        return None if self.recommendation is None else self.results[self.recommendation.index]


def result_json(result: SettingResult, p99_ms: float) -> dict[str, Any]:
    figures = asdict(result)
    del figures["config"]
    figures["triton"]["batch_sizes"] = {
        str(size): n for size, n in result.triton.batch_sizes.items()
    }
    figures.update(
        label=result.setting.label,
        verdict=verdict(result, p99_ms),
        delay_buys_nothing=buys_nothing(result),
    )
    return figures


def report_json(report: TuneReport) -> dict[str, Any]:
    chosen, rec = report.chosen, report.recommendation
    return {
        "url": report.url,
        "model": report.model,
        "rate": report.rate,
        "rows": report.rows,
        "rows_source": report.rows_source,
        "width": report.width,
        "duration_s": report.duration_s,
        "warmup_s": report.warmup_s,
        "p99_target_ms": report.p99_target_ms,
        "original": asdict(report.original),
        "results": [result_json(result, report.p99_target_ms) for result in report.results],
        "recommendation": None
        if rec is None or chosen is None
        else {
            "setting": asdict(chosen.setting),
            "label": chosen.setting.label,
            "met_target": rec.met_target,
            "rule": rec.reason,
        },
        "chosen_config": None if chosen is None else chosen.config,
        "left_loaded": report.left_loaded,
    }


def number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


_COLUMNS = (
    ("delay_us", 9),
    ("max_batch", 10),
    ("inst", 5),
    ("offered/s", 10),
    ("answered/s", 11),
    ("p50_ms", 8),
    ("p99_ms", 8),
    ("max_ms", 8),
    ("errors", 7),
    ("execs", 7),
    ("rows/exec", 10),
    ("req/exec", 9),
    ("queue_ms", 9),
    ("compute_ms", 11),
    ("busy", 6),
    ("verdict", 10),
)


def _row(result: SettingResult, p99_ms: float, chosen: bool) -> str:
    s, t = result.setting, result.triton
    busy = "-" if result.busy_share is None else f"{result.busy_share:.0%}"
    mark = (" <" if chosen else "") + (" *" if buys_nothing(result) else "")
    values = (
        s.delay_us,
        s.max_batch_size,
        s.instances,
        number(result.offered_rps, 1),
        number(result.throughput_rps, 1),
        number(result.p50_ms),
        number(result.p99_ms),
        number(result.max_ms),
        result.errors,
        t.executions,
        number(t.rows_per_execution, 1),
        number(t.requests_per_execution),
        number(t.queue_ms_per_request),
        number(t.compute_ms_per_request),
        busy,
        verdict(result, p99_ms),
    )
    return "".join(f"{v!s:>{w}}" for v, (_, w) in zip(values, _COLUMNS, strict=True)) + mark


def largest_chunk(rows: int, max_batch_size: int) -> int:
    return max((end - start for start, end in chunk_bounds(rows, max_batch_size)), default=0)


def _fit_notes(report: TuneReport) -> list[str]:
    """Where no two chunks fit one execution, a delay cannot merge anything, however long."""
    notes = []
    for size in sorted({r.setting.max_batch_size for r in report.results}):
        chunk = largest_chunk(report.rows, size)
        if 2 * chunk > size:
            notes.append(
                f"  max_batch_size {size}: no two chunks of up to {chunk} rows fit one execution, "
                f"so nothing merges; try --max-batch-sizes {2 * chunk} or more"
            )
    return notes


def _histogram(result: SettingResult, top: int = 4) -> str:
    sizes = sorted(result.triton.batch_sizes.items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{size} x {n}" for size, n in sizes[:top])
    more = f", {len(sizes) - top} more sizes" if len(sizes) > top else ""
    return f"  {result.setting.label:<20} {shown or 'no executions'}{more}"


def render_text(report: TuneReport, notes: Sequence[str] = ()) -> str:
    o = report.original
    lines = [
        f"{report.model} at {report.url}: {report.rate:g} requests/s of {report.rows} rows "
        f"({report.rows_source}), {report.duration_s:g} s per setting after "
        f"{report.warmup_s:g} s warm-up; p99 target {report.p99_target_ms:g} ms",
        f"found loaded: delay {o.delay_us} us, max_batch_size {o.max_batch_size}, "
        f"{o.instances} instance(s)",
        "".join(f"{name:>{width}}" for name, width in _COLUMNS),
    ]
    chosen = report.recommendation.index if report.recommendation else -1
    target = report.p99_target_ms
    lines += [_row(r, target, i == chosen) for i, r in enumerate(report.results)]
    lines.append(
        "latency is timed from each request's due time (open loop); req/exec counts the "
        "chunks Triton merged into one execution; busy is the instances' share of the window "
        "spent executing"
    )
    if any(buys_nothing(r) for r in report.results):
        lines.append(
            f"* the delay buys nothing: under {FEW_REQUESTS_PER_EXECUTION:g} requests per "
            "execution, so every request waits and almost nothing merges"
        )
    lines += _fit_notes(report)
    lines.append("batch sizes (rows x executions, most frequent first):")
    lines += [_histogram(r) for r in report.results]
    lines += [*_recommendation_lines(report), *notes]
    return "\n".join(lines)


def _recommendation_lines(report: TuneReport) -> list[str]:
    rec, chosen = report.recommendation, report.chosen
    if rec is None or chosen is None:
        return ["recommend: nothing: no setting answered a request"]
    s, t = chosen.setting, chosen.triton
    head = "recommend" if rec.met_target else "closest (target not met)"
    merged = number(t.requests_per_execution)
    busy = "-" if chosen.busy_share is None else f"{chosen.busy_share:.0%}"
    return [
        f"{head} <: max_queue_delay_microseconds {s.delay_us}, max_batch_size "
        f"{s.max_batch_size}, {s.instances} instance(s): p99 {number(chosen.p99_ms)} ms, "
        f"{number(chosen.throughput_rps, 1)} of {number(chosen.offered_rps, 1)} requests/s "
        "answered, "
        f"{merged} requests per execution, {busy} busy",
        f"  rule: {rec.reason}",
        f"Triton now serves the {report.left_loaded} config",
    ]
