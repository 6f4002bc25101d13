"""`recsys outcomes`: each variant's click, like and purchase rates, with a 95% interval.

Reads the API's /metrics (answers per variant, recsys_model_answers_total) and the ingest
consumer's (recsys_outcomes_total{variant,type}: clicks that named their answer's request
id), so a canary is judged by what users did, not only by its errors. The counters are the
processes' own since they started; for a window, compare two runs of the command, or ask
Prometheus for increase() over the same series.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from recsys_tools.commands import Commands

TYPES = ("click", "like", "purchase")
Z95 = 1.959964


@dataclass(frozen=True, slots=True)
class Rate:
    successes: float
    trials: float

    @property
    def value(self) -> float:
        return self.successes / self.trials if self.trials else 0.0

    def interval(self) -> tuple[float, float]:
        """Wilson's 95% interval: sound for small counts and rates near 0, unlike p +- 2 se."""
        n, p = self.trials, self.value
        if not n:
            return 0.0, 1.0
        centre = p + Z95**2 / (2 * n)
        spread = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n))
        scale = 1 + Z95**2 / n
        return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def rates(api_metrics: str, ingest_metrics: str) -> dict[str, dict[str, Rate]]:
    answers = {
        dict(labels)["variant"]: value
        for labels, value in _samples(api_metrics, "recsys_model_answers_total").items()
    }
    outcomes = _samples(ingest_metrics, "recsys_outcomes_total")
    table: dict[str, dict[str, Rate]] = {}
    for variant, shown in answers.items():
        table[variant] = {
            kind: Rate(outcomes.get((("type", kind), ("variant", variant)), 0.0), shown)
            for kind in TYPES
        }
    return table


def _run(args: argparse.Namespace) -> None:
    api = httpx.get(f"{args.api.rstrip('/')}/metrics", timeout=10.0).text
    ingest = httpx.get(f"{args.ingest.rstrip('/')}/metrics", timeout=10.0).text
    print(
        f"{'variant':<10}{'answers':>10}  " + "  ".join(f"{k + ' rate (95%)':>28}" for k in TYPES)
    )
    for variant, by_kind in rates(api, ingest).items():
        answers = next(iter(by_kind.values())).trials
        cells = []
        for kind in TYPES:
            rate = by_kind[kind]
            low, high = rate.interval()
            cells.append(f"{rate.value:>9.4f} ({low:.4f}-{high:.4f})".rjust(28))
        print(f"{variant:<10}{answers:>10.0f}  " + "  ".join(cells))


def register(commands: Commands) -> None:
    outcomes = commands.add_parser(
        "outcomes",
        help="each variant's click, like and purchase rates with 95%% intervals",
        description=__doc__,
    )
    outcomes.add_argument("--api", default="http://127.0.0.1:8080", help="the API's base URL")
    outcomes.add_argument(
        "--ingest", default="http://127.0.0.1:9108", help="the ingest consumer's metrics URL"
    )
    outcomes.set_defaults(run=_run)
