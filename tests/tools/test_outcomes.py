"""recsys outcomes: rates per variant from the two /metrics texts, with Wilson intervals."""

from __future__ import annotations

import pytest
from recsys_tools.outcomes import Rate, rates

API = """# TYPE recsys_model_answers counter
recsys_model_answers_total{variant="stable"} 1000.0
recsys_model_answers_total{variant="canary"} 100.0
recsys_model_answers_total{variant="fallback"} 0.0
"""
INGEST = """# TYPE recsys_outcomes counter
recsys_outcomes_total{type="click",variant="stable"} 50.0
recsys_outcomes_total{type="click",variant="canary"} 9.0
recsys_outcomes_total{type="like",variant="canary"} 1.0
"""


def test_each_variant_gets_its_rates_over_its_own_answers() -> None:
    table = rates(API, INGEST)
    assert table["stable"]["click"].value == pytest.approx(0.05)
    assert table["canary"]["click"].value == pytest.approx(0.09)
    assert table["canary"]["like"].value == pytest.approx(0.01)
    assert table["stable"]["purchase"].value == 0.0
    assert table["fallback"]["click"].interval() == (0.0, 1.0)  # no answers, no knowledge


def test_the_interval_is_wilsons() -> None:
    low, high = Rate(9, 100).interval()
    # Wilson score interval for 9/100 at 95%: 0.0481 to 0.1621.
    assert low == pytest.approx(0.0481, abs=5e-4)
    assert high == pytest.approx(0.1621, abs=5e-4)
    assert Rate(0, 50).interval()[0] == 0.0
