"""The debug pages as HTML, rendered here from traces: no template engine, no script, no
asset from anywhere else. Every value is escaped; the waterfall is inline SVG."""

from __future__ import annotations

import html
import time
from typing import Any
from urllib.parse import quote

from app.pipeline.trace import StageRecord, Trace

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;
text-align:left}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b00}.ok{color:#070}nav a{margin-right:1em}form label{margin-right:1em}
.answer{background:#f6f8ff;border:1px solid #99a;padding:.6em 1em;margin:1em 0}
"""
# The waterfall's colours, one a stage in the order they ran: no stage is named here.
COLOURS = ("#6a9fb5", "#90a959", "#d28445", "#aa759f", "#75b5aa", "#8f5536", "#ac4142", "#f4bf75")


def _link(trace_id: str) -> str:
    """A trace's address, its id quoted whole (a / in it stays part of the id)."""
    return "/debug/trace/" + quote(trace_id, safe="")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
        f"<style>{STYLE}</style></head><body><nav><a href='/debug/'>recent requests</a>"
        f"<a href='/debug/why'>why not item X?</a></nav><h1>{_e(title)}</h1>{body}</body></html>"
    )


def _when(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def trace_list(traces: list[Trace]) -> str:
    rows = "".join(
        f"<tr><td>{_when(t.at)}</td><td><a class=trace href='{_e(_link(t.request_id))}'>"
        f"{_e(t.request_id)}</a></td><td>{_e(t.request.get('user_id', ''))}</td>"
        f"<td class=n>{t.total_ms:.1f}</td>"
        f"<td class={'bad' if t.degraded else 'ok'}>"
        f"{_e(', '.join(d['flag'] for d in t.degraded) or 'no')}</td>"
        f"<td>{_e(t.model.get('variant', ''))} {_e(t.model.get('version', ''))}</td></tr>"
        for t in traces
    )
    if not rows:
        return page("Recent requests", "<p>No request traced yet.</p>")
    head = (
        "<tr><th>time</th><th>request</th><th>user</th><th>ms</th><th>degraded</th>"
        "<th>model</th></tr>"
    )
    return page(
        "Recent requests",
        f"<p>{len(traces)} traced in this process, newest first.</p>"
        f"<table id=traces>{head}{rows}</table>",
    )


def _waterfall(trace: Trace) -> str:
    spans = trace.spans
    end = max([trace.total_ms, 1.0, *(s.start_ms + s.duration_ms for s in spans)])
    width, left, row_h = 760, 90, 22
    scale = (width - left - 70) / max(end, 1e-6)
    bars = []
    for i, s in enumerate(spans):
        y = 10 + i * row_h
        x = left + s.start_ms * scale
        w = max(1.0, s.duration_ms * scale)
        colour = COLOURS[i % len(COLOURS)]
        bars.append(
            f"<text x=4 y={y + 14}>{_e(s.stage)}</text>"
            f"<rect class=span data-stage={_e(s.stage)} x={x:.1f} y={y} width={w:.1f} "
            f"height=16 fill='{colour}'><title>{_e(s.stage)}: {s.duration_ms:.2f} ms from "
            f"{s.start_ms:.2f} ms</title></rect>"
            f"<text x={x + w + 4:.1f} y={y + 13} font-size=11>{s.duration_ms:.2f} ms</text>"
        )
    height = 20 + len(spans) * row_h
    return (
        f"<svg id=waterfall xmlns='http://www.w3.org/2000/svg' width={width} height={height} "
        f"font-family='system-ui,sans-serif' font-size=12>{''.join(bars)}</svg>"
    )


def _funnel(trace: Trace) -> str:
    rows = "".join(
        f"<tr><td>{_e(s.stage)}</td><td class=n>{'' if s.candidates is None else s.candidates}"
        "</td></tr>"
        for s in trace.spans
    )
    return f"<table id=funnel><tr><th>stage</th><th>candidates out</th></tr>{rows}</table>"


def _listed(
    title: str, rows: list[dict[str, Any]], keys: list[str], table_id: str, level: int = 2
) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{_e(k)}</th>" for k in keys)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(_shown(row.get(k, '')))}</td>" for k in keys) + "</tr>"
        for row in rows
    )
    heading = f"<h{level}>{_e(title)}</h{level}>"
    return f"{heading}<table id={_e(table_id)}><tr>{head}</tr>{body}</table>"


def _shown(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def trace_page(trace: Trace) -> str:
    request = trace.request
    degraded = ", ".join(f"{d['flag']} ({d['cause']})" for d in trace.degraded) or "nothing"
    summary = (
        f"<p>User <b>{_e(request.get('user_id', ''))}</b>, context "
        f"{_e(request.get('context', {}))}, {_e(request.get('num_items', ''))} items asked, "
        f"budget {_e(request.get('budget_ms', ''))} ms; answered in {trace.total_ms:.1f} ms by "
        f"{_e(trace.model.get('variant', ''))} {_e(trace.model.get('version', ''))}; "
        f"degraded: {_e(degraded)}.</p>"
    )
    records = "".join(_record(stage, record) for stage, record in trace.records.items())
    body = summary + "<h2>Stages</h2>" + _waterfall(trace) + _funnel(trace) + records
    return page(f"Request {trace.request_id}", body)


def _record(stage: str, record: StageRecord) -> str:
    """One stage's record, whatever the stage: its counts and figures, what it removed, and
    its tables."""
    flows = [
        f"{value} {word}"
        for value, word in ((record.came_in, "in"), (record.went_out, "out"))
        if value is not None
    ]
    counts = _e(", ".join(flows))
    figures = ", ".join(f"{_e(k)} {_e(_shown(v))}" for k, v in record.facts.items())
    said = "; ".join(part for part in (counts, figures) if part)
    removed = _listed(
        "Removed", record.removed, ["reason", "count", "first"], f"{stage}-removed", level=3
    )
    tables = "".join(
        _listed(table.title, table.rows, table.columns, name, level=3)
        for name, table in record.tables.items()
    )
    return (
        f"<section id=stage-{_e(stage)}><h2>{_e(stage)}</h2>"
        + (f"<p>{said}.</p>" if said else "")
        + removed
        + tables
        + "</section>"
    )


def why_page(fields: dict[str, str], answer: dict[str, Any] | None, error: str | None) -> str:
    def box(name: str, label: str) -> str:
        return (
            f"<label>{_e(label)} <input name={name} id={name} "
            f"value='{_e(fields.get(name, ''))}'></label>"
        )

    form = (
        "<form method=get action='/debug/why' id=why>"
        + box("user_id", "user")
        + box("item_id", "item")
        + box("device", "device")
        + box("page", "page")
        + "<button type=submit id=ask>Why?</button></form>"
    )
    said = ""
    if error is not None:
        said = f"<div class='answer bad' id=answer>{_e(error)}</div>"
    elif answer is not None:
        said = (
            f"<div class=answer id=answer><b id=verdict>{_e(answer['verdict'])}</b>: "
            f"<span id=because>{_e(answer['because'])}</span> "
            f"(<a href='{_e(_link(answer['request_id']))}'>the request's trace</a>)</div>"
        )
    return page("Why not item X?", form + said)
