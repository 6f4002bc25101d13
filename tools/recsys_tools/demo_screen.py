"""What `recsys demo` says on the terminal: one line a step, in words; the example answer as
a small table. Every other line (the build's, the API's, uvicorn's, httpx's) goes to the
demo's log file, and a warning or error reaches the terminal too."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.core.log_setup import LOG_FORMAT

SCREEN = "recsys.demo"


class _NotTheScreens(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(SCREEN)


def demo_logging(log_file: Path) -> None:
    """The screen's own lines plain on stderr; all lines, with time and pid, in `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    kept = logging.FileHandler(log_file, mode="w")
    kept.setFormatter(logging.Formatter(LOG_FORMAT))
    problems = logging.StreamHandler()
    problems.setLevel(logging.WARNING)
    problems.addFilter(_NotTheScreens())
    problems.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(kept)
    root.addHandler(problems)
    root.setLevel(logging.INFO)
    screen = logging.getLogger(SCREEN)
    for handler in list(screen.handlers):
        screen.removeHandler(handler)
    plain = logging.StreamHandler()
    plain.setFormatter(logging.Formatter("%(message)s"))
    screen.addHandler(plain)
    # httpx says every request it makes at INFO: the demo's own retries are not news.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _auc(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "unmeasured"


def said_training(report: dict[str, Any]) -> str:
    """The demo ranker's training report in a sentence."""
    heads = report.get("auc_heads") or {}
    flops = report.get("flops_per_row")
    shape = str(report.get("network", "network")).upper()
    cost = f" ({shape}, {flops:,} FLOPs a row)" if isinstance(flops, int) else ""
    like = heads.get("like") if isinstance(heads, dict) else None
    return (
        f"The ranker{cost} tells a click from a skip with AUC {_auc(report.get('auc_model'))} "
        f"on {report.get('test_rows', 0):,} impressions it did not learn from (popularity "
        f"alone: {_auc(report.get('auc_popularity'))}); its like head tells a like among "
        f"clicks with AUC {_auc(like)}."
    )


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def answer_table(answer: dict[str, Any]) -> list[str]:
    """The answer's items as rows: rank, item, score, then any attributes it carries."""
    items: list[dict[str, Any]] = answer.get("items", [])
    names = sorted({name for item in items for name in item.get("attributes") or {}})
    names.sort(key=lambda name: name != "title")  # the title first
    id_width = max([4, *(len(item["item_id"]) for item in items)])
    head = f"{'rank':>4}  {'item':<{id_width}}  {'score':>6}"
    head += "".join(f"  {name:<28}" for name in names)
    lines = [head.rstrip()]
    for item in items:
        score = item.get("score")
        shown = f"{score:6.3f}" if isinstance(score, float) else f"{'-':>6}"
        row = f"{item['rank']:>4}  {item['item_id']:<{id_width}}  {shown}"
        words = item.get("attributes") or {}
        row += "".join(f"  {_cut(str(words.get(name, '')), 28):<28}" for name in names)
        lines.append(row.rstrip())
    return lines


def said_answer(answer: dict[str, Any], elapsed_ms: float) -> str:
    """How the answer was made, in a sentence: its time by stage, model, and health."""
    timings: dict[str, float] = answer.get("timings_ms") or {}
    stages = ", ".join(f"{name} {ms:.1f}" for name, ms in timings.items())
    took = f"Answered in {elapsed_ms:.0f} ms" + (f" (stages in ms: {stages})" if stages else "")
    model = answer.get("model", {})
    version = model.get("version")
    by = f"model {model.get('name')} version {version}" if version else "the fallback ranker"
    degraded = answer.get("degraded") or []
    health = f"degraded: {', '.join(degraded)}" if degraded else "nothing degraded"
    cold = "; the user was a cold start" if answer.get("cold_start") else ""
    return f"{took}, ranked by {by}; {health}{cold}."
